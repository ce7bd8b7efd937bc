"""The lab's live experiments (attnlab.lab.experiments) driven in Debian's Chromium, in English and in Chinese: for
each lesson, move one control and check the number the page shows against the pure function; and the page never
contradicts itself (an edited preset's text is marked as the original, a lesson without Q, K, V clears them).

One marimo server (tests/conftest.py's ``lab``) and one browser (``browser``) for the module, one page per language.
Screenshots go to ``tmp_path`` (and to ``$ATTNLAB_SHOTS`` when it names a folder).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from playwright.sync_api import Page
from test_lab_browser_lessons import shot

from attnlab.lab import experiments as X
from attnlab.lab import presets
from attnlab.lab.i18n import t

pytestmark = pytest.mark.xdist_group("lab_browser_experiments")

WAIT_MS = 60_000

#: item key -> (control, how to set it, the new value, the number checked: a name of Outcome.numbers and an index)
DRIVES = {
    "item-18": ("d_k", "slider", 65, ("var", None)),  # variance: 64 -> 65
    "item-22": ("dtype", "select", "bfloat16", ("stored", None)),  # -1e9 in bfloat16
    "item-21": ("logits", "text", "10, 12", ("stable", 1)),
    "item-26": ("no-scale", "check", True, ("no-scale.sums", 0)),
    "item-32": ("step", "slider", 2, ("alpha", 1)),  # 2x2 --tiled 1: the second key block
    "item-40": ("p", "slider", 0.55, ("dropped", (3, 0))),
    "item-29": ("heads", "number", 16, ("d_head", None)),
    "item-28": ("g_o", "area", "1, 0\n0, 2", ("ds", (0, 0))),
    "item-07": ("t", "number", 3000, ("ratio", None)),
    "item-31": ("n", "number", 2000, ("mem", None)),
    "item-41": ("window", "number", 512, ("window", None)),
    "item-38": ("token", "slider", 1, ("moves", (0, 1))),
    "item-42": ("mask", "area", "1 1 1\n1 1 1", ("masked", None)),
}


def _values(page: Page, name: str) -> np.ndarray:
    rows = page.eval_on_selector_all(
        f"#al-x-{name} tr",
        "trs => trs.slice(1).map(tr => Array.from(tr.querySelectorAll('td')).map(td => td.dataset.value))",
    )
    return np.array([[np.nan if x in ("masked", "nan") else float(x) for x in r] for r in rows])


def _shown(page: Page, name: str, index) -> float:
    """The number ``name`` (a scalar <code data-testid='al-x-NAME'> or a table #al-x-NAME) as the page shows it."""
    scalar = page.locator(f"[data-testid='al-x'] code[data-testid='al-x-{name}']")
    if scalar.count():
        return float(scalar.first.get_attribute("data-value"))
    if name.endswith(".sums"):  # a mistake's row sums: the wrong table's rows, summed
        return float(np.nansum(_values(page, f"wrong-{name[:-5]}"), axis=1)[index])
    table = {"alpha": "online", "moves": "leak", "output": "out"}.get(name, name)
    m = _values(page, table)
    if name == "alpha":
        return float(m[index, 2])
    if name in ("stable", "naive"):
        return float(m[0, index])
    return float(m[index])


def _poll(page: Page, name: str, index, expected: float) -> float:
    """The number on the page once it is the expected one (or whatever it is after WAIT_MS)."""
    got = math.nan
    for _ in range(WAIT_MS // 250):
        try:
            got = _shown(page, name, index)
        except (IndexError, ValueError, TypeError):  # the table is being redrawn
            got = math.nan
        same = got == expected or (math.isnan(got) and math.isnan(expected))  # -inf, nan: the traps' own numbers
        if same or abs(got - expected) <= 1e-12 + 1e-12 * abs(expected):
            return got
        page.wait_for_timeout(250)
    return got


def _expected(numbers, name: str, index) -> float:
    x = numbers[name]
    return float(x if index is None else np.asarray(x)[index])


def _set(page: Page, exp, control: str, how: str, value) -> None:
    lang = page.lang  # type: ignore[attr-defined]
    box = page.locator(f"[data-testid='al-x-in-{control}']")
    if how == "slider":
        thumb = box.get_by_role("slider")
        now = float(thumb.get_attribute("aria-valuenow"))
        step = 0.05 if control == "p" else 1
        key = "ArrowRight" if value > now else "ArrowLeft"
        for _ in range(round(abs(value - now) / step)):
            thumb.press(key)
    elif how == "select":  # the option's words in the page's language
        c = next(c for c in exp.controls if c.name == control)
        box.locator("select").select_option(label=t(lang, next(lab for lab, v in c.options if v == value)))
    elif how == "check":
        box.get_by_role("checkbox").click()
    elif how == "area":
        box.locator("textarea").fill(value)
        box.locator("textarea").blur()
    else:
        box.locator("input").fill(str(value))
        box.locator("input").press("Enter")
        box.locator("input").blur()


@pytest.fixture(scope="module", params=["en", "zh"])
def page(lab, browser, request):
    context = browser.new_context(viewport={"width": 1300, "height": 1800})
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    pg.goto(lab.url, timeout=WAIT_MS)
    pg.wait_for_selector("#al-weights", timeout=60_000)
    pg.wait_for_selector("[data-testid='al-growth']", timeout=60_000)  # the last cell: the first run is over
    if request.param == "zh":
        pg.locator("select").first.select_option(label="中文")
        pg.wait_for_selector("text=文章条目（预设）")
    pg.lang = request.param  # type: ignore[attr-defined]
    yield pg
    context.close()


def _choose(page: Page, key: str) -> None:
    p = presets.ITEM_PRESETS[key]
    page.locator("select").nth(1).select_option(label=p.label(page.lang))  # type: ignore[attr-defined]
    page.wait_for_selector(f"[data-testid='al-item'][data-key='{key}']")


def test_every_experiment_recomputes_from_its_control(page, tmp_path):
    lang = page.lang
    for key, (control, how, value, (name, index)) in DRIVES.items():
        item = presets.ITEM_PRESETS[key]
        exp = X.experiment_for(item)
        assert exp is not None, key
        _choose(page, key)
        page.wait_for_selector(f"[data-testid='al-x'][data-key='{exp.key}'][data-article='true']")
        assert page.locator("[data-testid='al-x'] mark").count() > 0, key  # the article's numbers marked
        _set(page, exp, control, how, value)
        vals = {**exp.defaults(), control: value}
        want = X.run(exp, vals, item.state, lang)
        assert want.ok, (key, want.message)
        expected = _expected(want.numbers, name, index)
        if want.article:  # one more mistake ticked, another block shown: still the article's setting, still marked
            assert how in ("check", "slider") and key in ("item-26", "item-32"), key
        else:
            page.wait_for_selector(f"[data-testid='al-x'][data-key='{exp.key}'][data-article='false'][data-ok='true']")
            # the preset's text no longer matches: marked as the original, its marks struck through
            page.wait_for_selector(f"[data-testid='al-item'][data-key='{key}'][data-stale='true']")
            assert page.locator("mark[data-testid='al-expect']").count() == 0, key
        got = _poll(page, name, index, expected)
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12, err_msg=key)  # nan == nan here
        if key in ("item-22", "item-32"):
            shot(page, tmp_path, f"experiment-{key}-{lang}")
        if key == "item-22":  # a lesson without Q, K, V: none of the lab's matrices or heatmap under it
            assert page.locator("#al-weights").count() == 0
            assert page.locator("[data-testid='al-input-q']").count() == 0


def test_an_edit_marks_the_presets_text_as_the_original(page):
    _choose(page, "item-00")  # 000 one row by hand: 6.6976
    page.wait_for_selector("[data-testid='al-item'][data-key='item-00']:not([data-stale])")
    assert page.locator("mark[data-testid='al-expect']").count() > 0
    box = page.locator("[data-testid='al-input-v'] textarea")
    box.fill("100, 0\n0, 20")
    box.blur()
    page.wait_for_selector("[data-testid='al-item'][data-key='item-00'][data-stale='true']")
    page.wait_for_selector("[data-testid='al-stale']")
    assert page.locator("mark[data-testid='al-expect']").count() == 0  # 6.6976 no longer marked as current
    # the output is its own cell: it may come a moment after the stale mark
    page.wait_for_function(
        "() => { const td = document.querySelector('#al-output td'); "
        "return td !== null && Math.abs(parseFloat(td.dataset.value) - 66.9762) < 1e-4; }"
    )
    out = page.eval_on_selector_all("#al-output td", "tds => tds.map(td => td.dataset.value)")
    assert abs(float(out[0]) - 66.9762) < 1e-4


#: The experiments' other controls (item, control, how, value, checked number): every control is driven once.
OTHERS = (
    ("item-18", "samples", "number", 500, ("var", None)),
    ("item-18", "seed", "number", 4, ("var_scaled", None)),
    ("item-22", "fill", "select", "finfo32", ("stored", None)),
    ("item-21", "dtype", "select", "float16", ("naive", 0)),
    ("item-26", "softmax-then-mask", "check", False, ("right", (0, 0))),
    ("item-32", "block_k", "slider", 2, ("output", (1, 1))),
    ("item-40", "seed", "number", 7, ("dropped", (3, 0))),
    ("item-29", "d_model", "number", 96, ("d_head", None)),
    ("item-29", "n", "number", 7, ("d_head", None)),
    ("item-29", "batch", "number", 3, ("d_head", None)),
    ("item-07", "base", "number", 512, ("ratio", None)),
    ("item-31", "d_model", "number", 1024, ("cross", None)),
    ("item-31", "heads", "number", 16, ("attn", None)),
    ("item-41", "n", "number", 1000, ("full", None)),
    ("item-38", "key", "text", "-2, 5", ("moves", (0, 1))),
    ("item-38", "value", "text", "0, 9", ("moves", (0, 1))),
    ("item-42", "q", "area", "1, 2\n0, 1", ("agg", None)),
    ("item-42", "k", "area", "1, 1\n0, 1\n2, 0", ("masked", None)),
    ("item-42", "v", "area", "1, 1\n2, 0\n0, 3", ("agg", None)),
)


def test_every_other_control_and_a_bad_value(page):
    """The other controls, one preset at a time (choosing another preset puts its controls back at the article's
    values), each change checked against the pure function of all the values set so far."""
    lang = page.lang
    by_item: dict[str, list] = {}
    for key, *rest in OTHERS:
        by_item.setdefault(key, []).append(rest)
    for key, drives in by_item.items():
        item = presets.ITEM_PRESETS[key]
        exp = X.experiment_for(item)
        _choose(page, key)
        page.wait_for_selector(f"[data-testid='al-x'][data-key='{exp.key}'][data-article='true']")
        vals = exp.defaults()
        for control, how, value, (name, index) in drives:
            _set(page, exp, control, how, value)
            vals[control] = value
            want = X.run(exp, vals, item.state, lang)
            assert want.ok, (key, control, want.message)
            expected = _expected(want.numbers, name, index)
            got = _poll(page, name, index, expected)
            np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12, err_msg=f"{key} {control}")
    # a value the experiment cannot use: the page says why, in the page's language
    _choose(page, "item-29")
    _set(page, X.EXPERIMENTS["multi-head"], "d_model", "number", 500)
    box = page.wait_for_selector("[data-testid='al-x'][data-ok='false'] [data-testid='al-x-error']")
    want = X.run(X.experiment_for(presets.ITEM_PRESETS["item-29"]), {"d_model": 500}, None, lang)
    assert want.message in box.inner_text()
