"""FlashAttention's online softmax by hand (``explain_online``, ``attnlab explain --tiled``): the running max, sum
and accumulator against an independent dense computation, the articles' numbers, masked rows, errors and the CLI."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference import reference_attention

from attnlab.cli import main
from attnlab.errors import MaskedRowError, OptionError
from attnlab.explain import Setup, explain_online, setup_from_example, to_dict, to_markdown, to_text


def test_two_by_two_blocks_of_one_key():
    """Article 001 §5: Q = K = I, V = [[10, 0], [0, 20]]. Query 1 meets its larger score in the second block."""
    e = explain_online(setup_from_example("2x2"), 1)
    assert [s.key for s in e.steps] == ["blocks", "block0", "block1", "normalize"]
    b0, b1 = e.step("block0"), e.step("block1")
    r = 1 / np.sqrt(2)
    np.testing.assert_allclose(b0.extra[0][1].ravel(), [r, 0])  # m after block 0
    np.testing.assert_allclose(b0.extra[1][1].ravel(), [1, 1])  # l
    np.testing.assert_allclose(b0.extra[2][1], [[10, 0], [10, 0]])  # acc
    alpha = np.exp(-r)
    np.testing.assert_allclose(b1.extra[0][1].ravel(), [r, r])
    np.testing.assert_allclose(b1.extra[1][1].ravel(), [1 + alpha, 1 + alpha])
    np.testing.assert_allclose(b1.extra[2][1], [[10, 20 * alpha], [10 * alpha, 20]])
    assert "α = exp(0 - 0.7071) = 0.4931" in b1.lines[1]
    assert "α < 1 on q1" in b1.note and "First block" in b0.note
    np.testing.assert_allclose(e.output, [[6.6976, 6.6048], [3.3024, 13.3952]], atol=1e-4)
    assert e.step("normalize").lines[1].startswith("o[q1] = [4.9307, 20] / 1.4931 = [3.3024, 13.3952]")
    one = explain_online(setup_from_example("2x2"), 5)  # a block larger than n_k: one block, the dense softmax
    assert [s.key for s in one.steps] == ["blocks", "block0", "normalize"]
    np.testing.assert_allclose(one.output, e.output, atol=1e-15)


def test_causal_blocks_note_the_keys_a_query_cannot_see():
    e = explain_online(setup_from_example("causal-4"), 2)
    b1 = e.step("block1")
    assert "q0, q1 may see no key of this block" in b1.note
    assert np.all(b1.matrix[:2] == 0)  # P = 0 for the rows that see nothing in the block
    np.testing.assert_allclose(e.output, e.trace.output, atol=1e-15)


@given(
    n_q=st.integers(1, 6),
    n_k=st.integers(1, 7),
    block_k=st.integers(1, 8),
    causal=st.booleans(),
    temperature=st.sampled_from([0.5, 1.0, 3.0]),
    shift=st.sampled_from([0.0, 10.0]),
    seed=st.integers(0, 2**16),
)
def test_online_equals_an_independent_dense_reference(n_q, n_k, block_k, causal, temperature, shift, seed):
    rng = np.random.default_rng(seed)
    if causal:
        n_q = n_k
    q, k, v = rng.normal(size=(n_q, 3)) * 3, rng.normal(size=(n_k, 3)) * 3, rng.normal(size=(n_k, 2))
    mask = rng.random((n_q, n_k)) < 0.7
    setup = Setup(q, k, v, mask=mask, causal=causal, temperature=temperature, shift=shift, masked_rows="zero")
    e = explain_online(setup, block_k)
    allowed = mask & (np.tril(np.ones((n_q, n_k), bool)) if causal else True)
    ref, _ = reference_attention(q, k, v, allowed, bias=np.full((n_q, n_k), shift), temperature=temperature)
    empty = ~allowed.any(axis=1)
    np.testing.assert_allclose(e.output[~empty], ref[~empty], atol=1e-12, rtol=0)
    assert np.all(e.output[empty] == 0)
    assert len([s for s in e.steps if s.key.startswith("block") and s.key != "blocks"]) == -(-n_k // block_k)
    last = [s for s in e.steps if s.key.startswith("block") and s.key != "blocks"][-1]
    m, l_sum = last.extra[0][1].ravel(), last.extra[1][1].ravel()
    logits = np.where(allowed, (q @ k.T / np.sqrt(3) + shift) / temperature, -np.inf)
    full = ~empty
    np.testing.assert_allclose(m[full], logits[full].max(axis=1), atol=1e-12)
    np.testing.assert_allclose(l_sum[full], np.exp(logits[full] - m[full, None]).sum(axis=1), rtol=1e-12)


def test_masked_rows_follow_the_policy():
    q = k = np.eye(3)
    v = np.arange(6.0).reshape(3, 2)
    mask = np.array([[True, True, False], [False, False, False], [True, False, True]])
    with pytest.raises(MaskedRowError):
        explain_online(Setup(q, k, v, mask=mask), 2)
    z = explain_online(Setup(q, k, v, mask=mask, masked_rows="zero"), 2)
    assert np.all(z.output[1] == 0)
    assert "no legal key yet" in z.step("block0").lines[1]
    assert z.step("normalize").lines[1].startswith("o[q1]: no legal key in any block (masked_rows='zero'")
    nan = explain_online(Setup(q, k, v, mask=mask, masked_rows="nan"), 2)
    assert np.all(np.isnan(nan.output[1])) and not np.isnan(nan.output[[0, 2]]).any()


def test_bad_block_size_names_the_argument():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(OptionError, match=rf"^block_k: expected an int >= 1, got {re.escape(repr(bad))}$"):
            explain_online(setup_from_example("2x2"), bad)


def test_renderers():
    e = explain_online(setup_from_example("2x2-causal"), 1)
    text = to_text(e)
    assert "FlashAttention's online softmax, key blocks of 1" in text and "Normalize once, at the end" in text
    md = to_markdown(e)
    assert "## 2. Key block 0: k0..k0" in md
    d = json.loads(json.dumps(to_dict(e)))
    assert [s["key"] for s in d["steps"]] == ["blocks", "block0", "block1", "normalize"]
    assert d["output"][1] == pytest.approx([3.302, 13.395], abs=1e-3)


def test_cli(capsys):
    assert main(["explain", "2x2", "--tiled", "1", "--format", "text"]) == 0
    out = capsys.readouterr().out
    assert "3. Key block 1: k1..k1" in out and "[3.3024, 13.3952]" in out
    assert (
        main(["explain", "--q", "1,0;0,1", "--k", "1,0;0,1", "--v", "10,0;0,20", "--tiled", "2", "--format", "json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["steps"][1]["key"] == "block0"
    assert main(["explain", "weighted-average", "--tiled", "1"]) == 2
    assert "--tiled needs Q and K" in capsys.readouterr().err
    assert main(["explain", "2x2", "--tiled", "1", "--mistake", "no-scale"]) == 2
    assert "--tiled and --mistake: give one of them" in capsys.readouterr().err
    assert main(["explain", "2x2", "--tiled", "0"]) == 2
    assert capsys.readouterr().err == "attnlab explain: error: --tiled: expected an int >= 1, got 0\n"
