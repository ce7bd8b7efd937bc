"""Every item of both articles runs from ``attnlab explain`` and prints the article's number; docs/learn.md's table
is :data:`attnlab.articles.ITEMS`; the lessons' numbers against independent references; ``--lang zh`` leaves no
English behind."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from attnlab import attention_backward, attention_trace, masks
from attnlab.articles import ITEMS, LESSONS, items_table
from attnlab.cli import main
from attnlab.explain import explain_example, setup_from_example
from attnlab.explain.args import EXAMPLE_NAMES
from attnlab.explain.i18n import MESSAGES, TERMS, tr
from attnlab.explain.lessons import explain_backward, explain_dropout, explain_lesson

DOC = Path(__file__).resolve().parents[1] / "docs" / "learn.md"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["explain", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("item", ITEMS, ids=[f"{i.source} {i.section} {' '.join(i.argv)}" for i in ITEMS])
def test_every_item_prints_the_articles_number(capsys, item):
    code, out, err = run(capsys, *item.argv, "--format", "text", "--width", "100")
    assert code == 0, err
    for expected in item.expect:
        assert expected in out, f"`attnlab explain {' '.join(item.argv)}` does not print {expected!r}"


def test_docs_learn_md_table_is_the_items():
    doc = DOC.read_text(encoding="utf-8")
    table = re.search(r"<!-- items table: .*? -->\n(.*?)<!-- end of items table -->", doc, flags=re.S)
    assert table is not None
    assert table.group(1) == items_table(), "docs/learn.md's items table drifted: regenerate with items_table()"


def test_every_named_example_and_lesson_is_in_the_items_table_and_list(capsys):
    used = {i.argv[0] for i in ITEMS if not i.argv[0].startswith("-")}
    assert set(EXAMPLE_NAMES) - used <= {"column-bias"}  # column-bias is the self-test's data (--bias is the item)
    code, out, _ = run(capsys, "--list")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == len(EXAMPLE_NAMES)
    assert next(ln for ln in lines if ln.startswith("2x2-causal ")).endswith("[article 001 §7.3]")


# ---------------------------------------------------------------------------------------------------------------
# the lessons against independent references


def test_variance_experiment_var_grows_with_d_k_and_the_scale_restores_it():
    e = explain_lesson("variance")
    m = e.step("variance").matrix  # [d_k, (var, std, scaled var)]
    dks = np.array([2, 8, 64, 512])
    np.testing.assert_allclose(m[:, 0] / dks, 1.0, atol=0.1)
    np.testing.assert_allclose(m[:, 2], 1.0, atol=0.1)
    sat = e.step("saturation").matrix
    assert np.all(np.diff(sat[:, 0]) > 0) and sat[-1, 0] > 0.9  # unscaled: toward one-hot
    assert np.ptp(sat[:, 1]) < 0.05  # scaled: independent of d_k


def test_overflow_line_appears_exactly_where_exp_overflows(capsys):
    _, out, _ = run(capsys, "overflow", "--format", "text")
    assert "exp([1000, 999]) = [inf, inf]: overflow; [inf, inf] / inf = [nan, nan]" in out
    assert "(without subtracting the max: exp(1000) = inf" in out
    _, out, _ = run(capsys, "--q", "1", "--k", "1;0", "--v", "1;2", "--scale", "700", "--format", "text")
    assert "without subtracting the max: exp = [" in out  # 700 < 709.78: no overflow, the raw line is shown
    _, out, _ = run(capsys, "--q", "1", "--k", "1;0", "--v", "1;2", "--scale", "710", "--format", "text")
    assert "exp(710) = inf" in out


def test_fp16_mask_numbers():
    e = explain_lesson("fp16-mask")
    stored = e.step("fills").matrix
    assert stored[1, 0] == -1e9 and stored[1, 1] == -np.inf  # -1e9: float32 keeps it, float16 overflows
    assert stored[0, 1] == -1e4
    empty = e.step("empty").matrix
    np.testing.assert_array_equal(empty[0], [0.5, 0.5])
    assert np.isnan(empty[1]).all() and np.isnan(empty[2]).all()


def test_self_test_shift_changes_nothing_and_a_column_bias_changes_the_weights():
    e = explain_lesson("self-test")
    base, shifted, col = (e.step(k).matrix for k in ("base", "shift", "column_bias"))
    np.testing.assert_allclose(shifted, base, atol=1e-12)
    ex = setup_from_example("causal-4")
    ref = attention_trace(ex.q, ex.k, ex.v, causal=True, bias=np.array([[0.0, 1, 2, 3]])).weights
    np.testing.assert_allclose(col, ref, atol=1e-12)
    assert np.abs(col - base).max() > 0.3


def test_multi_head_by_hand_matches_multi_head_attention_and_per_head_reference():
    from reference import reference_attention

    from attnlab import multi_head_attention
    from attnlab.articles import MULTI_HEAD as D
    from attnlab.core.multihead import MultiHeadWeights

    e = explain_lesson("multi-head")
    x = np.asarray(D.x)
    q, k, v = x @ D.w_q, x @ D.w_k, x @ D.w_v
    heads = [reference_attention(q[:, s], k[:, s], v[:, s])[0] for s in (slice(0, 2), slice(2, 4))]
    np.testing.assert_allclose(e.step("concat").matrix, np.concatenate(heads, -1), atol=1e-12)
    w = MultiHeadWeights(D.w_q, D.w_k, D.w_v, D.w_o, num_heads=2)
    np.testing.assert_allclose(e.output, multi_head_attention(x[None], None, w).output[0], atol=1e-12)
    assert "0.7071 (not 1/sqrt(d_model) = 1/sqrt(4) = 0.5)" in e.step("head0").lines[0]


@pytest.mark.parametrize("name", ["2x2", "2x2-causal", "causal-4", "cross"])
def test_backward_by_hand_equals_attention_backward(name):
    s = setup_from_example(name)
    rng = np.random.default_rng(1)
    g = rng.standard_normal((s.n_q, s.v.shape[1]))
    e = explain_backward(s, g)
    t = attention_trace(s.q, s.k, s.v, causal=s.causal)
    ref = attention_backward(t, g)
    np.testing.assert_allclose(e.step("dq").matrix, ref.dq, atol=1e-12)
    np.testing.assert_allclose(e.step("dk").matrix, ref.dk, atol=1e-12)
    np.testing.assert_allclose(e.step("dv").matrix, ref.dv, atol=1e-12)
    assert e.step("check").matrix[:, 1].max() < 1e-6  # the finite difference
    if s.causal:
        assert e.step("ds").matrix[0, 1] == 0.0  # masked: exactly zero gradient


def test_backward_cli_with_a_given_grad_out(capsys):
    code, out, _ = run(capsys, "2x2", "--backward", "--grad-out", "1,0;0,1", "--format", "text")
    assert code == 0
    # dV = Aᵀ G_O = Aᵀ for G_O = I
    assert "dV[k0] = 0.6698×[1, 0] + 0.3302×[0, 1] = [0.6698, 0.3302]" in out
    code, _, err = run(capsys, "2x2", "--backward", "--grad-out", "1,0")
    assert code == 2 and "d_out: shape (1, 2)" in err


def test_dropout_row_sums_and_expectation():
    s = setup_from_example("causal-4")
    e = explain_dropout(s, 0.5, seed=0)
    a = e.step("weights").matrix
    keep = np.random.default_rng(0).random(a.shape) >= 0.5  # the draw attnlab.dropout makes
    np.testing.assert_allclose(e.step("dropped").matrix, a * keep / 0.5, atol=1e-12)
    sums = e.step("dropped").matrix.sum(-1)
    assert not np.allclose(sums, 1.0)
    np.testing.assert_allclose(e.step("mean").matrix, a, atol=0.03)


def test_leak_test_and_growth_numbers():
    m = explain_lesson("leak-test").step("change").matrix
    np.testing.assert_array_equal(m[:2, 0], 0.0)  # causal: the past does not move
    assert m[0, 1] > 1.0  # inverted: the first query reads the changed future
    g = explain_lesson("growth").step("growth").matrix
    assert g[-1, 1] / g[0, 1] == 16


def test_causal_one_query_is_a_decoding_query_and_cross_causal_names_the_cli_option(capsys):
    s = setup_from_example("one-query", causal=True)
    assert s.causal == "bottom_right"
    np.testing.assert_array_equal(s.trace().allowed, masks.causal(1, 2, align="bottom_right"))
    code, _, err = run(capsys, "cross", "--causal")
    assert code == 2 and "--causal-align top_left or --causal-align bottom_right" in err
    assert "causal='top_left'" not in err
    code, out, _ = run(capsys, "cross", "--causal-align", "top_left", "--format", "text")
    assert code == 0 and "■ ⬚ ⬚" in out


def test_softmax_axis_mistake_says_when_it_is_invisible(capsys):
    _, out, _ = run(capsys, "2x2", "--mistake", "query-axis", "--format", "text", "--width", "200")
    assert "the mistake is invisible" in out
    _, out, _ = run(capsys, "causal-4", "--mistake", "query-axis", "--format", "text", "--width", "200")
    assert "the mistake is invisible" not in out


def test_lessons_refuse_modes_that_need_q_and_k(capsys):
    code, _, err = run(capsys, "variance", "--backward")
    assert code == 2 and "--backward needs Q and K" in err
    code, _, err = run(capsys, "2x2", "--backward", "--tiled", "1")
    assert code == 2 and "--tiled and --backward: give one of them" in err


def test_mask_is_not_access_control_against_a_two_layer_reference(capsys):
    # 001 §17.5: b may not see the secret; its output still moves after two layers, by A[b,a]·A[a,secret]·99
    x = np.array([[1.0, 0], [0, 1], [1, 1]])
    allowed = masks.causal(3).copy()
    allowed[2, 0] = False
    s = x @ x.T / np.sqrt(2)
    a = np.where(allowed, np.exp(s - s.max(-1, keepdims=True)), 0.0)
    a /= a.sum(-1, keepdims=True)  # independent float64 softmax
    v, v2 = x.copy(), x.copy()
    v2[0] = [100, 0]
    assert a[2, 0] == 0 and np.abs(a @ v2 - a @ v)[2].max() == 0
    moved = np.abs(a @ (a @ v2) - a @ (a @ v))[2].max()
    assert moved == pytest.approx(a[2, 1] * a[1, 0] * 99, rel=1e-12) and round(moved, 4) == 10.7967
    code, out, _ = run(capsys, "mask-not-access", "--format", "json")
    assert code == 0 and "10.7967" in out and "b's weight on the secret: 0" in out


def test_long_context_counts_match_the_mask_and_the_cost_formulas(capsys):
    # 001 §19: the window's pairs counted on the mask itself; the KV cache from the formula B·L·layers·h_kv·d·2·bytes
    pairs = [int(masks.window(n, left=1023).sum()) for n in (4096, 8192)]
    assert pairs == [3670528, 7864832] and round(pairs[1] / pairs[0], 4) == 2.1427
    mib = [n * 32 * h * 128 * 2 * 2 / 2**20 for n in (4096,) for h in (32, 8, 1)]
    assert mib == [2048, 512, 64]
    code, out, _ = run(capsys, "long-context", "--format", "text")
    assert code == 0
    assert "4,096 -> 8,192: 4x the score elements, 2.1427x with a window of 1,024 keys, 2x the KV cache" in out


def test_invariants_lesson_reports_each_invariant(capsys):
    code, out, _ = run(capsys, "invariants", "--format", "text")
    assert code == 0
    for line in (
        "shape(Q Kᵀ) = [n_q, n_k] = [2, 3]",
        "masked A_ij = 0: max |A_ij| over masked (i, j) = 0",
        "valid rows sum to 1: 1, 1",
        "O = A V: holds",
        "d_k(Q) = d_k(K): 2 = 2",
        "n_k(K) = n_k(V): 3 = 3",
        "attnlab.invariants.check: 0 violations",
    ):
        assert line in out
    e = explain_lesson("invariants")
    q, k, v = np.eye(2), np.array([[1.0, 0], [0, 1], [1, 1]]), np.array([[10.0, 0], [0, 10], [5, 5]])
    ref = attention_trace(q, k, v, np.array([[True, True, False], [True, True, True]]))
    np.testing.assert_allclose(e.weights, ref.weights, rtol=0, atol=1e-15)


# ---------------------------------------------------------------------------------------------------------------
# 中文


#: What may stay in ASCII letters in the Chinese view: symbols, identifiers, array and function names, option
#: names and the articles' own English terms (Softmax, logits, Dropout, FlashAttention, PAD ...).
ALLOWED = set(
    """Q K V X A O S M H G W_O W_Q W_K W_V G_O d_k d_v d_model d_head d_kv n_q n_k n h B L T T² b e l m p r x
    softmax Softmax exp log max sqrt rowsum nan inf lse std Var mean_n max_j one-hot logits logit Dropout dropout
    inverted FlashAttention Attention Self-Attention Cross-Attention KV Cache GQA MHA MQA ALiBi RoPE PAD FLOPs
    GFLOP GFLOP proj QKᵀ AV MiB float16 float32 float64 f32 f16 finfo dtype Bernoulli keep delta acc top_left
    bottom_right raise zero masked_rows attnlab explain variance causal bias mistake sqrt-d-model causal-4 NumPy
    PyTorch SDPA nn MultiheadAttention masks from_blocked to_blocked multi_head_attention return_weights True False
    weights sum axis attention_backward finite difference g_s g_a a j i k v q o s z c x_max x_ij e_ij A_ij l_i m_i
    o_i s_ij q_i k_j v_j Q_r K_r V_r H_r r d Concat Bernoulli Mask Padding Token token batch Batch Kernel
    Jacobian Kronecker E f cols R scale Kᵀ Aᵀ dSᵀ dV dA dS dQ dK NaN I N P n² d² d_model² keep_ij max_d H_ h-1
    rowmax dim log-sum-exp Notebook x2 x2-causal query-axis no-scale sqrt-d-model softmax-then-mask inverted-mask
    d_k=2 all Vᵀ Sᵀ K_0ᵀ K_1ᵀ tiled shape check loss attn""".split()
)
ALLOWED |= set(EXAMPLE_NAMES) | {n[1:] for n in EXAMPLE_NAMES if n[0].isdigit()}
_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9_²ᵀ'-]*")


def english_left(text: str) -> set[str]:
    words = set()
    for w in _TOKEN.findall(text):
        w = w.strip("'-")
        if not w or w in ALLOWED or re.fullmatch(r"[qkvdx]\d+|[A-Za-z]_?\d+|e[-+]?\d+|\d*[a-z]", w):
            continue
        if re.fullmatch(r"[A-Za-z]_[A-Za-z0-9{}]+", w):  # m_i, W_O-style identifiers
            continue
        words.add(w)
    return words


ZH_RUNS = [(name,) for name in EXAMPLE_NAMES] + [
    ("2x2", "--backward"),
    ("causal-4", "--dropout", "0.5"),
    ("causal-4", "--tiled", "2"),
    ("causal-4", "--mistake", "all"),
    ("2x2", "--mistake", "query-axis"),
    ("causal-4", "--bias", "0,1,2,3", "--temperature", "2", "--shift", "3"),
    ("padding", "--padding-side", "left", "--causal", "--masked-rows", "zero"),
    ("one-query", "--causal"),
    ("--list",),
    ("--positions",),
]
ZH_RUNS += [tuple(it.argv) for it in ITEMS if tuple(it.argv) not in ZH_RUNS]  # every item of both articles too
ZH_RUNS = list(dict.fromkeys(ZH_RUNS))


@pytest.mark.parametrize("argv", ZH_RUNS, ids=[" ".join(a) for a in ZH_RUNS])
def test_lang_zh_leaves_no_english(capsys, argv):
    code, out, err = run(capsys, *argv, "--lang", "zh", "--format", "text")
    assert code == 0, err
    assert re.search(r"[\u4e00-\u9fff]", out)
    left = english_left(out)
    assert not left, f"English left in `attnlab explain {' '.join(argv)} --lang zh`: {sorted(left)}"


def test_lang_zh_markdown_json_and_messages(capsys):
    code, out, _ = run(capsys, "2x2-causal", "--lang", "zh", "--format", "markdown", "--mistake", "query-axis")
    assert code == 0 and not english_left(out.replace("`", " ")) and "权重（softmax）" in out
    code, out, err = run(capsys, "--lang", "zh")
    assert code == 2 and err.startswith("attnlab explain：错误：请给出一个命名示例")


def test_catalogue_is_complete_and_uses_the_articles_terms():
    for key, entry in MESSAGES.items():
        assert set(entry) == {"en", "zh"} and entry["en"] and entry["zh"], key
        fields_en = set(re.findall(r"{(\w+)", entry["en"]))
        assert fields_en == set(re.findall(r"{(\w+)", entry["zh"])), key
    for name in (*EXAMPLE_NAMES, *LESSONS):
        assert tr(f"title.{name}", "zh") and tr(f"source.{name}", "zh")
    zh = " ".join(e["zh"] for e in MESSAGES.values())
    for term in ("查询", "键", "值", "因果遮罩", "温度", "缩放", "行和", "权重"):
        assert term in zh and term in TERMS.values()
    assert explain_example("2x2", lang="zh").step("weights").title == "权重（softmax）"


#: Bad input a learner types, each answered in Chinese: the catalogue's messages (explain's input checks, the
#: command line's values, argparse's own) and the core's errors by class (a fully masked row by its rows).
ZH_ERRORS = [
    ("--q", "1,x", "--k", "1,0", "--v", "1"),
    ("--q", "1,0;1", "--k", "1,0", "--v", "1"),
    ("--q", "1,0", "--k", "1,0,0", "--v", "1"),
    ("--q", "1,0", "--k", "1,0", "--v", "1;2"),
    ("--q", "1,0", "--k", "1,0"),
    ("--q", "[1, 2", "--k", "1", "--v", "1"),
    ("--q", "1,inf", "--k", "1,0", "--v", "1"),
    ("nope",),
    ("2x2", "--q", "1"),
    ("2x2", "--tokens", "a b c"),
    ("--q", "missing.npy", "--k", "1", "--v", "1"),
    ("2x2", "--padding", "0"),
    ("2x2", "--padding", "5"),
    ("2x2", "--mask", "1 2; 1 1"),
    ("2x2", "--mask", "1 0 1"),
    ("2x2", "--mask", "0 0; 1 1"),
    ("cross", "--causal"),
    ("2x2", "--temperature", "x"),
    ("2x2", "--temperature", "0"),
    ("2x2", "--shift", "nan"),
    ("2x2", "--format", "xml"),
    ("2x2", "--mistake", "nope"),
    ("2x2", "--dropout", "2"),
    ("2x2", "--tiled", "0"),
    ("2x2", "--width"),
    ("2x2", "--bogus"),
    ("2x2", "--backward", "--grad-out", "1,0"),
    ("2x2", "--backward", "--tiled", "1"),
    ("variance", "--backward"),
    ("2x2", "--scale", "1e308", "--shift", "1e308"),
    (),
]


def zh_error_left(text: str) -> set[str]:
    """English left in a Chinese message, after the option names, quoted values and file names the user typed."""
    text = re.sub(r"--[\w-]+|'[^']*'|\S+\.npy", " ", text)
    return english_left(text) - HELP_ALLOWED


@pytest.mark.parametrize("argv", ZH_ERRORS, ids=[" ".join(a) or "(nothing)" for a in ZH_ERRORS])
def test_lang_zh_errors_leave_no_english(capsys, argv):
    code, out, err = run(capsys, *argv, "--lang", "zh")
    assert code == 2 and out == ""
    assert err.startswith("attnlab explain：错误：") and err.count("\n") == 1, err
    assert re.search(r"[\u4e00-\u9fff]{2}", err.split("：错误：", 1)[1]), err
    assert not zh_error_left(err), f"English left in {err!r}: {sorted(zh_error_left(err))}"


def test_errors_keep_their_english_by_default(capsys):
    # the same mechanism in English: the catalogue's English text, as before (robust and CLI tests pin more)
    code, _, err = run(capsys, "2x2", "--mask", "1 2; 1 1")
    assert code == 2 and "--mask: '2' at row 0, column 1 is not a mask entry; use 1/0, true/false or ■/⬚" in err
    code, _, err = run(capsys, "2x2", "--format", "xml")
    assert code == 2 and "invalid choice: 'xml'" in err


HELP_ALLOWED = {"attnlab", "explain", "heatmap", "usage", "SmolLM2", "MiniLM", "smollm2", "minilm", "weights",
                "last-row", "mask", "growth", "rich", "text", "markdown", "json", "auto", "allow", "block", "right",
                "left", "en", "zh", "is_causal", "ATTNLAB_LANG", "softmax-then-mask", "no-scale", "sqrt-d-model",
                "query-axis", "inverted-mask", "Attention", "SDPA", "attention_backward", "true", "false", "JAX",
                "B", "C", "G", "N", "P", "S", "T", "dL", "dO", "PNG", "SVG", "PDF", "JSON"}  # fmt: skip
#: (typed values, choices, metavars, library and format names)


def help_english_left(text: str) -> set[str]:
    text = re.sub(r"-\n\s+", "-", text)  # argparse wraps lines after a hyphen: dot-\n product
    text = re.sub(r"--[\w-]+|-[hqkvo]\b|\{[^}]*\}|'[^']*'|\w*\.(json|csv|npy|npz|png|svg|pdf)\b", " ", text)
    return english_left(text) - HELP_ALLOWED


@pytest.mark.parametrize("command", ["explain", "heatmap"])
@pytest.mark.parametrize("how", ["--lang", "ATTNLAB_LANG"])
def test_help_in_chinese_leaves_no_english(capsys, monkeypatch, command, how):
    if how == "ATTNLAB_LANG":
        monkeypatch.setenv("ATTNLAB_LANG", "zh")
        code = main([command, "--help"])
    else:
        monkeypatch.delenv("ATTNLAB_LANG", raising=False)
        code = main([command, "--help", "--lang", "zh"])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("用法：attnlab " + command)
    for words in ("选项", "查询", "键", "值", "因果遮罩", "温度", "显示此帮助信息并退出"):
        assert words in out, words
    assert not help_english_left(out), sorted(help_english_left(out))


def test_lab_help_in_chinese(capsys, monkeypatch):
    monkeypatch.setenv("ATTNLAB_LANG", "zh")
    assert main(["lab", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("用法：attnlab lab") and "在默认浏览器中打开网址" in out
    left = help_english_left(out) - {"lab", "marimo", "notebook", "attnlab_lab", "py"}  # the command, the file
    assert not left, sorted(left)


def test_help_stays_english_by_default(capsys, monkeypatch):
    monkeypatch.delenv("ATTNLAB_LANG", raising=False)
    assert main(["explain", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: attnlab explain") and "queries [n_q, d_k]" in out and "查询" not in out


def test_attnlab_lang_sets_the_default_language(capsys, monkeypatch):
    monkeypatch.setenv("ATTNLAB_LANG", "zh")
    code, out, _ = run(capsys, "2x2", "--format", "text")
    assert code == 0 and "权重（softmax）" in out
    code, out, _ = run(capsys, "2x2", "--format", "text", "--lang", "en")
    assert code == 0 and "Weights (softmax)" in out


def test_one_catalogue_without_repeated_strings():
    import attnlab.i18n as I

    assert tr("label.weights", "zh") == I.tr("label.weights", "zh")
    from attnlab.lab import i18n as lab_i18n  # noqa: F401  (registers the lab's table)

    pairs = [(e["en"], e["zh"]) for e in I.MESSAGES.values()]
    repeated = {p for p in pairs if pairs.count(p) > 1}
    assert repeated <= {("000, self-test", "000，自测")}, repeated  # two items of the same article passage
    with pytest.raises(KeyError):
        I.register("test", {"label.weights": ("weights", "重量")})


def test_learn_md_quotes_the_chinese_error_it_shows(capsys):
    doc = DOC.read_text(encoding="utf-8")
    quoted = "--mask：第 0 行第 1 列的 '2' 不是遮罩项"
    assert '`attnlab explain 2x2 --mask "1 2; 1 1" --lang zh`' in doc and quoted in doc
    code, _, err = run(capsys, "2x2", "--mask", "1 2; 1 1", "--lang", "zh")
    assert code == 2 and quoted in err
