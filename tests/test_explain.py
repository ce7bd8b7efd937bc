"""``attnlab explain``: each named example against the articles' numbers, the mistakes against independent
references, options, renderers and the CLI (``main([...])``, fixed width, no colour)."""

from __future__ import annotations

import io
import json
import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from reference import reference_attention

from attnlab import masks
from attnlab.cli import main
from attnlab.errors import MaskedRowError, MaskError, OptionError, ShapeError
from attnlab.explain import (
    MISTAKES,
    compare,
    explain,
    explain_example,
    print_rich,
    setup_from_example,
    to_dict,
    to_markdown,
    to_text,
)
from attnlab.explain.fmt import num

I2 = [[1, 0], [0, 1]]
V2 = [[10, 0], [0, 20]]


def numbers(line: str) -> list[float]:
    """Every number in a line of text (``-inf`` included)."""
    return [float(x) for x in re.findall(r"-?inf|-?\d+(?:\.\d+)?(?:e-?\d+)?", line)]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["explain", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def block(text: str, title_start: str) -> list[str]:
    """The lines of the step whose heading starts with ``title_start`` (up to the blank line)."""
    lines = text.splitlines()
    i = next(n for n, ln in enumerate(lines) if re.match(rf"\d+\. {re.escape(title_start)}", ln))
    out = []
    for ln in lines[i:]:
        if not ln.strip():
            break
        out.append(ln)
    return out


# ---------------------------------------------------------------------------------------------------------------
# the articles' numbers, through the CLI text


def test_weighted_average_is_6_5_and_3_5(capsys):
    code, out, _ = run_cli(capsys, "weighted-average", "--format", "text")
    assert code == 0
    assert "   o[q0] = 0.6×[10, 0] + 0.3×[0, 10] + 0.1×[5, 5] = [6.5, 3.5]" in out.splitlines()


def test_one_query_row_by_hand_matches_article_000(capsys):
    code, out, _ = run_cli(capsys, "one-query", "--format", "text")
    assert code == 0
    scale = block(out, "Scale")
    np.testing.assert_allclose(numbers(scale[2])[-2:], [0.707, 0.0], atol=5e-4)
    exp = block(out, "Exponentials")
    raw = next(ln for ln in exp if "without subtracting the max" in ln)
    np.testing.assert_allclose(numbers(raw)[:2], [2.028, 1.0], atol=5e-4)  # the article's [2.028, 1]
    weights = block(out, "Weights")
    np.testing.assert_allclose(numbers(weights[2])[-2:], [0.670, 0.330], atol=5e-4)
    assert "o[q0] = 0.6698×[10, 0] + 0.3302×[0, 20] = [6.6976, 6.6048]" in out
    np.testing.assert_allclose(numbers(block(out, "Output")[2])[-2:], [6.70, 6.60], atol=5e-3)


def test_two_by_two_matches_article_001_section_5(capsys):
    code, out, _ = run_cli(capsys, "2x2", "--format", "text", "--width", "100")
    assert code == 0
    assert block(out, "Scores")[1:4] == ["       k0  k1", "   q0   1   0", "   q1   0   1"]
    assert block(out, "Scale")[1:4] == ["           k0      k1", "   q0  0.7071       0", "   q1       0  0.7071"]
    assert block(out, "Weights")[1:4] == [
        "           k0      k1",
        "   q0  0.6698  0.3302",
        "   q1  0.3302  0.6698",
    ]
    o = block(out, "Output")
    # The article prints 6.698, 6.604 / 3.302, 13.396 (it multiplies by the weights rounded to 4 places).
    np.testing.assert_allclose([numbers(o[2])[1:], numbers(o[3])[1:]], [[6.698, 6.604], [3.302, 13.396]], atol=1e-3)


def test_two_by_two_causal_matches_article_001_section_7_3(capsys):
    code, out, _ = run_cli(capsys, "2x2-causal", "--format", "text")
    assert code == 0
    mask = block(out, "Mask")
    assert mask[1:4] == ["           k0      k1", "   q0  0.7071    -inf", "   q1       0  0.7071"]
    assert mask[4:6] == ["   ■ ⬚", "   ■ ■"]
    w = block(out, "Weights")
    assert w[2:4] == ["   q0       1       0", "   q1  0.3302  0.6698"]
    o = block(out, "Output")
    np.testing.assert_allclose([numbers(o[2])[1:], numbers(o[3])[1:]], [[10, 0], [3.302, 13.396]], atol=1e-3)


def test_causal_4_row_i_has_i_plus_1_legal_keys(capsys):
    code, out, _ = run_cli(capsys, "causal-4", "--format", "text")
    assert code == 0
    mask = block(out, "Mask")
    assert mask[6:10] == ["   ■ ⬚ ⬚ ⬚", "   ■ ■ ⬚ ⬚", "   ■ ■ ■ ⬚", "   ■ ■ ■ ■"]
    e = explain_example("causal-4")
    w = e.weights
    assert [int((row > 0).sum()) for row in w] == [1, 2, 3, 4]
    np.testing.assert_array_equal(w[0], [1, 0, 0, 0])
    ex = e.setup
    _, ref = reference_attention(ex.q, ex.k, ex.v, allowed=masks.causal(4))
    np.testing.assert_allclose(w, ref, atol=1e-12)


def test_saturation_matches_article_001_section_4_2(capsys):
    code, out, _ = run_cli(capsys, "saturation", "--format", "text")
    assert code == 0
    w = block(out, "Weights")
    assert numbers(w[2])[-2:] == [0.2689, 0.7311]  # the article: [0.269, 0.731]
    assert numbers(w[3])[-2:] == [0.000045, 0.999955]  # the article: [0.000045, 0.999955]


def test_softmax_then_mask_row_sum_is_0_269(capsys):
    code, out, _ = run_cli(capsys, "mask-order", "--mistake", "softmax-then-mask", "--format", "text")
    assert code == 0
    assert block(out, "Weights")[2] == "   q0   1   0"  # mask first: [1, 0]
    lines = out.splitlines()
    i = lines.index("Mistake softmax-then-mask: softmax first, then zero the masked weights (no renormalisation)")
    assert lines[i + 5 : i + 7] == ["             k0  k1", "         q0  0.2689   0"] or "0.2689" in lines[i + 6]
    sums = next(ln for ln in lines[i:] if ln.strip().startswith("row sums"))
    assert math.isclose(numbers(sums)[-1], 0.269, abs_tol=5e-4)


# ---------------------------------------------------------------------------------------------------------------
# the mistakes, each against an independent reference


@pytest.mark.parametrize("name", ["2x2-causal", "causal-4", "mask-order"])
def test_mistakes_match_independent_references(name):
    s = setup_from_example(name)
    allowed = s.user_mask() if s.user_mask() is not None else np.ones((s.n_q, s.n_k), bool)
    if s.causal:
        allowed = allowed & masks.causal(s.n_q)
    scale = s.scale
    _, right = reference_attention(s.q, s.k, s.v, allowed=allowed, scale=scale)

    m = compare(s, "softmax-then-mask")
    _, free = reference_attention(s.q, s.k, s.v, scale=scale)
    np.testing.assert_allclose(m.right_weights, right, atol=1e-12)
    np.testing.assert_allclose(m.wrong_weights, free * allowed, atol=1e-12)
    assert (m.wrong_row_sums[~allowed.all(-1)] < 1).all()

    m = compare(s, "no-scale")
    np.testing.assert_allclose(m.wrong_weights, reference_attention(s.q, s.k, s.v, allowed=allowed, scale=1.0)[1])

    m = compare(s, "sqrt-d-model", heads=8)
    d_model = 8 * s.d_k
    ref = reference_attention(s.q, s.k, s.v, allowed=allowed, scale=1 / math.sqrt(d_model))[1]
    np.testing.assert_allclose(m.wrong_weights, ref, atol=1e-12)
    assert f"sqrt({d_model})" in m.explanation

    m = compare(s, "query-axis")
    cols = allowed.any(axis=0)
    np.testing.assert_allclose(m.wrong_weights.sum(axis=0)[cols], 1.0)
    np.testing.assert_allclose(m.wrong_output, m.wrong_weights @ np.asarray(s.v, float))

    m = compare(s, "inverted-mask")
    _, ref = reference_attention(s.q, s.k, s.v, allowed=~allowed, scale=scale)
    np.testing.assert_allclose(m.wrong_weights, ref, atol=1e-12)  # NaN rows where nothing is left
    np.testing.assert_array_equal(m.wrong_allowed, ~allowed)


def test_inverted_causal_mask_leaks_the_future_and_empties_the_last_row():
    m = compare(setup_from_example("causal-4"), "inverted-mask")
    assert np.isnan(m.wrong_weights[3]).all()
    assert m.wrong_weights[0, 1:].sum() == pytest.approx(1.0)  # row 0 now reads only the future
    assert "leak" in m.explanation and "NaN" in m.explanation


def test_mistake_names_and_errors():
    assert set(MISTAKES) == {"softmax-then-mask", "no-scale", "sqrt-d-model", "query-axis", "inverted-mask"}
    with pytest.raises(KeyError, match="no mistake 'typo'; choose one of softmax-then-mask"):
        compare(setup_from_example("2x2"), "typo")
    with pytest.raises(ValueError, match="heads: expected an int >= 1, got 0"):
        compare(setup_from_example("2x2"), "sqrt-d-model", heads=0)
    m = compare(setup_from_example("2x2"), "softmax-then-mask")
    assert "Nothing is masked here" in m.explanation


def test_mistake_all_through_cli(capsys):
    code, out, _ = run_cli(capsys, "causal-4", "--mistake", "all", "--format", "text")
    assert code == 0
    for name in MISTAKES:
        assert f"Mistake {name}: {MISTAKES[name]}" in out
    code, _, err = run_cli(capsys, "saturation", "--mistake", "no-scale")
    assert code == 2 and "--mistake needs Q and K" in err


# ---------------------------------------------------------------------------------------------------------------
# options against the reference


Q = np.array([[1.0, 2], [0, 1], [-1, 0.5]])
K = np.array([[0.5, 1], [2, 0], [1, 1]])
V = np.array([[1.0, 0, 2], [0, 1, 0], [3, 3, 3]])


@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("causal", [False, True])
def test_explain_matches_reference_with_options(temperature, causal):
    e = explain(Q, K, V, causal=causal, temperature=temperature, shift=7.0, scale=0.3)
    allowed = masks.causal(3) if causal else None
    out, w = reference_attention(Q, K, V, allowed=allowed, scale=0.3, temperature=temperature, bias=7.0)
    np.testing.assert_allclose(e.weights, w, atol=1e-12)
    np.testing.assert_allclose(e.output, out, atol=1e-12)
    keys = [s.key for s in e.steps]
    assert keys[:4] == ["inputs", "scores", "scale", "shift"]
    assert ("temperature" in keys) == (temperature != 1.0)
    assert ("mask" in keys) == causal


def test_padding_right_and_left():
    e = explain(Q, K, V, padding=2)
    np.testing.assert_array_equal(e.trace.allowed, np.broadcast_to([True, True, False], (3, 3)))
    e = explain(Q, K, V, padding=2, padding_side="left")
    np.testing.assert_array_equal(e.trace.allowed, np.broadcast_to([False, True, True], (3, 3)))
    assert "padding (2 real key(s), padded on the left)" in e.step("mask").note
    with pytest.raises(MaskedRowError):
        explain(Q, K, V, padding=2, padding_side="left", causal=True)
    e = explain(Q, K, V, padding=2, padding_side="left", causal=True, masked_rows="zero")
    np.testing.assert_array_equal(e.weights[0], 0.0)
    assert "Policy 'zero'" in e.notes[0]


@given(
    arrays(np.float64, (3, 2), elements=st.floats(-3, 3)),
    arrays(np.float64, (4, 2), elements=st.floats(-3, 3)),
    st.floats(-50, 50),
)
def test_a_constant_shift_never_changes_the_weights(q, k, c):
    v = np.arange(8.0).reshape(4, 2)
    a = explain(q, k, v).weights
    b = explain(q, k, v, shift=c).weights
    np.testing.assert_allclose(a, b, atol=1e-12)
    np.testing.assert_allclose(b.sum(-1), 1.0)


def test_inputs_are_never_modified():
    q, k, v = Q.copy(), K.copy(), V.copy()
    for a in (q, k, v):
        a.setflags(write=False)
    explain(q, k, v, causal=True, temperature=2)
    np.testing.assert_array_equal(q, Q)


def test_explain_errors_name_the_argument():
    with pytest.raises(ShapeError, match=r"q: explain works on one head, a matrix \[n_q, d_k\]; got shape \(2, 2, 2\)"):
        explain(np.ones((2, 2, 2)), K, V)
    with pytest.raises(ShapeError, match="k: last dim d_k=2 does not match q's d_k=3"):
        explain(np.ones((3, 3)), K, V)
    with pytest.raises(OptionError, match=r"padding: 5 real key positions; expected 0 <= padding <= n_k=3"):
        explain(Q, K, V, padding=5)
    with pytest.raises(MaskError, match="n_q=2 != n_k=3"):
        explain(Q[:2], K, V, causal=True)
    with pytest.raises(ShapeError, match="key_labels: 2 label"):
        explain(Q, K, V, key_labels=["a", "b"])


def test_number_format():
    assert [num(x) for x in (0.70710678, 1.0, -0.0, -np.inf, np.nan, 4.5398e-05, 0.9999546)] == [
        "0.7071",
        "1",
        "0",
        "-inf",
        "nan",
        "0.000045",
        "0.999955",
    ]


# ---------------------------------------------------------------------------------------------------------------
# renderers and CLI


def test_json_markdown_and_rich_renderings(capsys):
    code, out, _ = run_cli(capsys, "2x2-causal", "--format", "json", "--mistake", "query-axis")
    assert code == 0
    d = json.loads(out)
    np.testing.assert_allclose(d["weights"], [[1, 0], [0.330238, 0.669762]], atol=1e-6)
    mask_step = next(s for s in d["steps"] if s["key"] == "mask")
    assert mask_step["matrix"][0][1] == "-inf"
    assert d["mistakes"][0]["name"] == "query-axis"
    md = to_markdown(explain_example("2x2"))
    assert "| q0 | 0.6698 | 0.3302 |" in md and md.startswith("# The 2×2 example")
    from rich.console import Console

    buf = io.StringIO()
    print_rich(
        explain_example("2x2"),
        [compare(setup_from_example("2x2"), "no-scale")],
        console=Console(file=buf, width=100, color_system=None),
    )
    text = buf.getvalue()
    assert "Weights (softmax)" in text and "0.6698" in text and "Mistake no-scale" in text
    assert "\x1b[" not in text
    assert to_dict(explain_example("saturation"))["weights"][1][0] == pytest.approx(4.5397868e-05)


def test_own_matrices_inline_json_csv_npy_and_inputs_file(capsys, tmp_path):
    np.save(tmp_path / "q.npy", np.array(I2, dtype=float))
    (tmp_path / "k.csv").write_text("1,0\n0,1\n")
    (tmp_path / "v.json").write_text("[[10, 0], [0, 20]]")
    code, out, _ = run_cli(
        capsys,
        "--q",
        str(tmp_path / "q.npy"),
        "--k",
        str(tmp_path / "k.csv"),
        "--v",
        str(tmp_path / "v.json"),
        "--causal",
        "--tokens",
        "I am",
        "--format",
        "json",
    )
    assert code == 0
    d = json.loads(out)
    np.testing.assert_allclose(d["output"], [[10, 0], [3.3024, 13.3952]], atol=1e-4)
    assert d["steps"][1]["rows"] == ["I", "am"]
    (tmp_path / "in.json").write_text(json.dumps({"q": I2, "k": I2, "v": V2, "mask": [[1, 0], [1, 1]]}))
    code, out2, _ = run_cli(capsys, "--inputs", str(tmp_path / "in.json"), "--format", "json")
    assert code == 0 and json.loads(out2)["weights"] == d["weights"]
    code, out3, _ = run_cli(
        capsys,
        "--q",
        "[[1, 0], [0, 1]]",
        "--k",
        "1 0; 0 1",
        "--v",
        "10,0;0,20",
        "--mask",
        "0 1; 0 0",
        "--mask-convention",
        "block",
        "--format",
        "json",
    )
    assert code == 0 and json.loads(out3)["weights"] == d["weights"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--q", "1,x", "--k", "1,0", "--v", "1"], "--q: 'x' at row 0, column 1 is not a number"),
        (["--q", "1,0;1", "--k", "1,0", "--v", "1"], "--q: ragged matrix: row 1 has 1 number(s) but row 0 has 2"),
        (["--q", "1,0", "--k", "1,0,0", "--v", "1"], "--k: d_k=3 columns but --q has d_k=2"),
        (["--q", "1,0", "--k", "1,0", "--v", "1;2"], "--v: 2 rows but --k has n_k=1"),
        (["--q", "1,0", "--k", "1,0"], "missing --v"),
        (["nope"], "no worked example 'nope'; choose one of weighted-average"),
        (["2x2", "--q", "1"], "give either an example ('2x2') or your own matrices"),
        (["2x2", "--tokens", "a b c"], "--tokens: 3 token(s) ['a', 'b', 'c'] but there are 2 positions"),
        (["--q", "missing.npy", "--k", "1", "--v", "1"], "--q: no such file 'missing.npy'"),
        (["2x2", "--padding", "0"], "--masked-rows zero or --masked-rows nan"),
    ],
)
def test_cli_errors_are_one_clear_line(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.startswith("attnlab explain: error: ") and message in err
    assert "Traceback" not in err


def test_cli_usage_and_list(capsys):
    code, _, err = run_cli(capsys)
    assert code == 2 and "give a named example" in err
    code, out, _ = run_cli(capsys, "--list")
    assert code == 0
    assert out.splitlines()[0].startswith("weighted-average   Attention is a weighted average")
    assert "mask-order" in out


def test_text_wraps_at_the_given_width():
    text = to_text(explain_example("causal-4"), [compare(setup_from_example("causal-4"), "inverted-mask")], width=60)
    lines = text.splitlines()
    i = next(n for n, ln in enumerate(lines) if ln.startswith("   Why: "))
    why = lines[i:]
    assert len(why) > 3 and max(len(ln) for ln in why) <= 60


def test_learn_md_shows_real_output(capsys):
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "learn.md").read_text(encoding="utf-8")
    blocks = re.findall(r"<!-- output: explain (.+?) -->\n```\n(.*?)```", doc, flags=re.S)
    assert len(blocks) == 3
    for args, shown in blocks:
        code, out, _ = run_cli(capsys, *args.split(), "--format", "text")
        assert code == 0
        assert shown in out, f"docs/learn.md drifted from `attnlab explain {args}`"
