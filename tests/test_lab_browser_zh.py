"""The Chinese lab as complete as the English, in Debian's Chromium: every preset of the dropdown (read from the page,
not from a list) marks the article's numbers in both languages, and the Chinese page, with every control used,
shows no run of English words (tests/test_lab_zh.py's :func:`english_runs`: identifiers and code are not English).

One server (tests/conftest.py's ``lab``) and one browser for the module; one page walks both languages. Screenshots
go to ``tmp_path`` (and to ``$ATTNLAB_SHOTS`` when set); times are printed, never asserted.
"""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect
from test_lab_browser import click_on
from test_lab_browser_lessons import DEEP_TEXT_JS, open_lab, shot
from test_lab_zh import english_runs

from attnlab.lab import presets
from attnlab.lab.i18n import t

pytestmark = pytest.mark.xdist_group("lab_browser_zh")

WAIT_MS = 30_000

#: Texts a person sees that DEEP_TEXT_JS does not walk: hover texts (SVG <title>, title=, aria-label=) of what is
#: drawn (an element under ``display: none`` has no box: nobody hovers it, and a screen reader skips it).
HOVER_JS = """
() => {
  const out = [];
  const drawn = (n) => n.getClientRects().length > 0;
  const walk = (node) => {
    for (const n of node.querySelectorAll('*')) {
      const tip = n.tagName.toLowerCase() === 'title' && n.closest('svg');
      if (tip) { if (drawn(n.parentElement)) out.push(n.textContent); }
      else if (drawn(n))
        for (const a of ['title', 'aria-label']) if (n.getAttribute && n.getAttribute(a)) out.push(n.getAttribute(a));
      if (n.shadowRoot) walk(n.shadowRoot);
    }
  };
  walk(document);
  return out.join('\\n');
}
"""

#: marimo's own chrome (its menus and buttons, not the notebook's words) and the sentence the live box starts with.
NOT_THE_LAB = ("The cat sat on the mat because it was tired", "Radio Group", "This output is stale")


@pytest.fixture(scope="module")
def page(lab, browser):
    """One page for the whole walk (both languages)."""
    context, pg = open_lab(browser, lab.url)
    yield pg
    context.close()


def shown_text(page) -> str:
    hover = re.sub(r"<[^>]+>", " ", page.evaluate(HOVER_JS))  # marimo keeps a label's markup in aria-label
    text = page.evaluate(DEEP_TEXT_JS) + "\n" + hover
    for s in NOT_THE_LAB:
        text = text.replace(s, " ")
    return text


def chinese_runs(page, where: str, found: dict[str, str]) -> None:
    for run in english_runs(shown_text(page)):
        found.setdefault(run, where)


def switch_language(page, lang: str) -> None:
    page.locator("select").first.select_option(label={"en": "English", "zh": "中文"}[lang])
    page.wait_for_selector(f"text={t(lang, 'reveal')}")
    first = page.locator("select").nth(1).locator("option").first  # marimo's selects sit in shadow roots
    expect(first).to_have_text(t(lang, "(your own inputs: the articles' four positions)"), timeout=WAIT_MS)


def walk_presets(page, lang: str, runs: dict[str, str] | None) -> dict[str, tuple[int, int]]:
    sel = page.locator("select").nth(1)
    options = sel.locator("option").all_inner_texts()[1:]  # 0: your own inputs
    assert len(options) == len(presets.ITEM_PRESETS)
    counts = {}
    for label in options:
        sel.select_option(label=label)
        key = next(k for k, p in presets.ITEM_PRESETS.items() if p.label(lang) == label)
        item = page.wait_for_selector(f"[data-testid='al-item'][data-key='{key}']")
        p = presets.ITEM_PRESETS[key]
        if p.state is not None:  # the tables follow the preset (the same update)
            page.wait_for_selector(f"#al-weights[data-causal='{str(bool(p.state.causal)).lower()}']")
        counts[key] = (int(item.get_attribute("data-found")), int(item.get_attribute("data-expected")))
        assert page.locator("mark[data-testid='al-expect']").count() == counts[key][0]
        if runs is not None:
            chinese_runs(page, key, runs)
    return counts


