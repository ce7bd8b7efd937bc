"""The live model's views in Debian's Chromium: SmolLM2 on an English and a Chinese sentence, the model view's click
opening a head, the head, neuron and block views, and MiniLM's [UNK] note.

One server (tests/conftest.py's ``lab``) and one browser for the module; screenshots go to ``tmp_path`` (and, when
``ATTNLAB_SHOTS`` names a folder, a copy there to look at). Times are printed, never asserted.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from playwright.sync_api import Page
from test_lab_browser_zh import shown_text
from test_lab_zh import english_runs

from attnlab.lab import i18n as I

pytestmark = pytest.mark.xdist_group("lab_browser_views")

WAIT_MS = 90_000
#: Article 001's padding example (§ "样本 A：我 喜欢 猫"), typed without the spaces.
ZH_SENTENCE = "我喜欢猫"
EN_SENTENCE = "The cat sat on the mat because it was tired"

FITS_JS = """
(sel) => {  // every text of the views inside its svg, every svg inside its scrolling box
  const out = [];
  for (const svg of document.querySelectorAll(sel)) {
    const s = svg.getBoundingClientRect();
    for (const t of svg.querySelectorAll('text')) {
      const b = t.getBoundingClientRect();
      if (b.width === 0) continue;
      if (b.left < s.left - 0.5 || b.right > s.right + 0.5 || b.top < s.top - 0.5 || b.bottom > s.bottom + 0.5)
        out.push([svg.dataset.testid, t.textContent, [b.left, b.right, b.top, b.bottom], [s.left, s.right]]);
    }
  }
  return out;
}
"""


def shot(el, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    el.scroll_into_view_if_needed()
    el.page.mouse.move(1, 1)  # no hover: the head view shows every head
    el.screenshot(path=str(path))
    if os.environ.get("ATTNLAB_SHOTS"):
        Path(os.environ["ATTNLAB_SHOTS"]).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(os.environ["ATTNLAB_SHOTS"]) / path.name)
    return path


@pytest.fixture(scope="module")
def page(lab, browser):
    context = browser.new_context(viewport={"width": 1300, "height": 1400})
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    pg.goto(lab.url, timeout=WAIT_MS)
    pg.wait_for_selector("[data-testid='al-growth']", timeout=60_000)  # the first run is over
    yield pg
    context.close()


def run_sentence(page: Page, text: str, lang: str = "en") -> None:
    box = page.locator("[data-testid='al-input-sentence'] input")
    box.fill(text)
    page.get_by_role("button", name=I.t(lang, "run"), exact=True).click()


def views(page: Page) -> list[str]:
    return ["al-head-view", "al-neuron-view", "al-block-view"]


def test_views_of_smollm2_on_english_and_chinese(page, tmp_path, capsys):
    t0 = time.perf_counter()
    run_sentence(page, EN_SENTENCE)
    page.wait_for_selector("[data-testid='al-live'][data-n='10']", timeout=WAIT_MS)
    for v in views(page):
        page.wait_for_selector(f"[data-testid='{v}']", timeout=WAIT_MS)
    first = time.perf_counter() - t0
    grid = page.locator("[data-testid='al-model-view']")
    assert (grid.get_attribute("data-layers"), grid.get_attribute("data-heads")) == ("30", "9")
    # a click in the model view opens that head in the heatmap and the views
    t1 = time.perf_counter()
    grid.locator("[data-layer='5'][data-head='2']").click()
    page.wait_for_selector("[data-testid='al-live'][data-layer='5'][data-head='2']")
    page.wait_for_selector("[data-testid='al-views'][data-layer='5'][data-head='2']")
    page.wait_for_selector("[data-testid='al-model-view'] [data-layer='5'][data-head='2'][data-selected='1']")
    click = time.perf_counter() - t1
    hv = page.locator("[data-testid='al-head-view']")
    assert hv.get_attribute("data-heads") == ",".join(str(j) for j in range(9))
    nv = page.locator("[data-testid='al-neuron-view']")
    assert abs(float(nv.get_attribute("data-score")) - float(nv.get_attribute("data-model-score"))) < 1e-4
    assert page.evaluate(FITS_JS, "[data-testid='al-views'] svg") == []
    shot(grid, tmp_path, "views-en-model")
    for v in views(page):
        shot(page.locator(f"[data-testid='{v}']"), tmp_path, f"views-en-{v[3:]}")
    # hovering a head's colour in the legend leaves that head alone (CSS :hover, no script)
    hv.locator("g.al-hv-head[data-head='4'] rect").hover()
    opacity = "(e) => getComputedStyle(e).opacity"
    assert hv.locator("g.al-hv-head[data-head='4']").evaluate(opacity) == "1"
    assert float(hv.locator("g.al-hv-head[data-head='0']").evaluate(opacity)) < 0.2
    page.mouse.move(1, 1)
    # the temperature redraws the block view
    temp = page.get_by_role("slider").nth(page.get_by_role("slider").count() - 2)  # temperature, then top tokens
    temp.focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_selector("[data-testid='al-block-view'][data-t='1.1']")

    run_sentence(page, ZH_SENTENCE)
    live = page.wait_for_selector("[data-testid='al-live'][data-n='11'][data-groups='4']", timeout=WAIT_MS)
    assert "merged into the 4 characters" in live.inner_text()
    page.wait_for_selector("[data-testid='al-head-view'][data-n='4']")
    labels = page.locator("[data-testid='al-head-view'] text").evaluate_all("ts => ts.map(t => t.textContent)")
    assert all(ch in labels for ch in ZH_SENTENCE), labels
    assert "\\x" not in page.locator("[data-testid='al-live-heatmap']").text_content()
    assert page.evaluate(FITS_JS, "[data-testid='al-views'] svg, [data-testid='al-live-heatmap']") == []
    shot(page.locator("[data-testid='al-live']"), tmp_path, "views-zh-heatmap")
    for v in views(page):
        shot(page.locator(f"[data-testid='{v}']"), tmp_path, f"views-zh-{v[3:]}")
    # the page in Chinese
    page.locator("select").first.select_option(label="中文")
    page.wait_for_selector("text=揭晓")
    page.wait_for_selector("text=句子运行完后", timeout=WAIT_MS)  # the form is new: nothing has run in Chinese yet
    run_sentence(page, ZH_SENTENCE, "zh")  # the sentence box is new in the new language
    page.wait_for_selector("[data-testid='al-head-view'][data-n='4']", timeout=WAIT_MS)
    assert "模块视图" in page.locator("[data-testid='al-block-view']").text_content()
    assert "合并成它们组成的 4 个字符" in page.locator("[data-testid='al-live']").inner_text()
    assert page.evaluate(FITS_JS, "[data-testid='al-views'] svg") == []
    # no English in the Chinese page with the live views shown: marimo's table chrome ("30 rows, 10 columns", "No
    # selection", "Columns", "Explore") is hidden by the lab's style sheet (src/attnlab/lab/lab.css)
    assert english_runs(shown_text(page)) == [], english_runs(shown_text(page))
    for chrome in ("rows,", "No selection", "Explore"):
        assert chrome not in shown_text(page)
    shot(page.locator("[data-testid='al-views']"), tmp_path, "views-zh-ui")
    shot(page.locator("[data-testid='al-model-view']"), tmp_path, "views-zh-model")
    with capsys.disabled():
        print(f"\nlab views: English sentence to every view {first:.1f} s (load included); click -> head {click:.2f} s")


def test_minilm_says_which_characters_became_unk(page, tmp_path):
    page.locator("select").first.select_option(label="English")  # the test before left the page in Chinese
    page.wait_for_selector("text=reveal")
    page.get_by_text("all-MiniLM-L6-v2 (bidirectional encoder, with padding)").click()
    run_sentence(page, ZH_SENTENCE)
    live = page.wait_for_selector("[data-testid='al-live'][data-model='all-MiniLM-L6-v2']", timeout=WAIT_MS)
    assert int(live.get_attribute("data-unk")) == 3
    assert "represent 3 of the 4 characters of this text (喜 欢 猫)" in live.inner_text()
    shot(page.locator("[data-testid='al-live']"), tmp_path, "views-minilm-unk")
