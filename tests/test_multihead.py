"""Multi-head attention: heads, GQA/MQA, init, the layer against a per-head float64 reference and PyTorch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from reference import reference_attention

import attnlab
from attnlab import masks
from attnlab.core.multihead import (
    MultiHeadWeights,
    init_multi_head,
    merge_heads,
    multi_head_attention,
    multi_head_backward,
    repeat_kv,
    split_heads,
    sum_kv_groups,
)
from attnlab.errors import DTypeError, MaskedRowError, OptionError, RangeError, ShapeError


def random_weights(rng, d_model, h, h_kv=None, d=None, d_kv=None, bias=True):
    """Random weights (and random, non-zero biases) so every parameter matters."""
    w = init_multi_head(d_model, h, num_kv_heads=h_kv, head_dim=d, rng=rng, d_kv=d_kv, bias=bias)
    if not bias:
        return w
    b = {n: rng.standard_normal(getattr(w, n).shape) * 0.3 for n in ("b_q", "b_k", "b_v", "b_o")}
    return MultiHeadWeights(w.w_q, w.w_k, w.w_v, w.w_o, **b, num_heads=h, num_kv_heads=w.num_kv_heads)


def reference_mha(x_q, x_kv, w, allowed=None):
    """Float64, head by head, with the kv head of query head r computed as floor(r * h_kv / h)."""
    x_kv = x_q if x_kv is None else x_kv
    h, h_kv, d = w.num_heads, w.num_kv_heads, w.head_dim
    bq = 0 if w.b_q is None else w.b_q
    bk = 0 if w.b_k is None else w.b_k
    bv = 0 if w.b_v is None else w.b_v
    bo = 0 if w.b_o is None else w.b_o
    q_all = x_q @ w.w_q + bq
    k_all = x_kv @ w.w_k + bk
    v_all = x_kv @ w.w_v + bv
    b, n_q = x_q.shape[:2]
    n_k = x_kv.shape[1]
    full = np.ones((b, h, n_q, n_k), bool) if allowed is None else np.broadcast_to(allowed, (b, h, n_q, n_k))
    heads, weights = [], []
    for r in range(h):
        g = (r * h_kv) // h
        q = q_all[..., r * d : (r + 1) * d]
        k = k_all[..., g * d : (g + 1) * d]
        v = v_all[..., g * d : (g + 1) * d]
        o, a = reference_attention(q, k, v, allowed=full[:, r])
        heads.append(o)
        weights.append(a)
    return np.concatenate(heads, axis=-1) @ w.w_o + bo, np.stack(weights, axis=1)


# ---------------------------------------------------------------------------------------------------------------
# heads


def test_split_merge_shapes_and_values():
    x = np.arange(2 * 3 * 8).reshape(2, 3, 8)
    s = split_heads(x, 4)
    assert s.shape == (2, 4, 3, 2)
    assert s[1, 2, 0].tolist() == x[1, 0, 4:6].tolist()
    assert (merge_heads(s) == x).all()


def test_split_heads_error():
    with pytest.raises(ShapeError, match=r"last dim 10 .* not divisible by num_heads=4"):
        split_heads(np.zeros((1, 2, 10)), 4)
    with pytest.raises(OptionError, match="num_heads: expected an int >= 1, got 0"):
        split_heads(np.zeros((1, 2, 8)), 0)
    with pytest.raises(ShapeError, match=r"expected \[..., h, n, d\]"):
        merge_heads(np.zeros((2, 3)))


@given(h_kv=st.integers(1, 4), n_rep=st.integers(1, 4), seed=st.integers(0, 10))
def test_repeat_kv_matches_torch_repeat_interleave(h_kv, n_rep, seed):
    x = np.random.default_rng(seed).standard_normal((2, h_kv, 3, 5))
    expect = torch.from_numpy(x).repeat_interleave(n_rep, dim=1).numpy()
    got = repeat_kv(x, n_rep)
    np.testing.assert_array_equal(got, expect)
    for i in range(h_kv * n_rep):  # query head i reads kv head i // n_rep
        np.testing.assert_array_equal(got[:, i], x[:, i // n_rep])
    np.testing.assert_array_equal(sum_kv_groups(got, h_kv), x * n_rep)


def test_split_merge_torch_tensors():
    t = torch.arange(24.0).reshape(1, 3, 8)
    s = split_heads(t, 2)
    assert isinstance(s, torch.Tensor) and tuple(s.shape) == (1, 2, 3, 4)
    assert torch.equal(merge_heads(s), t)
    assert torch.equal(repeat_kv(s, 3), s.repeat_interleave(3, dim=1))


# ---------------------------------------------------------------------------------------------------------------
# weights and init


def test_init_is_seeded_xavier():
    a = init_multi_head(64, 8, rng=np.random.default_rng(3))
    b = init_multi_head(64, 8, rng=np.random.default_rng(3))
    for name in ("w_q", "w_k", "w_v", "w_o"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    limit = math.sqrt(6 / (64 + 64))
    assert np.abs(a.w_q).max() <= limit
    assert np.abs(a.w_q).max() > 0.9 * limit  # uniform on the whole interval
    assert abs(a.w_q.var() - limit**2 / 3) < 0.1 * limit**2 / 3
    assert (a.b_o == 0).all() and a.head_dim == 8
    c = init_multi_head(64, 8, num_kv_heads=1, rng=np.random.default_rng(0), bias=False)  # MQA
    assert c.w_k.shape == (64, 8) and c.b_q is None and c.n_rep == 8


def test_init_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(ShapeError, match=r"d_model=10 is not divisible by num_heads=4; pass head_dim="):
        init_multi_head(10, 4, rng=rng)
    with pytest.raises(ShapeError, match="num_kv_heads=3 must divide num_heads=4"):
        init_multi_head(8, 4, num_kv_heads=3, rng=rng)
    with pytest.raises(DTypeError, match=r"numpy\.random\.Generator"):
        init_multi_head(8, 4, rng=0)
    w = init_multi_head(10, 4, head_dim=3, rng=rng)  # free head width
    assert w.w_q.shape == (10, 12) and w.w_o.shape == (12, 10)


def test_weights_shape_errors():
    rng = np.random.default_rng(0)
    w = init_multi_head(8, 2, rng=rng)
    with pytest.raises(ShapeError, match=r"w_o: shape \(8, 6\), expected \(8, 8\)"):
        MultiHeadWeights(w.w_q, w.w_k, w.w_v, np.zeros((8, 6)), num_heads=2)
    with pytest.raises(ShapeError, match=r"b_k: expected shape \(8,\), got \(4,\)"):
        MultiHeadWeights(w.w_q, w.w_k, w.w_v, w.w_o, None, np.zeros(4), num_heads=2)
    with pytest.raises(ShapeError, match=r"w_q: width 8 .* not divisible by num_heads=3"):
        MultiHeadWeights(w.w_q, w.w_k, w.w_v, w.w_o, num_heads=3)


# ---------------------------------------------------------------------------------------------------------------
# the layer


@given(
    b=st.integers(1, 3),
    n_q=st.integers(1, 7),
    n_k=st.integers(1, 7),
    h_kv=st.sampled_from([1, 2, 3]),
    n_rep=st.sampled_from([1, 2]),
    d=st.integers(1, 5),
    cross=st.booleans(),
    bias=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_layer_matches_per_head_reference(b, n_q, n_k, h_kv, n_rep, d, cross, bias, seed):
    rng = np.random.default_rng(seed)
    h = h_kv * n_rep
    d_model, d_kv = 6, (5 if cross else 6)
    w = random_weights(rng, d_model, h, h_kv, d, d_kv=d_kv, bias=bias)
    x_q = rng.standard_normal((b, n_q, d_model))
    x_kv = rng.standard_normal((b, n_k, d_kv)) if cross else None
    n_k = n_k if cross else n_q
    lengths = rng.integers(1, n_k + 1, size=b)
    allowed = masks.key_padding(lengths, n_k)
    r = multi_head_attention(x_q, x_kv, w, allowed)
    out, weights = reference_mha(x_q, x_kv, w, allowed)
    np.testing.assert_allclose(r.output, out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(r.weights, weights, rtol=1e-12, atol=1e-14)
    assert (r.weights[np.broadcast_to(~allowed, r.weights.shape)] == 0).all()


def test_scale_is_one_over_sqrt_head_dim():
    rng = np.random.default_rng(0)
    w = random_weights(rng, 16, 4)
    x = rng.standard_normal((1, 5, 16))
    r = multi_head_attention(x, None, w)
    assert r.trace.scale == pytest.approx(1 / math.sqrt(4))  # head_dim = 4, not d_model = 16
    wrong = multi_head_attention(x, None, w, scale=1 / math.sqrt(16))
    assert np.abs(wrong.output - r.output).max() > 1e-3


def test_matches_torch_sdpa_enable_gqa_causal():
    rng = np.random.default_rng(1)
    w = random_weights(rng, 12, 6, 2, 3)
    x = rng.standard_normal((2, 7, 12))
    r = multi_head_attention(x, None, w, causal=True)
    t = {k: torch.from_numpy(np.asarray(v)) for k, v in w.arrays().items()}
    xt = torch.from_numpy(x)
    q = (xt @ t["w_q"] + t["b_q"]).reshape(2, 7, 6, 3).transpose(1, 2)
    k = (xt @ t["w_k"] + t["b_k"]).reshape(2, 7, 2, 3).transpose(1, 2)
    v = (xt @ t["w_v"] + t["b_v"]).reshape(2, 7, 2, 3).transpose(1, 2)
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out = o.transpose(1, 2).reshape(2, 7, 18) @ t["w_o"] + t["b_o"]
    np.testing.assert_allclose(r.output, out.numpy(), rtol=1e-12, atol=1e-12)


def test_torch_inputs_stay_torch():
    rng = np.random.default_rng(2)
    w = random_weights(rng, 8, 2)
    wt = MultiHeadWeights(**{k: torch.from_numpy(v) for k, v in w.arrays().items()}, num_heads=2)
    x = rng.standard_normal((2, 3, 8))
    r = multi_head_attention(torch.from_numpy(x), None, wt, causal=True)
    assert isinstance(r.output, torch.Tensor)
    np.testing.assert_allclose(r.output.numpy(), multi_head_attention(x, None, w, causal=True).output, rtol=1e-12)


def test_weights_are_in_the_result_and_the_old_flags_are_gone():
    rng = np.random.default_rng(4)
    w = random_weights(rng, 8, 4).astype(np.float32)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    r = multi_head_attention(x, None, w, causal=True)
    assert r.output.dtype == np.float32 and r.weights.dtype == np.float32 and r.weights.shape == (2, 4, 3, 3)
    _, ref = reference_mha(x.astype(np.float64), None, w.astype(np.float64), np.tril(np.ones((3, 3), bool)))
    np.testing.assert_allclose(r.weights, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r.mean_weights(), ref.mean(axis=1), rtol=1e-5, atol=1e-6)
    assert r.mean_weights().shape == (2, 3, 3) and r.mean_weights().dtype == np.float32
    assert r.weights is r.weights  # computed once
    assert not np.shares_memory(r.weights, r.trace.weights)  # a copy: writing into it cannot reach the backward
    for old in ("return_weights", "average_weights", "attn_bias"):  # removed in 0.2.0 (CHANGELOG.md)
        with pytest.raises(TypeError, match=rf"unexpected keyword argument '{old}'"):
            multi_head_attention(x, None, w, causal=True, **{old: True})


def test_inputs_are_not_modified():
    rng = np.random.default_rng(5)
    w = random_weights(rng, 8, 2)
    x = rng.standard_normal((1, 4, 8))
    before = {k: v.copy() for k, v in w.arrays().items()}
    x0 = x.copy()
    multi_head_attention(x, None, w, causal=True, dropout_p=0.5, rng=rng, training=True)
    np.testing.assert_array_equal(x, x0)
    for k, v in w.arrays().items():
        np.testing.assert_array_equal(v, before[k])


def test_future_tokens_cannot_change_past_outputs():
    rng = np.random.default_rng(6)
    w = random_weights(rng, 8, 4, 2)
    x = rng.standard_normal((1, 6, 8))
    y = x.copy()
    y[0, 4:] += 10 * rng.standard_normal((2, 8))
    a = multi_head_attention(x, None, w, causal=True).output
    b = multi_head_attention(y, None, w, causal=True).output
    np.testing.assert_array_equal(a[:, :4], b[:, :4])
    assert np.abs(a[:, 4:] - b[:, 4:]).min() > 0


def test_layer_errors():
    rng = np.random.default_rng(0)
    w = init_multi_head(8, 2, rng=rng)
    x = rng.standard_normal((2, 3, 8))
    with pytest.raises(
        ShapeError, match=r"x_q: last dim 7 \(shape \(2, 3, 7\)\) does not match the weights' d_model=8"
    ):
        multi_head_attention(np.zeros((2, 3, 7)), None, w)
    with pytest.raises(ShapeError, match=r"x_q: expected 3 dims \[B, n, d_model\]"):
        multi_head_attention(np.zeros((3, 8)), None, w)
    with pytest.raises(ShapeError, match=r"x_kv: batch size 1 .* does not match x_q's 2"):
        multi_head_attention(x, np.zeros((1, 3, 8)), w)
    with pytest.raises(ShapeError, match=r"3-D shape \(2, 3, 3\) is ambiguous .* mask\[:, None\]"):
        multi_head_attention(x, None, w, np.ones((2, 3, 3), bool))
    with pytest.raises(DTypeError, match="weights: expected a MultiHeadWeights"):
        multi_head_attention(x, None, {"w_q": 1})
    cross = init_multi_head(8, 2, rng=rng, d_kv=5)
    with pytest.raises(ShapeError, match=r"x_kv: None .* needs d_kv == d_model"):
        multi_head_attention(x, None, cross)
    with pytest.raises(MaskedRowError):
        multi_head_attention(x, None, w, masks.key_padding([0, 3], 3))
    r = multi_head_attention(x, None, w, masks.key_padding([0, 3], 3), masked_rows="zero")
    assert np.isfinite(r.output).all()
    np.testing.assert_allclose(r.output[0], np.broadcast_to(w.b_o, (3, 8)))  # zero heads -> only b_o


def test_top_level_exports():
    for name in (
        "multi_head_attention",
        "multi_head_backward",
        "init_multi_head",
        "attention_backward",
        "split_heads",
        "merge_heads",
        "repeat_kv",
        "MultiHeadWeights",
    ):
        assert name in attnlab.__all__ and hasattr(attnlab, name)


# ---------------------------------------------------------------------------------------------------------------
# overflow and wrong arguments


def test_float32_layer_that_overflows_is_recomputed_in_float64():
    rng = np.random.default_rng(4)
    w = random_weights(rng, 4, 2, bias=False)
    big = MultiHeadWeights(
        (w.w_q * 1e-20).astype(np.float32),
        (w.w_k * 1e-20).astype(np.float32),
        (w.w_v * 1e19).astype(np.float32),  # V = X W_V ~ 1e39: beyond float32
        (w.w_o * 1e-20).astype(np.float32),
        num_heads=2,
    )
    x = (rng.standard_normal((1, 3, 4)) * 1e20).astype(np.float32)
    r = multi_head_attention(x, None, big)
    assert r.output.dtype == np.float32 and r.trace.weights.dtype == np.float64 and np.isfinite(r.output).all()
    f64 = MultiHeadWeights(*(a.astype(np.float64) for a in (big.w_q, big.w_k, big.w_v, big.w_o)), num_heads=2)
    ref, _ = reference_mha(x.astype(np.float64), None, f64)
    np.testing.assert_allclose(r.output, ref, rtol=1e-5)
    g = attnlab.multi_head_backward(r, np.ones((1, 3, 4), np.float32))
    assert g.dx_q.dtype == np.float64  # the compute dtype of the (recomputed) layer


def test_float16_output_that_does_not_fit_is_a_range_error():
    w = MultiHeadWeights(*(np.full((4, 4), 10, np.float16) for _ in range(4)), num_heads=1)
    with pytest.raises(RangeError, match=r"^output: 160000 at index \(0, 0, 0\) does not fit in float16 \(largest "):
        multi_head_attention(np.full((1, 2, 4), 100, np.float16), None, w)


def test_float64_layer_overflow_names_the_stage():
    w = MultiHeadWeights(*(np.full((2, 2), 1e200) for _ in range(4)), num_heads=1)
    with pytest.raises(RangeError) as err:
        multi_head_attention(np.full((1, 2, 2), 1e200), None, w)
    assert str(err.value) == (
        "q: the projection x_q @ w_q + b_q overflows float64 (largest finite 1.797693e+308) from finite inputs "
        "(max |x_q| 1e+200, max |w_q| 1e+200); scale the inputs or the weights down"
    )
    r = multi_head_attention(np.ones((1, 2, 2)), None, MultiHeadWeights(*(np.eye(2) for _ in range(4)), num_heads=1))
    with pytest.raises(RangeError, match=r"^multi_head_backward: in the heads' attention backward, .*: dq: the atten"):
        attnlab.multi_head_backward(r, np.full((1, 2, 2), 1e308))


def test_mixed_libraries_and_options_are_named():
    w = init_multi_head(4, 2, rng=np.random.default_rng(0))
    with pytest.raises(DTypeError) as err:
        multi_head_attention(torch.ones(1, 3, 4, dtype=torch.float64), None, w)
    assert str(err.value) == (
        "arrays of different libraries cannot be mixed in one call: x_q is a torch.Tensor; w_q, w_k, w_v, w_o, b_q, "
        "b_k, b_v, b_o are numpy.ndarray; convert them to one library first (torch.as_tensor(x), x.numpy(), "
        "np.asarray(x))"
    )
    x = np.ones((1, 3, 4))
    with pytest.raises(DTypeError, match=r"^x_kv: a numpy\.ma\.MaskedArray is refused"):
        multi_head_attention(x, np.ma.masked_array(x), w)
    with pytest.raises(DTypeError, match=r"^x_q: dtype datetime64\[s\] is not supported"):
        multi_head_attention(x.astype("datetime64[s]"), None, w)
    with pytest.raises(OptionError, match=r"^training: expected one of False, True, got 1$"):
        multi_head_attention(x, None, w, training=1)
    with pytest.raises(OptionError, match=r"^n_rep: expected an int >= 1, got 1\.5$"):
        repeat_kv(np.ones((1, 2, 3, 4)), 1.5)
    with pytest.raises(DTypeError, match=r"^x: expected an array"):
        merge_heads("heads")


def test_bias_keyword_is_the_cores():
    """``bias=`` as in scaled_dot_product_attention (``attn_bias=`` was removed in 0.2.0); the gradient is
    ``dbias``."""
    rng = np.random.default_rng(7)
    w = init_multi_head(8, 2, rng=rng)
    x = rng.standard_normal((1, 4, 8))
    bias = rng.standard_normal((2, 4, 4))
    r = multi_head_attention(x, None, w, bias=bias)
    ref = multi_head_attention(x, None, w)
    assert np.abs(r.output - ref.output).max() > 1e-3  # the bias is used
    g = multi_head_backward(r, np.ones_like(r.output))
    assert g.dbias.shape == bias.shape and not hasattr(g, "dattn_bias")
    assert multi_head_backward(ref, np.ones_like(ref.output)).dbias is None
