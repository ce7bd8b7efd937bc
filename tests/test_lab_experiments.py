"""The lab's live experiments (attnlab.lab.experiments), no browser: at the article's settings each one's numbers are
what ``attnlab explain`` computes (its functions and its printed text, both languages); at other control values they
match an independent float64 NumPy computation; bad input gives a message, never an exception; an edited preset's
text is marked as the original."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pytest

from attnlab.explain.fmt import num
from attnlab.explain.lessons import LESSON_FUNCTIONS
from attnlab.explain.request import explain_argv
from attnlab.lab import experiments as X
from attnlab.lab import presets
from attnlab.lab.i18n import t

LANGS = ("en", "zh")
ITEMS = presets.ITEM_PRESETS


def _run(item_key: str, lang: str = "en", state=None, **changes):
    item = ITEMS[item_key]
    exp = X.experiment_for(item)
    out = X.run(exp, {**exp.defaults(), **changes}, item.state if state is None else state, lang)
    assert out.ok, out.message
    return out


def _text(key: str, lang: str) -> str:
    code, text = explain_argv(ITEMS[key].argv, lang)
    assert code == 0
    return text


def _softmax(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        z = np.exp(x - x.max(-1, keepdims=True))
        return z / z.sum(-1, keepdims=True)


def test_every_static_item_has_an_experiment_at_the_articles_setting():
    keys = {X.experiment_for(p).key for p in ITEMS.values() if X.experiment_for(p) is not None}
    want = {"variance", "fp16-mask", "overflow", "mistakes", "online", "dropout", "multi-head", "backward", "growth"}
    assert want | {"complexity", "long-context", "leak-test", "invariants"} <= keys
    for key, p in ITEMS.items():
        exp = X.experiment_for(p)
        if exp is not None:
            for lang in LANGS:
                out = X.run(exp, exp.defaults(), p.state, lang)
                assert out.ok and out.article, (key, lang, out.message)
                assert "data-marked" in out.html


@pytest.mark.parametrize("lang", LANGS)
def test_variance_at_the_article_and_at_another_d_k(lang):
    out = _run("item-18", lang, d_k=64)
    m = LESSON_FUNCTIONS["variance"](lang).step("variance").matrix
    assert out.numbers["var"] == m[2, 0] and out.numbers["var_scaled"] == m[2, 2]
    assert re.search(rf"d_k=64 +{num(m[2, 0])} ", _text("item-18", lang))  # the row of explain's table
    # another width, sample size and seed: the same draws as a float64 NumPy loop over the widths in order
    out = _run("item-18", lang, d_k=100, samples=500, seed=3)
    rng = np.random.default_rng(3)
    for d in (2, 8, 64, 512, 100):
        q, k = rng.standard_normal((500, d)), rng.standard_normal((500, d))
        dots = (q * k).sum(-1)
        rng.standard_normal((500, 1, d)), rng.standard_normal((500, 16, d))
    assert not out.article
    np.testing.assert_allclose(out.numbers["var"], dots.var(), rtol=1e-9)
    np.testing.assert_allclose(out.numbers["var_scaled"], (dots / 10).var(), rtol=1e-9)


def _bf16(x: float) -> float:
    """float32 -> bfloat16 by hand: round the upper 16 bits to nearest even (overflow to inf)."""
    b = int(np.array([x], dtype=np.float32).view(np.uint32)[0])
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return float(np.array([b], dtype=np.uint32).view(np.float32)[0])


@pytest.mark.parametrize("lang", LANGS)
def test_mask_fill_and_dtype(lang):
    lesson = LESSON_FUNCTIONS["fp16-mask"](lang)
    out = _run("item-22", lang)  # -1e9 in float16
    assert out.numbers["stored"] == -math.inf == lesson.step("fills").matrix[1, 1]
    np.testing.assert_array_equal(out.numbers["causal"], lesson.step("causal").matrix[:, 2:])
    np.testing.assert_array_equal(np.isnan(out.numbers["empty"]), np.isnan(lesson.step("empty").matrix[1]))
    assert "float16 -inf  <- overflow" in _text("item-22", "en")
    f32 = _run("item-22", lang, dtype="float32")
    np.testing.assert_array_equal(f32.numbers["causal"], lesson.step("causal").matrix[:, :2])
    np.testing.assert_array_equal(f32.numbers["empty"], lesson.step("empty").matrix[0])  # uniform: a silent bug
    # bfloat16: float32's finfo.min rounds past bfloat16's largest finite value to -inf; -1e4 becomes -9984
    assert (
        _run("item-22", lang, fill="finfo32", dtype="bfloat16").numbers["stored"] == _bf16(-3.4028235e38) == -math.inf
    )
    assert _run("item-22", lang, fill="-1e4", dtype="bfloat16").numbers["stored"] == _bf16(-1e4) == -9984.0
    ref = _softmax(np.array([[1 / math.sqrt(2), -1e9], [0.0, 1 / math.sqrt(2)]]))
    np.testing.assert_allclose(_run("item-22", lang, fill="-inf", dtype="bfloat16").numbers["causal"], ref, atol=4e-3)


@pytest.mark.parametrize("lang", LANGS)
def test_overflow_with_and_without_the_max(lang):
    lesson = LESSON_FUNCTIONS["overflow"](lang)
    out = _run("item-21", lang)
    assert np.isnan(out.numbers["naive"]).all() and np.isnan(lesson.step("naive").matrix).all()
    np.testing.assert_allclose(out.numbers["stable"], lesson.weights[0], rtol=1e-15)
    assert "0.7311  0.2689" in _text("item-21", lang)
    f16 = _run("item-21", lang, logits="10, 12", dtype="float16")  # e^12 = 162755 > 65504: inf in float16
    assert f16.numbers["naive"][0] == 0 and np.isnan(f16.numbers["naive"][1])
    np.testing.assert_allclose(f16.numbers["stable"], _softmax(np.array([10.0, 12.0])), atol=1e-3)


@pytest.mark.parametrize("lang", LANGS)
def test_the_mistakes_side_by_side(lang):
    out = _run("item-26", lang)  # mask-order, softmax then mask
    sums = out.numbers["softmax-then-mask.sums"]
    assert f"right 1; wrong {num(sums[0])}" in _text("item-26", "en")
    # your own inputs: softmax over every key then the causal mask, by NumPy
    st = replace(ITEMS["item-03"].state, q="1, 2\n0, 1\n3, 1\n1, 1")
    item = replace(ITEMS["item-26"], state=ITEMS["item-03"].state)
    exp = X.experiment_for(item)
    got = X.run(exp, {**exp.defaults(), "no-scale": True}, st, lang)
    assert got.ok and not got.article
    q = np.array([[1.0, 2], [0, 1], [3, 1], [1, 1]])
    k = np.array([[1.0, 0], [0, 1], [1, 1], [-1, 1]])
    s = q @ k.T / math.sqrt(2)
    allowed = np.tril(np.ones((4, 4), bool))
    np.testing.assert_allclose(got.numbers["softmax-then-mask.wrong"], _softmax(s) * allowed, atol=1e-12)
    np.testing.assert_allclose(got.numbers["no-scale.wrong"], _softmax(np.where(allowed, q @ k.T, -np.inf)), atol=1e-12)


def _online_ref(s: np.ndarray, v: np.ndarray, block: int):
    """An independent online softmax: (m, l, α) after every block, and the output."""
    n_q, n_k = s.shape
    m, l, acc, out = np.full(n_q, -np.inf), np.zeros(n_q), np.zeros((n_q, v.shape[1])), []
    for j0 in range(0, n_k, block):
        sb = s[:, j0 : j0 + block]
        m_new = np.maximum(m, sb.max(1))
        alpha = np.where(np.isfinite(m), np.exp(m - m_new), 0.0)
        p = np.where(np.isfinite(sb), np.exp(sb - m_new[:, None]), 0.0)
        l, acc, m = alpha * l + p.sum(1), alpha[:, None] * acc + p @ v[j0 : j0 + block], m_new
        out.append((m.copy(), l.copy(), alpha))
    return out, acc / l[:, None]


@pytest.mark.parametrize("lang", LANGS)
def test_online_softmax_block_by_block(lang):
    out = _run("item-32", lang, step=2)  # 2x2 --tiled 1: q1 meets its larger score in the second block
    assert f"α = exp(0 - 0.7071) = {num(out.numbers['alpha'][1])}" in _text("item-32", lang)
    s = np.array([[1.0, 0], [0, 1]]) / math.sqrt(2)
    ref, o = _online_ref(s, np.array([[10.0, 0], [0, 20]]), 1)
    np.testing.assert_allclose(out.numbers["alpha"], ref[1][2], rtol=1e-12)
    # causal-4, blocks of 3 keys, the last block: the dense output
    st = ITEMS["item-12"].state
    got = _run("item-12", lang, block_k=3, step=8)
    assert not got.article and got.numbers["blocks"] == 2
    q = np.array([[1.0, 0], [0, 1], [1, 1], [1, -1]])
    k = np.array([[1.0, 0], [0, 1], [1, 1], [-1, 1]])
    s = np.where(np.tril(np.ones((4, 4), bool)), q @ k.T / math.sqrt(2), -np.inf)
    ref, o = _online_ref(s, np.array([[1.0, 0], [0, 1], [1, 1], [2, 0]]), 3)
    np.testing.assert_allclose(got.numbers["m_i"], ref[1][0], rtol=1e-12)
    np.testing.assert_allclose(got.numbers["l_i"], ref[1][1], rtol=1e-12)
    np.testing.assert_allclose(got.numbers["output"], o, rtol=1e-12)
    assert st == ITEMS["item-12"].state


@pytest.mark.parametrize("lang", LANGS)
def test_dropout_p_and_seed(lang):
    out = _run("item-40", lang)
    text = _text("item-40", lang)
    assert f"{num(out.numbers['sums'][3])}" == "1.6089" and "1.6089" in text
    got = _run("item-40", lang, p=0.3, seed=5)
    d = got.numbers["dropped"]
    q = np.array([[1.0, 0], [0, 1], [1, 1], [1, -1]])
    k = np.array([[1.0, 0], [0, 1], [1, 1], [-1, 1]])
    a = _softmax(np.where(np.tril(np.ones((4, 4), bool)), q @ k.T / math.sqrt(2), -np.inf))
    np.testing.assert_allclose(d, a * (d != 0) / 0.7, rtol=1e-12)  # Ã = A ∘ keep / (1 - p)
    np.testing.assert_allclose(got.numbers["sums"], d.sum(-1), rtol=1e-12)


@pytest.mark.parametrize("lang", LANGS)
def test_multi_head_shapes(lang):
    out = _run("item-29", lang)
    text = _text("item-29", lang)
    assert str(list(out.numbers["q_heads"])) == "[1, 8, 4, 64]" and "[1, 8, 4, 64]" in text
    assert str(list(out.numbers["output"])) == "[1, 4, 512]" and "[1, 4, 512]" in text
    got = _run("item-29", lang, d_model=96, heads=3, n=5, batch=2)
    assert got.numbers["q_heads"] == (2, 3, 5, 32) and got.numbers["scores"] == (2, 3, 5, 5)
    assert got.numbers["output"] == (2, 5, 96) and got.numbers["d_head"] == 32


@pytest.mark.parametrize("lang", LANGS)
def test_backward_of_an_editable_2x2(lang):
    out = _run("item-28", lang)
    assert f"= {num(out.numbers['ds'][0, 0])}" in _text("item-28", lang)
    assert num(out.numbers["ds"][0, 0]) == "-2.2118"
    st = replace(ITEMS["item-28"].state, q="1, 2\n0, 1", v="3, 0\n1, 4")
    g = np.array([[1.0, -1], [2, 0.5]])
    got = _run("item-28", lang, state=st, g_o="1, -1\n2, 0.5")
    q, k, v = np.array([[1.0, 2], [0, 1]]), np.eye(2), np.array([[3.0, 0], [1, 4]])
    a = _softmax(q @ k.T / math.sqrt(2))
    da = g @ v.T
    ds = a * (da - (da * a).sum(-1, keepdims=True))
    np.testing.assert_allclose(got.numbers["dv"], a.T @ g, rtol=1e-12)
    np.testing.assert_allclose(got.numbers["ds"], ds, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got.numbers["dq"], ds @ k / math.sqrt(2), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got.numbers["dk"], ds.T @ q / math.sqrt(2), rtol=1e-12, atol=1e-15)
    assert got.numbers["check"].max() < 1e-6  # attention_backward and a finite difference
    bad = X.run(X.experiment_for(ITEMS["item-28"]), {"g_o": "1, 2, 3"}, ITEMS["item-28"].state, lang)
    assert not bad.ok and bad.message


@pytest.mark.parametrize("lang", LANGS)
def test_growth_complexity_and_long_context(lang):
    g = _run("item-07", lang)
    assert "1,048,576 -> 16,777,216 elements, 16x" in _text("item-07", "en")
    assert (g.numbers["base_elements"], g.numbers["elements"], g.numbers["ratio"]) == (1048576, 16777216, 16.0)
    assert _run("item-07", lang, t=3000).numbers["ratio"] == 3000**2 / 1024**2
    c = _run("item-31", lang)
    text = _text("item-31", "en")
    assert f"n ≈ {c.numbers['cross']}" in text and f"= {num(c.numbers['kv'])} MiB (GQA, 8 KV heads)" in text
    m = LESSON_FUNCTIONS["complexity"](lang).step("flops").matrix
    np.testing.assert_array_equal([c.numbers["proj"], c.numbers["attn"], c.numbers["mem"]], m[3])  # n = 4,096
    c2 = _run("item-31", lang, n=2000, d_model=256, heads=4)
    assert c2.numbers["mem"] == 4 * 2000**2 * 4 / 2**20 and c2.numbers["kv"] == 2 * 32 * 8 * 128 * 2000 * 2 / 2**20
    lc = _run("item-41", lang)
    np.testing.assert_array_equal(lc.numbers["table"], LESSON_FUNCTIONS["long-context"](lang).step("double").matrix)
    assert f"{num(lc.numbers['window'])}x with a window of 1,024 keys" in _text("item-41", "en")
    w = _run("item-41", lang, n=1000, window=100).numbers["table"]
    assert w[2, 0] == np.minimum(np.arange(1, 1001), 100).sum() and w[2, 1] == np.minimum(np.arange(1, 2001), 100).sum()


def _attn(q, k, v, allowed):
    return _softmax(np.where(allowed, q @ k.T / math.sqrt(q.shape[1]), -np.inf)) @ v


@pytest.mark.parametrize("lang", LANGS)
def test_leak_test_with_a_chosen_token(lang):
    out = _run("item-38", lang)
    np.testing.assert_array_equal(out.numbers["moves"], LESSON_FUNCTIONS["leak-test"](lang).step("change").matrix)
    assert "q0 moves 0 under the causal mask" in _text("item-38", "en")
    got = _run("item-38", lang, token=1, key="2, 2", value="-5, 7")
    x = np.array([[1.0, 0], [0, 1], [1, 1]])
    k2, v2 = x.copy(), x.copy()
    k2[1], v2[1] = [2, 2], [-5, 7]
    c = np.tril(np.ones((3, 3), bool))
    for col, allowed in enumerate((c, c.T)):
        moved = np.abs(_attn(x, k2, v2, allowed) - _attn(x, x, x, allowed)).max(-1)
        np.testing.assert_allclose(got.numbers["moves"][:, col], moved, atol=1e-12)
    assert got.numbers["moves"][0, 0] == 0 and got.numbers["moves"][0, 1] > 1


@pytest.mark.parametrize("lang", LANGS)
def test_invariants_on_the_inputs(lang):
    out = _run("item-42", lang)
    text = _text("item-42", "en")
    assert "valid rows sum to 1: " + ", ".join(num(s) for s in out.numbers["sums"]) in text
    assert f"check: {out.numbers['violations']} violations" in text
    np.testing.assert_allclose(out.numbers["weights"], LESSON_FUNCTIONS["invariants"](lang).weights, rtol=1e-15)
    got = _run("item-42", lang, q="1, 2\n3, 4\n0, 1", k="1, 0\n0, 1", v="1\n2", mask="")
    q, k = np.array([[1.0, 2], [3, 4], [0, 1]]), np.eye(2)
    np.testing.assert_allclose(got.numbers["weights"], _softmax(q @ k.T / math.sqrt(2)), rtol=1e-12)
    assert got.numbers["violations"] == 0 and got.numbers["masked"] == 0


@pytest.mark.parametrize("lang", LANGS)
def test_bad_input_is_a_message_in_the_language(lang):
    cases = [
        ("item-18", {"d_k": "x"}),
        ("item-18", {"d_k": 5000}),
        ("item-21", {"logits": "1, a"}),
        ("item-29", {"d_model": 500}),
        ("item-38", {"key": "1, 2, 3"}),
        ("item-42", {"mask": "1 2"}),
        ("item-32", {"block_k": 0}),
    ]
    for key, vals in cases:
        exp = X.experiment_for(ITEMS[key])
        out = X.run(exp, {**exp.defaults(), **vals}, ITEMS[key].state, lang)
        assert not out.ok and out.message and 'data-testid="al-x-error"' in out.html, (key, vals)
    broken = replace(ITEMS["item-28"].state, q="1, 2\n3")
    assert not X.run(X.experiment_for(ITEMS["item-28"]), {}, broken, lang).ok
    if lang == "zh":
        msg = X.run(X.EXPERIMENTS["multi-head"], {"d_model": 500}, None, "zh").message
        assert msg == "d_model = 500 不能被 h = 8 整除：d_head = d_model / h 必须是整数"


def test_every_control_title_and_note_has_its_chinese():
    for exp in X.EXPERIMENTS.values():
        assert t("zh", exp.title) != exp.title, exp.title
        for c in exp.controls:
            if c.label not in ("d_k", "d_model", "dtype"):  # identifiers stay as they are
                assert t("zh", c.label) != c.label, c.label
    # every sentence the module writes through the catalogue: t(lang, "...") in its source
    source = open(X.__file__, encoding="utf-8").read()
    said = [
        "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m))
        for m in re.findall(r't\(\s*lang,\s*((?:"(?:[^"\\]|\\.)*"\s*)+)', source)
    ]
    assert len(said) > 60
    missing = [s for s in said if t("zh", s) == s]
    assert not missing, missing
    out = X.run(X.EXPERIMENTS["growth"], {"t": 3000}, None, "zh")
    assert "不是文章的设置" in out.html and "tokens" not in out.html


def test_an_edit_marks_the_presets_text_as_the_original_and_lessons_clear_qkv():
    item = ITEMS["item-00"]  # 000 one row by hand: 6.6976
    fresh = X.item_box(item, item.state, None, "en")
    assert "data-stale" not in fresh and '<mark data-testid="al-expect">' in fresh and "6.6976" in fresh
    edited = X.item_box(item, replace(item.state, v="100, 0\n0, 20"), None, "en")
    assert 'data-stale="true"' in edited and 'data-testid="al-expect"' not in edited
    assert "the preset&#x27;s original output" in edited  # the banner, HTML-escaped
    moved = X.run(X.experiment_for(ITEMS["item-18"]), {"d_k": 65}, None, "zh")
    assert 'data-stale="true"' in X.item_box(ITEMS["item-18"], None, moved, "zh")
    assert not X.uses_qkv(ITEMS["item-22"]) and X.uses_qkv(ITEMS["item-28"]) and X.uses_qkv(None)
