"""Class mode in Chromium: ``attnlab lab --item N --class``'s link opens the lab on that item with the article's
numbers hidden until a prediction is written and revealed, in English and in Chinese.

One server (tests/conftest.py's ``lab``, in this module's own pytest-xdist group) and one browser. Screenshots go
to ``tmp_path`` (and to ``$ATTNLAB_SHOTS`` when set). Times are never asserted.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from attnlab.articles import ITEMS
from attnlab.lab import i18n as I
from attnlab.lab.classmode import class_query, item_key

pytestmark = pytest.mark.xdist_group("lab_browser_teach")

WAIT_MS = 60_000


def shot(page, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    if os.environ.get("ATTNLAB_SHOTS"):
        Path(os.environ["ATTNLAB_SHOTS"]).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(os.environ["ATTNLAB_SHOTS"]) / path.name)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_class_link_hides_the_answer_until_a_prediction_is_revealed(lab, browser, tmp_path, lang):
    key = item_key("causal-4")  # 000 causality: the first row is [1, 0, 0, 0]
    item = ITEMS[int(key[5:])]
    answer = "q0       1       0       0       0"
    assert answer in item.expect
    context = browser.new_context(viewport={"width": 1300, "height": 1400})
    try:
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        page.goto(lab.url + class_query(key))
        page.wait_for_selector("[data-testid='al-class-hidden-weights']")
        if lang == "zh":
            page.locator("select").first.select_option(label="中文")
            page.wait_for_selector(f"text={I.t('zh', 'class.prediction')}")
        hidden = page.wait_for_selector("[data-testid='al-class-hidden']")
        assert hidden.get_attribute("data-asked") == "false"
        # the preset is loaded (its label in the dropdown), its explanation is not on the page
        assert page.locator("select").nth(1).evaluate("s => s.options[s.selectedIndex].value") != ""
        assert page.locator("[data-testid='al-item']").count() == 0
        assert page.locator("#al-weights").count() == 0  # nor the weights the lab computes, nor its steps
        steps = I.t(lang, "Every step, by hand (scores, scale, mask, max, exp, sums, weights, output)")
        assert page.get_by_text(steps).count() == 0
        assert "1       0       0       0" not in page.content()
        hidden.scroll_into_view_if_needed()
        shot(page, tmp_path, f"lab-class-hidden-{lang}")
        page.locator("[data-testid='al-class-hidden-weights']").scroll_into_view_if_needed()
        shot(page, tmp_path, f"lab-class-hidden-weights-{lang}")
        reveal = page.get_by_role("switch", name=I.t(lang, "reveal")).first
        reveal.click()  # reveal without a prediction: still hidden, the page asks for one
        page.wait_for_selector("[data-testid='al-class-hidden'][data-asked='true']")
        assert page.locator("[data-testid='al-item']").count() == 0
        box = page.get_by_role("textbox", name=I.t(lang, "class.prediction"))
        mine = "[1, 0, 0, 0]: q0 sees only k0" if lang == "en" else "[1, 0, 0, 0]：q0 只能看到 k0"
        box.fill(mine)
        box.blur()
        done = page.wait_for_selector("[data-testid='al-class-revealed'] [data-testid='al-item']")
        assert answer in done.inner_text()
        page.wait_for_selector("#al-weights[data-causal='true']")  # the experiment is back after the reveal
        assert mine in page.locator("[data-testid='al-class-revealed']").inner_text()
        page.locator("[data-testid='al-class-revealed'] mark").first.scroll_into_view_if_needed()
        shot(page, tmp_path, f"lab-class-revealed-{lang}")
        page.locator("#al-weights").scroll_into_view_if_needed()
        shot(page, tmp_path, f"lab-class-revealed-weights-{lang}")
    finally:
        context.close()


def test_item_names_and_the_class_flags_are_checked(capsys):
    from attnlab.cli import main
    from attnlab.errors import OptionError

    assert item_key("4") == item_key("causal-4") == item_key("item-03") == "item-03"
    assert ITEMS[int(item_key("2x2")[5:])].argv == ("2x2",)
    with pytest.raises(OptionError, match=r"--item: expected an item number 1-43 or one of .*causal-4.*, got 'nope'"):
        item_key("nope")
    assert main(["lab", "--class"]) == 2
    assert "--class: needs --item N" in capsys.readouterr().err
    assert main(["lab", "--item", "44"]) == 2
    assert "--item: expected an item number 1-43" in capsys.readouterr().err
