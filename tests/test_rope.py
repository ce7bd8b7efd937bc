"""Rotary position embeddings: HF Llama's convention, llama.cpp's interleaved one, and §16 (positions)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import LlamaConfig as HFLlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

import attnlab
from attnlab.core.rope import (
    apply_rope,
    apply_rope_interleaved,
    half_to_interleaved,
    interleaved_to_half,
    rope_frequencies,
    rope_tables,
    rotate_half,
)
from attnlab.errors import DTypeError, OptionError, ShapeError
from attnlab.explain.permutation import permutation_demo


def _hf_rope(q, k, positions, base):
    d = q.shape[-1]
    cfg = HFLlamaConfig(
        hidden_size=d * q.shape[1],
        num_attention_heads=q.shape[1],
        head_dim=d,
        rope_parameters={"rope_type": "default", "rope_theta": base},
    )
    emb = LlamaRotaryEmbedding(cfg)
    qt, kt = torch.tensor(q), torch.tensor(k)
    cos, sin = emb(qt, torch.tensor(positions)[None])
    qr, kr = apply_rotary_pos_emb(qt, kt, cos, sin)
    return qr.numpy(), kr.numpy(), cos.numpy()[0], sin.numpy()[0]


@pytest.mark.parametrize(("n", "d", "base"), [(7, 64, 100000.0), (1, 8, 10000.0), (33, 16, 500.0)])
def test_matches_hugging_face_llama_rotary(n, d, base):
    rng = np.random.default_rng(n)
    q = rng.standard_normal((2, 3, n, d)).astype(np.float32)
    k = rng.standard_normal((2, 3, n, d)).astype(np.float32)
    pos = np.arange(5, 5 + n)
    qr, kr, cos, sin = _hf_rope(q, k, pos, base)
    t = rope_tables(pos, d, base=base)
    # HF computes the angles in float32; we compute them in float64 and round once.
    np.testing.assert_allclose(t.cos, cos, atol=3e-6)
    np.testing.assert_allclose(t.sin, sin, atol=3e-6)
    np.testing.assert_allclose(apply_rope(q, t), qr, atol=2e-5)
    np.testing.assert_allclose(apply_rope(k, t), kr, atol=2e-5)


def test_rotate_half_and_frequencies():
    assert rotate_half(np.array([1.0, 2.0, 3.0, 4.0])).tolist() == [-3.0, -4.0, 1.0, 2.0]
    np.testing.assert_allclose(rope_frequencies(8, base=10000.0), [1.0, 0.1, 0.01, 0.001])
    t = rope_tables([0], 8)
    assert t.cos.tolist() == [[1.0] * 8] and t.sin.tolist() == [[0.0] * 8]


@given(
    i=st.integers(0, 500),
    j=st.integers(0, 500),
    shift=st.integers(0, 500),
    seed=st.integers(0, 2**16),
)
def test_scores_depend_only_on_distance_and_norms_are_kept(i, j, shift, seed):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((1, 16)), rng.standard_normal((1, 16))

    def rot(x, p):
        return apply_rope(x, rope_tables([p], 16, dtype=np.float64))

    s1 = (rot(q, i) @ rot(k, j).T).item()
    s2 = (rot(q, i + shift) @ rot(k, j + shift).T).item()
    assert s1 == pytest.approx(s2, rel=1e-9, abs=1e-9)
    assert np.linalg.norm(rot(q, i)) == pytest.approx(np.linalg.norm(q), rel=1e-12)


@given(heads=st.integers(1, 4), half=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_gguf_interleaved_weights_give_the_same_rotated_vectors(heads, half, seed):
    """llama.cpp: interleaved RoPE on permuted W rows == HF: rotate_half RoPE on the original rows."""
    d = 2 * half
    rng = np.random.default_rng(seed)
    w_hf = rng.standard_normal((heads * d, 5))  # [h*d, d_in], HF (rotate_half) order
    w_gguf = half_to_interleaved(w_hf, heads)  # what llama.cpp's converter stores
    np.testing.assert_array_equal(interleaved_to_half(w_gguf, heads), w_hf)
    x = rng.standard_normal((6, 5))
    t = rope_tables(np.arange(6), d, dtype=np.float64)
    y_hf = apply_rope((x @ w_hf.T).reshape(6, heads, d).swapaxes(0, 1), t)  # [h, n, d]
    y_cpp = apply_rope_interleaved((x @ w_gguf.T).reshape(6, heads, d).swapaxes(0, 1), t)
    # same vectors up to the (fixed) order of dims inside each head: scores q·k are identical
    np.testing.assert_allclose(
        interleaved_to_half(y_cpp.swapaxes(0, 1).reshape(6, -1).T, heads).T,
        y_hf.swapaxes(0, 1).reshape(6, -1),
        atol=1e-12,
    )


def test_per_sequence_positions():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 8))
    pos = np.array([[0, 1, 2, 3], [10, 11, 12, 13]])
    y = apply_rope(x, rope_tables(pos, 8, dtype=np.float64))
    for b in range(2):
        np.testing.assert_allclose(y[b], apply_rope(x[b], rope_tables(pos[b], 8, dtype=np.float64)), atol=1e-15)


def test_inputs_not_modified():
    x = np.ones((1, 2, 3, 4))
    before = x.copy()
    apply_rope(x, rope_tables([0, 1, 2], 4))
    apply_rope_interleaved(x, rope_tables([0, 1, 2], 4))
    np.testing.assert_array_equal(x, before)


def test_errors_name_the_argument():
    with pytest.raises(ShapeError, match=r"head_dim: expected a positive even integer.*got 7"):
        rope_tables([0, 1], 7)
    with pytest.raises(DTypeError, match=r"positions: expected integers, got dtype float64"):
        rope_tables(np.array([0.5]), 8)
    with pytest.raises(ShapeError, match=r"positions: expected non-negative positions, got minimum -1"):
        rope_tables([-1, 0], 8)
    with pytest.raises(ShapeError, match=r"tables: cos/sin have shape \(3, 8\).*x has n=2, d=8"):
        apply_rope(np.zeros((2, 8)), rope_tables([0, 1, 2], 8))
    with pytest.raises(ShapeError, match=r"w: dim 0 of shape \(6, 2\) must be num_heads=2 times an even head_dim"):
        interleaved_to_half(np.zeros((6, 2)), 2)
    with pytest.raises(OptionError, match=r"^base: expected a finite number > 1, got 1.0$"):
        rope_frequencies(8, base=1.0)


# ---------------------------------------------------------------------------------------------------------------
# §16: permutation equivariance


@given(n=st.integers(2, 12), seed=st.integers(0, 2**16))
def test_attention_without_positions_is_permutation_equivariant(n, seed):
    """Core attention (no mask): permuting tokens (queries with keys and values) permutes the outputs."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((n, 8)) for _ in range(3))
    p = rng.permutation(n)
    out = attnlab.scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(attnlab.scaled_dot_product_attention(q[p], k[p], v[p]), out[p], atol=1e-12)


def test_permutation_demo_rope_breaks_equivariance():
    r = permutation_demo(n=7, d=16, seed=3)
    assert sorted(r.perm) == list(range(7)) and r.perm != tuple(range(7))
    assert r.without_rope < 1e-12
    assert r.with_rope > 1e-2
    text = r.text()
    assert "Without positions" in text and "With RoPE" in text and "§16" in text
    with pytest.raises(OptionError, match=r"perm: expected a permutation of range\(3\), got \[0, 0, 1\]"):
        permutation_demo(n=3, perm=[0, 0, 1])
    with pytest.raises(OptionError, match=r"n: expected an int >= 2"):
        permutation_demo(n=1)


def test_explain_positions_shows_the_permutation_experiment(capsys):
    from attnlab.cli import main

    assert main(["explain", "--positions"]) == 0
    out = capsys.readouterr().out
    without = float(out.split("Without positions: max |attn(P x) - P attn(x)| = ")[1].split()[0])
    with_rope = float(out.split("With RoPE:         max |attn(P x) - P attn(x)| = ")[1].split()[0])
    assert without < 1e-12 < 1e-2 < with_rope