def use_every_control(page, lang: str, runs: dict[str, str]) -> None:
    """Every control of the page once: the checkboxes, radios, sliders, the steps accordion, every reveal switch
    (a prediction first for one), the buttons that need no model; the page's words are read after each group."""
    page.locator("select").nth(1).select_option(index=0)
    page.get_by_text(t(lang, "Every step, by hand (scores, scale, mask, max, exp, sums, weights, output)")).click()
    page.wait_for_selector(".al-steps")
    chinese_runs(page, "steps", runs)
    page.get_by_role("checkbox").first.click()
    page.wait_for_selector("#al-weights[data-causal='false']")
    page.get_by_role("radio", name="nan", exact=True).first.click()
    page.get_by_role("radio", name=t(lang, "side.left"), exact=True).click()
    boxes = (
        page.locator(f"input[aria-label*='{t(lang, 'padded keys')}']").first,  # marimo names a number box by label
        page.get_by_placeholder("0, 1, 2, 3", exact=True),  # bias per key
        page.get_by_placeholder("1/√d_k", exact=True),  # scale
    )
    for box, value in zip(boxes, ("1", "0, 1, 2, 3", "1"), strict=True):
        box.fill(value)
        box.blur()
    page.wait_for_selector("#al-weights[data-padded='1']")
    page.wait_for_selector("#al-weights[data-bias='0, 1, 2, 3']")
    chinese_runs(page, "padding, bias, scale", runs)
    slider = page.get_by_role("slider").first
    slider.focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_selector("#al-weights[data-temperature='1.1']")
    chinese_runs(page, "controls", runs)
    click_on(page.get_by_role("radio", name=t(lang, "the weights get sharper"), exact=True))
    switches = page.get_by_role("switch")
    every = f"document.querySelectorAll(\"[data-testid='al-feedback']\").length === {switches.count()}"
    for attempt in range(3):  # a switch the page redrew as off while the next one was clicked is clicked again
        for i in range(switches.count()):
            if switches.nth(i).get_attribute("aria-checked") != "true":
                click_on(switches.nth(i))
        try:
            page.wait_for_function(every, timeout=20_000)
            break
        except PlaywrightTimeout:
            if attempt == 2:
                raise
    chinese_runs(page, "reveals", runs)
    q_box = page.locator("[data-testid='al-input-q'] textarea")
    for typed in ("1, 0\n0, x", "1, 0\n0"):
        q_box.fill(typed)
        q_box.blur()
        page.wait_for_selector("[data-testid='al-input-error']")
        chinese_runs(page, f"bad input {typed!r}", runs)
    q_box.fill("1, 0\n0, 1\n1, 1\n1, -1")
    q_box.blur()
    # the live section's buttons (a single word the rule above lets through: checked by name)
    assert page.get_by_role("button", name=t(lang, "run"), exact=True).count() == 1
    assert page.get_by_role("button", name=t(lang, "run the intervention (delete each token)")).count() == 1


def shoot_lessons(page, lang: str, tmp_path) -> None:
    """Screenshots of two lessons (001 §4.2's saturation, 000's all-masked row) to look at."""
    for key in ("item-19", "item-04"):
        page.locator("select").nth(1).select_option(label=presets.ITEM_PRESETS[key].label(lang))
        page.wait_for_selector(f"[data-testid='al-item'][data-key='{key}']")
        shot(page, tmp_path, f"lab-{lang}-{key}")


def test_every_preset_and_control_in_both_languages(page, tmp_path, capsys):
    t0 = time.perf_counter()
    counts = {"en": walk_presets(page, "en", None)}
    shoot_lessons(page, "en", tmp_path)
    switch_language(page, "zh")
    runs: dict[str, str] = {}
    counts["zh"] = walk_presets(page, "zh", runs)
    shoot_lessons(page, "zh", tmp_path)
    use_every_control(page, "zh", runs)
    shot(page, tmp_path, "lab-zh-controls")
    with capsys.disabled():
        full = {lang: sum(f == n for f, n in c.values()) for lang, c in counts.items()}
        print(
            f"\nlab marks: en {full['en']}/{len(counts['en'])}, zh {full['zh']}/{len(counts['zh'])} presets fully "
            f"marked; both languages walked in {time.perf_counter() - t0:.1f} s"
        )
    for lang, c in counts.items():
        assert [k for k, (f, n) in c.items() if f != n] == [], lang
        assert len(c) == 43
    assert runs == {}, "\n".join(f"{where}: {run!r}" for run, where in runs.items())
