"""The lab as a person uses it: ``attnlab lab``'s server driven by Playwright in Debian's Chromium.

Chromium comes from Debian (/usr/bin/chromium, installed by scripts/install-test-deps.sh), never from a
``playwright install`` download. Every wait is bounded; the server process is always stopped. Screenshots go to
``artifacts/`` (git-ignored). The time from a slider change to the updated weights is printed (goal < 200 ms, 8×8).
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import Page, expect
from procs import descendants, kill_all, serving, wait_gone
from reference import reference_attention

from attnlab import masks
from attnlab.lab import NOTEBOOK, logic
from attnlab.lab.server import HOST

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
WAIT_MS = 20_000

Q = np.array([[1.0, 0], [0, 1], [1, 1], [1, -1]])
K = np.array([[1.0, 0], [0, 1], [1, 1], [-1, 1]])
V = np.array([[1.0, 0], [0, 1], [1, 1], [2, 0]])


#: The lab server and browser fixtures are tests/conftest.py's (``lab``, ``browser``). This file's tests run in one
#: pytest-xdist worker (one browser), and so do test_lab_browser_lessons.py's and test_lab_browser_zh.py's, maybe
#: in another: each page is a fresh marimo session, so the files' pages load at once on two workers (a server each).
pytestmark = pytest.mark.xdist_group("test_lab_browser")


@pytest.fixture
def page(lab, browser):
    """A fresh page (a fresh marimo session) on the lab; records every request that leaves 127.0.0.1."""
    context = browser.new_context(viewport={"width": 1300, "height": 1600})
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    pg.outside = []  # type: ignore[attr-defined]

    def record(request):
        url = request.url
        if not (url.startswith(f"http://{HOST}:") or url.startswith(("data:", "blob:", "ws://127.0.0.1"))):
            pg.outside.append(url)  # type: ignore[attr-defined]

    pg.on("request", record)
    pg.goto(lab.url, timeout=WAIT_MS)
    pg.wait_for_selector("#al-weights", timeout=WAIT_MS)
    yield pg
    context.close()


def table_values(page: Page, table: str) -> np.ndarray:
    """The exact numbers of a table the notebook drew (data-value; masked cells as NaN)."""
    rows = page.eval_on_selector_all(
        f"#{table} tr",
        "trs => trs.slice(1).map(tr => Array.from(tr.querySelectorAll('td')).map(td => td.dataset.value))",
    )
    return np.array([[np.nan if x == "masked" else float(x) for x in r] for r in rows])


def masked_equal(shown: np.ndarray, expected: np.ndarray, allowed: np.ndarray) -> None:
    assert shown.shape == expected.shape
    assert np.isnan(shown[~allowed]).all(), "masked cells must be drawn as masked"
    np.testing.assert_allclose(shown[allowed], expected[allowed], rtol=0, atol=1e-12)


def temperature_slider(page: Page):
    return page.get_by_role("slider").first


def click_on(control) -> None:
    """Click a radio button or a switch (a Playwright locator) until the page shows it on. marimo redraws a cell when
    a control's value reaches the kernel, and a click that lands on a control while it is redrawn is lost (a person
    would click again): under load a test then waited for a reveal nobody had asked for."""
    for _ in range(3):
        control.click()
        try:
            expect(control).to_be_checked(timeout=5_000)
            return
        except AssertionError:
            pass
    expect(control).to_be_checked()


def test_page_loads_with_the_articles_example_and_no_outside_requests(page):
    w = table_values(page, "al-weights")
    _, ref = reference_attention(Q, K, V, allowed=masks.causal(4))  # article 000's four positions, causal
    masked_equal(w, ref, masks.causal(4))
    page.wait_for_selector("[data-testid='al-heatmap']")
    assert "Traceback" not in page.content()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "lab-loaded.png"), full_page=True)
    assert page.outside == []  # type: ignore[attr-defined]  # no CDN, no telemetry: everything from 127.0.0.1


def test_temperature_slider_and_causal_toggle_change_the_weights_to_the_right_numbers(page):
    slider = temperature_slider(page)
    assert slider.get_attribute("aria-valuenow") == "1"
    slider.focus()
    for _ in range(10):  # 1.0 -> 2.0 in steps of 0.1
        page.keyboard.press("ArrowRight")
    page.wait_for_selector("#al-weights[data-causal='true'][data-temperature='2']")
    allowed = masks.causal(4)
    _, ref = reference_attention(Q, K, V, allowed=allowed, temperature=2.0)
    shown = table_values(page, "al-weights")
    masked_equal(shown, ref, allowed)
    np.testing.assert_allclose(shown[0, 0], 1.0)  # one legal key: [1, 0, 0, 0] at any temperature

    page.get_by_role("checkbox").first.click()  # the lab opens causal: this switches the mask off
    page.wait_for_selector("#al-weights[data-causal='false'][data-temperature='2']")
    _, ref = reference_attention(Q, K, V, temperature=2.0)
    np.testing.assert_allclose(table_values(page, "al-weights"), ref, atol=1e-12)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "lab-causal-T2.png"), full_page=False)


def test_editing_a_value_changes_the_output_but_not_the_weights(page):
    w0 = table_values(page, "al-weights")
    o0 = table_values(page, "al-output")
    box = page.locator("[data-testid='al-input-value'] input")
    box.fill("100, 0")
    box.press("Enter")
    page.wait_for_selector("#al-output[data-value-text='100, 0']")
    v = V.copy()
    v[0] = [100, 0]
    out, ref_w = reference_attention(Q, K, v, allowed=masks.causal(4))
    w1, o1 = table_values(page, "al-weights"), table_values(page, "al-output")
    np.testing.assert_array_equal(w1, w0)
    masked_equal(w1, ref_w, masks.causal(4))
    np.testing.assert_allclose(o1, out, atol=1e-10)
    assert np.abs(o1 - o0).max() > 10


def test_bad_input_gives_a_message_in_the_page_never_a_traceback(page):
    q_box = page.locator("[data-testid='al-input-q'] textarea")
    q_box.fill("1, 0\n0, x")
    q_box.blur()
    err = page.wait_for_selector("[data-testid='al-input-error']")
    assert "'x' at row 1, column 1 is not a number" in err.inner_text()
    q_box.fill("1, 0\n0")
    q_box.blur()
    page.wait_for_selector("[data-testid='al-input-error']:has-text('ragged')")
    q_box.fill("1, 0\n0, 1\n1, 1\n1, -1")
    q_box.blur()
    page.wait_for_selector("#al-weights[data-causal='true']")  # the lab opens causal
    page.get_by_text("left", exact=True).click()  # padding on the left ...
    pad = page.locator("input[aria-label*='padded keys']")
    pad.fill("1")
    pad.press("Enter")
    err = page.wait_for_selector("[data-testid='al-input-error']:has-text('fully-masked-row trap')")
    assert "no key at all" in err.inner_text()
    assert "Traceback" not in page.content()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "lab-masked-row.png"), full_page=False)


def test_slider_to_weights_latency_for_8x8_inputs(page, capsys):
    rng = np.random.default_rng(0)
    q, k, v = (np.round(rng.normal(size=(8, 8)), 2) for _ in range(3))
    for name, m in (("Q", q), ("K", k), ("V", v)):
        box = page.locator(f"[data-testid='al-input-{name.lower()}'] textarea")
        box.fill("\n".join(", ".join(f"{x:g}" for x in r) for r in m))
        box.blur()
    page.wait_for_function("document.querySelectorAll('#al-weights tr').length === 9")
    slider = temperature_slider(page)
    slider.focus()
    times = []
    for step in range(1, 9):
        t = 1.0 + step / 10
        start_t = time.perf_counter()
        page.keyboard.press("ArrowRight")
        page.wait_for_selector(f"#al-weights[data-temperature='{logic.num(t)}']")
        times.append((time.perf_counter() - start_t) * 1000)
    _, ref = reference_attention(q, k, v, allowed=masks.causal(8), temperature=1.8)
    masked_equal(table_values(page, "al-weights"), ref, masks.causal(8))
    line = (
        f"lab latency, slider change -> updated 8x8 weights: median {statistics.median(times):.0f} ms, "
        f"max {max(times):.0f} ms over {len(times)} changes (goal < 200 ms)"
    )
    with capsys.disabled():  # shown in every run, not only with -s
        print("\n" + line)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "lab-latency.txt").write_text(line + "\n")
    page.screenshot(path=str(ARTIFACTS / "lab-8x8.png"), full_page=False)


def test_predict_then_reveal_and_the_steps_by_hand(page):
    assert "Your prediction was right" not in page.content()
    click_on(page.get_by_role("radio", name="the weights stay the same", exact=True))
    click_on(page.get_by_role("switch").first)
    page.wait_for_selector("text=Your prediction was right")
    assert page.get_by_test_id("al-shift-diff").inner_text() in ("0", "1.11e-16", "2.22e-16")
    click_on(page.get_by_role("switch").nth(2))  # experiment 3 (v0 -> [100, 0]) revealed without a prediction
    page.wait_for_selector("text=Make a prediction first")
    page.get_by_text("Every step, by hand").click()
    page.wait_for_selector("text=s[q0,k0] = q0·k0 = 1×1 + 0×0 = 1")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "lab-experiments.png"), full_page=True)


def test_edit_mode_url_opens_the_editor_and_sigkill_takes_the_server_along(browser, tmp_path):
    """``attnlab lab --edit``: the printed URL (with its token) opens marimo's editor, not the password page; the
    bare address asks for the token; a SIGKILL of ``attnlab lab`` leaves no server and no kernel behind."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlab", "lab", "--edit"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    children: set[int] = set()
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    try:
        line = proc.stdout.readline()  # printed once the server answers (attnlab lab waits up to --timeout 60 s)
        m = re.match(r"attnlab lab: editing attnlab_lab.py at (http://127\.0\.0\.1:(\d+)/\?access_token=\S{32}) ", line)
        assert m, line
        url, port = m.group(1), int(m.group(2))
        assert (tmp_path / "attnlab_lab.py").read_text() == NOTEBOOK.read_text()  # the teacher's copy
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        page.goto(url, timeout=WAIT_MS)
        page.wait_for_selector("text=Compute attention by hand: Q, K, V and the causal mask")
        page.wait_for_selector(".cm-editor")  # the cells' code, editable
        assert page.locator("input[type=password]").count() == 0
        page.screenshot(path=str(tmp_path / "lab-edit.png"), full_page=False)
        children = descendants(proc.pid)  # the server, and the kernel it started for this page
        assert len(children) >= 2, children

        stranger = browser.new_context()  # no token, no session cookie: marimo's login page, none of the notebook
        try:
            bare = stranger.new_page()
            bare.goto(url.split("?")[0], timeout=WAIT_MS)
            bare.wait_for_selector("input[type=password]", timeout=WAIT_MS)
            assert "Compute attention by hand" not in bare.content()
        finally:
            stranger.close()

        proc.kill()
        proc.wait(10)
        assert wait_gone(children, 5) == set(), "marimo (or its kernel) outlived attnlab lab"
        assert not serving(port)
    finally:
        context.close()
        kill_all(children | {proc.pid})
        proc.wait(10)
        proc.stdout.close()
