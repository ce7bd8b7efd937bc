"""The tiled backward (FlashAttention-2) against the float64 analytic backward and PyTorch autograd."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import attnlab
from attnlab import masks
from attnlab.core.gradients import attention_backward
from attnlab.errors import DTypeError, MaskedRowError, NonFiniteError, ShapeError
from attnlab.kernels.tiled import flash_attention, flash_attention_backward


def _grads_ref(q, k, v, d_o, allowed=None, **kw):
    t = attnlab.attention_trace(q, k, v, allowed, masked_rows="zero", **kw)
    g = attention_backward(t, d_o)
    return g.dq, g.dk, g.dv


def _check_rule(grads, q, k, v, d_o, allowed=None, factor=3.0, floor=1e-6, **kw):
    """|tiled - analytic float64| <= 3 · |analytic in the same precision - analytic float64| + 1e-6, per gradient."""
    ref = _grads_ref(*(np.asarray(x, np.float64) for x in (q, k, v, d_o)), allowed, **kw)
    naive = _grads_ref(q, k, v, d_o, allowed, **kw)
    for name, fast, r, n in zip(("dq", "dk", "dv"), grads, ref, naive, strict=True):
        assert fast.shape == r.shape, name
        err_fast = np.abs(np.asarray(fast, np.float64) - r).max()
        err_naive = np.abs(np.asarray(n, np.float64) - r).max()
        assert err_fast <= factor * err_naive + floor, (name, err_fast, err_naive)


def _run(q, k, v, d_o, **kw):
    f = flash_attention(q, k, v, **kw)
    g = flash_attention_backward(f, d_o)
    return g.dq, g.dk, g.dv


@pytest.mark.parametrize(
    ("n_q", "n_k", "block_q", "block_k"),
    [
        (1, 1, 1, 1),
        (97, 97, 16, 20),
        (97, 97, 256, 512),
        (200, 130, 64, 32),
        (130, 200, 50, 70),
        (513, 513, 128, 256),
        (1025, 1023, 256, 512),
    ],
)
@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
@pytest.mark.parametrize("exp", ["fused", "exp2", "exp"])
def test_backward_rule_float32(n_q, n_k, block_q, block_k, causal, exp, kernel_config):
    kernel_config(exp=exp)  # every exponential the kernel may pick
    rng = np.random.default_rng(n_q + n_k + block_q)
    q = rng.standard_normal((2, 2, n_q, 16)).astype(np.float32)
    k = rng.standard_normal((2, 2, n_k, 16)).astype(np.float32)
    v = rng.standard_normal((2, 2, n_k, 12)).astype(np.float32)
    d_o = rng.standard_normal((2, 2, n_q, 12)).astype(np.float32)
    allowed = None if not causal else masks.causal(n_q, n_k, align=causal)
    grads = _run(q, k, v, d_o, causal=causal, masked_rows="zero", block_q=block_q, block_k=block_k)
    assert all(g.dtype == np.float32 for g in grads)
    _check_rule(grads, q, k, v, d_o, allowed)


def test_backward_matches_torch_autograd_float64():
    rng = np.random.default_rng(1)
    q, k, v, d_o = (rng.standard_normal((2, 3, 77, 8)) for _ in range(4))
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    out.backward(torch.tensor(d_o))
    dq, dk, dv = _run(q, k, v, d_o, causal=True, block_q=16, block_k=24, num_threads=2)
    for mine, t in ((dq, tq), (dk, tk), (dv, tv)):
        np.testing.assert_allclose(mine, t.grad.numpy(), atol=1e-10)


def test_backward_masks_gqa_and_empty_rows():
    rng = np.random.default_rng(2)
    B, h, h_kv, n_q, n_k = 2, 4, 2, 40, 60
    q = rng.standard_normal((B, h, n_q, 8))
    k, v = rng.standard_normal((B, h_kv, n_k, 8)), rng.standard_normal((B, h_kv, n_k, 8))
    d_o = rng.standard_normal((B, h, n_q, 8))
    m = rng.random((B, 1, n_q, n_k)) < 0.7
    ids = np.repeat([0, 1, 2], [10, 20, 30])
    lengths = [60, 35]
    kw = dict(mask=m, causal="bottom_right", window=(25, None), key_lengths=lengths, block_q=8, block_k=16)
    allowed = (
        m
        & masks.causal(n_q, n_k, align="bottom_right")
        & masks.window(n_q, n_k, left=25, right=None, align="bottom_right")
        & masks.key_padding(lengths, n_k)
    )
    dq, dk, dv = _run(q, k, v, d_o, masked_rows="zero", **kw)
    rq, rk, rv = _grads_ref(q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1), d_o, allowed)
    np.testing.assert_allclose(dq, rq, atol=1e-12)
    np.testing.assert_allclose(dk, rk.reshape(B, h_kv, 2, n_k, 8).sum(2), atol=1e-12)
    np.testing.assert_allclose(dv, rv.reshape(B, h_kv, 2, n_k, 8).sum(2), atol=1e-12)
    # segments on self-attention, 3 threads over a single head (keys split between tasks)
    qs, ks, vs, ds = (rng.standard_normal((1, 60, 8)) for _ in range(4))
    got = _run(qs, ks, vs, ds, segments=ids, causal=True, block_q=8, block_k=8, num_threads=3)
    ref = _grads_ref(qs, ks, vs, ds, masks.segments(ids) & masks.causal(60))
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-12)
    # fully masked rows: zero gradient under "zero", an error otherwise
    f = flash_attention(qs, ks, vs, key_lengths=[0], masked_rows="zero")
    g = flash_attention_backward(f, ds)
    assert not g.dq.any() and not g.dk.any() and not g.dv.any()
    raising = dataclasses.replace(f, options=dataclasses.replace(f.options, masked_rows="raise"))
    with pytest.raises(MaskedRowError, match="only under masked_rows='zero'"):
        flash_attention_backward(raising, ds)


def test_backward_broadcast_inputs_sum_back():
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((3, 1, 20, 4)), rng.standard_normal((1, 2, 25, 4)), rng.standard_normal((25, 4))
    d_o = rng.standard_normal((3, 2, 20, 4))
    dq, dk, dv = _run(q, k, v, d_o, block_q=6, block_k=7)
    rq, rk, rv = _grads_ref(q, k, v, d_o)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    for a, b in ((dq, rq), (dk, rk), (dv, rv)):
        np.testing.assert_allclose(a, b, atol=1e-12)


def test_backward_errors():
    q = np.zeros((2, 10, 8))
    f = flash_attention(q, q, q)
    with pytest.raises(ShapeError, match=r"d_out: shape \(2, 10, 7\), expected \(2, 10, 8\)"):
        flash_attention_backward(f, np.zeros((2, 10, 7)))
    with pytest.raises(ShapeError, match=r"lse: shape \(2, 9\), expected \(2, 10\)"):
        flash_attention_backward(dataclasses.replace(f, lse=f.lse[:, :9]), q)
    with pytest.raises(NonFiniteError, match="lse: holds NaN"):
        flash_attention_backward(dataclasses.replace(f, lse=np.full((2, 10), np.nan)), q)
    with pytest.raises(DTypeError, match=r"^result: expected the FlashResult flash_attention returned .* got ndarray"):
        flash_attention_backward(q, q)  # the old (q, k, v, output, lse, d_out) spelling is gone (0.2.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'causal'"):
        flash_attention_backward(f, q, causal=True)  # the result holds the forward's options
    with pytest.raises(TypeError, match="positional argument"):
        flash_attention_backward(q, q, q)


@given(
    n_q=st.integers(1, 40),
    n_k=st.integers(1, 40),
    block_q=st.integers(1, 50),
    block_k=st.integers(1, 50),
    causal=st.sampled_from([False, "top_left", "bottom_right"]),
    threads=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_property_backward_equals_dense(n_q, n_k, block_q, block_k, causal, threads, seed):
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((2, n_q, 4)), rng.standard_normal((2, n_k, 4)), rng.standard_normal((2, n_k, 3))
    d_o = rng.standard_normal((2, n_q, 3))
    allowed = masks.causal(n_q, n_k, align=causal) if causal else None
    got = _run(q, k, v, d_o, causal=causal, masked_rows="zero", block_q=block_q, block_k=block_k, num_threads=threads)
    for a, b in zip(got, _grads_ref(q, k, v, d_o, allowed), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-11)
