"""The analytic backward of attention and of the multi-head layer, against central finite differences (float64,
relative error < 1e-6) and PyTorch autograd (float64, < 1e-10): random shapes, masks, causal, bias, GQA, cross
attention, dropout with the same mask, and exactly zero gradient through masked entries."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_multihead import random_weights

from attnlab import attention_trace, masks
from attnlab.core.dropout import apply_dropout, make_dropout
from attnlab.core.gradients import AttentionGrads, attention_backward
from attnlab.core.multihead import MultiHeadWeights, multi_head_attention, multi_head_backward
from attnlab.errors import DTypeError, MaskedRowError, RangeError, ShapeError

# ---------------------------------------------------------------------------------------------------------------
# references


def torch_attention(q, k, v, allowed, bias=None, scale=1.0, temperature=1.0, multiplier=None):
    """Plain PyTorch attention; fully masked rows give 0 (not NaN) without a fill value leaking into gradients."""
    s = q @ k.transpose(-1, -2) * scale
    if bias is not None:
        s = s + bias
    s = s / temperature
    allowed = torch.as_tensor(np.broadcast_to(allowed, s.shape).copy())
    empty = ~allowed.any(-1, keepdim=True)
    s = torch.where(allowed, s, torch.tensor(-torch.inf, dtype=s.dtype))
    s = torch.where(empty, torch.zeros_like(s), s)
    a = torch.softmax(s, dim=-1) * allowed
    if multiplier is not None:
        a = a * torch.as_tensor(multiplier)
    return a @ v


def rel_err(got, ref):
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-300)


def assert_grad(ana, num, what=""):
    """Relative error < 1e-6; a gradient that is mathematically 0 (e.g. b_k: softmax ignores row shifts) is ~0."""
    if np.abs(num).max() < 1e-7:
        assert np.abs(ana).max() < 1e-7, what
    else:
        assert rel_err(ana, num) < 1e-6, what


def central_diff(f, x, eps=1e-6):
    """d f / d x for a scalar function ``f`` of the array ``x`` (which is not modified)."""
    g = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        xp_, xm = x.copy(), x.copy()
        xp_[idx] += eps
        xm[idx] -= eps
        g[idx] = (f(xp_) - f(xm)) / (2 * eps)
    return g


@st.composite
def attention_case(draw):
    seed = draw(st.integers(0, 10_000))
    rng = np.random.default_rng(seed)
    b = draw(st.integers(1, 2))
    h = draw(st.integers(1, 3))
    n_q, n_k = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    d_k, d_v = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["none", "random", "causal_tl", "causal_br", "padding"]))
    allowed = np.ones((b, h, n_q, n_k), bool)
    causal = False
    if kind == "random":
        allowed = rng.random((b, h, n_q, n_k)) < 0.6
    elif kind == "causal_tl":
        causal = "top_left"
        allowed &= masks.causal(n_q, n_k, align="top_left")
    elif kind == "causal_br":
        causal = "bottom_right"
        allowed &= masks.causal(n_q, n_k, align="bottom_right")
    elif kind == "padding":
        allowed &= masks.key_padding(rng.integers(0, n_k + 1, size=b), n_k)
    mask = allowed if kind in ("random", "padding") else None
    bias = rng.standard_normal((1, h, n_q, n_k)) if draw(st.booleans()) else None
    temperature = draw(st.sampled_from([1.0, 0.7, 2.0]))
    scale = draw(st.sampled_from([None, 0.3]))
    q = rng.standard_normal((b, h, n_q, d_k))
    k = rng.standard_normal((b, h, n_k, d_k))
    v = rng.standard_normal((b, h, n_k, d_v))
    g = rng.standard_normal((b, h, n_q, d_v))
    p = draw(st.sampled_from([0.0, 0.0, 0.4]))
    drop = make_dropout((b, h, n_q, n_k), p, rng)
    return dict(
        q=q,
        k=k,
        v=v,
        mask=mask,
        causal=causal,
        allowed=allowed,
        bias=bias,
        scale=scale,
        temperature=temperature,
        g=g,
        drop=drop,
    )


def _trace(c, q=None, k=None, v=None, bias=None):
    return attention_trace(
        c["q"] if q is None else q,
        c["k"] if k is None else k,
        c["v"] if v is None else v,
        c["mask"],
        bias=c["bias"] if bias is None else bias,
        causal=c["causal"],
        scale=c["scale"],
        temperature=c["temperature"],
        masked_rows="zero",
    )


# ---------------------------------------------------------------------------------------------------------------
# scaled dot-product attention


@given(attention_case())
def test_sdpa_backward_matches_torch_autograd(c):
    t = _trace(c)
    grads = attention_backward(t, c["g"], dropout=c["drop"])
    q, k, v = (torch.tensor(c[n], requires_grad=True) for n in "qkv")
    bias = None if c["bias"] is None else torch.tensor(c["bias"], requires_grad=True)
    mult = None if c["drop"] is None else c["drop"].multiplier
    out = torch_attention(q, k, v, c["allowed"], bias, t.scale, c["temperature"], mult)
    # the forward agrees too (trace output has no dropout: apply it the same way)
    ours = apply_dropout(t.weights, c["drop"]) @ t.v
    np.testing.assert_allclose(ours, out.detach().numpy(), rtol=1e-12, atol=1e-12)
    (out * torch.tensor(c["g"])).sum().backward()
    for name, ref in (("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        np.testing.assert_allclose(getattr(grads, name), ref.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)
    if bias is None:
        assert grads.dbias is None
    else:
        assert grads.dbias.shape == c["bias"].shape
        np.testing.assert_allclose(grads.dbias, bias.grad.numpy(), rtol=1e-10, atol=1e-12)
    # exactly zero gradient through masked entries and fully masked rows
    assert (grads.ds[~np.broadcast_to(t.allowed, grads.ds.shape)] == 0).all()
    empty = ~t.allowed.any(-1)
    assert (grads.dq[empty] == 0).all()


@given(attention_case())
def test_sdpa_backward_matches_finite_differences(c):
    grads = attention_backward(_trace(c), c["g"], dropout=c["drop"])

    def loss(**kw):
        t = _trace(c, **kw)
        return float((apply_dropout(t.weights, c["drop"]) @ t.v * c["g"]).sum())

    for name in ("q", "k", "v"):
        num = central_diff(lambda x, name=name: loss(**{name: x}), c[name])
        assert_grad(getattr(grads, "d" + name), num, name)
    if c["bias"] is not None:
        assert_grad(grads.dbias, central_diff(lambda x: loss(bias=x), c["bias"]), "dbias")


def test_article_formulas_by_hand():
    """dV = Aᵀ G_O, dA = G_O Vᵀ, g_s = a ∘ (g_a − (g_a·a) 1), dQ = G_S K / sqrt(d_k), dK = G_Sᵀ Q / sqrt(d_k)."""
    rng = np.random.default_rng(0)
    q, k, v, g = (
        rng.standard_normal((3, 2)),
        rng.standard_normal((4, 2)),
        rng.standard_normal((4, 3)),
        rng.standard_normal((3, 3)),
    )
    t = attention_trace(q, k, v)
    a = t.weights
    ga = g @ v.T
    gs = np.stack([a[i] * (ga[i] - ga[i] @ a[i]) for i in range(3)])
    grads = attention_backward(t, g)
    np.testing.assert_allclose(grads.dv, a.T @ g, rtol=1e-14)
    np.testing.assert_allclose(grads.dq, gs @ k / np.sqrt(2), rtol=1e-13)
    np.testing.assert_allclose(grads.dk, gs.T @ q / np.sqrt(2), rtol=1e-13)
    np.testing.assert_allclose(grads.ds, gs, rtol=1e-13, atol=1e-15)


def test_padded_key_and_masked_row_get_exactly_zero_gradient():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 5, 2))
    allowed = masks.key_padding([0, 3], 5, ndim=3) & masks.causal(4, 5, align="bottom_right")
    t = attention_trace(q, k, v, allowed, masked_rows="zero")
    grads = attention_backward(t, rng.standard_normal((2, 4, 2)))
    assert (grads.dq[0] == 0).all() and (grads.dk[0] == 0).all() and (grads.dv[0] == 0).all()  # all keys padded
    assert (grads.dk[1, 3:] == 0).all() and (grads.dv[1, 3:] == 0).all()  # padded keys
    assert np.abs(grads.dk[1, :3]).min() > 0


def test_broadcast_inputs_get_summed_gradients():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((3, 2))  # shared by both batch entries
    k, v = rng.standard_normal((2, 4, 2)), rng.standard_normal((2, 4, 2))
    bias = rng.standard_normal((4,))  # broadcast over batch and queries
    g = rng.standard_normal((2, 3, 2))
    grads = attention_backward(attention_trace(q, k, v, bias=bias), g)
    assert grads.dq.shape == (3, 2) and grads.dbias.shape == (4,)
    qt, kt, vt, bt = (torch.tensor(x, requires_grad=True) for x in (q, k, v, bias))
    out = torch.softmax(qt @ kt.transpose(-1, -2) / np.sqrt(2) + bt, -1) @ vt
    (out * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(grads.dq, qt.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(grads.dbias, bt.grad.numpy(), rtol=1e-10)


def test_torch_tensors_in_torch_gradients_out():
    rng = np.random.default_rng(3)
    q, k, v = (torch.tensor(rng.standard_normal((2, 3, 4))) for _ in range(3))
    g = torch.tensor(rng.standard_normal((2, 3, 4)))
    grads = attention_backward(attention_trace(q, k, v, causal=True), g)
    assert isinstance(grads.dq, torch.Tensor)
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
    (out * g).sum().backward()
    for got, ref in ((grads.dq, qr.grad), (grads.dk, kr.grad), (grads.dv, vr.grad)):
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)


def test_float32_backward_close_to_float64():
    rng = np.random.default_rng(4)
    x = [rng.standard_normal((2, 2, 33, 16)) for _ in range(3)]
    g = rng.standard_normal((2, 2, 33, 16))
    ref = attention_backward(attention_trace(*x, causal=True), g)
    lo = attention_backward(attention_trace(*(a.astype(np.float32) for a in x), causal=True), g.astype(np.float32))
    assert lo.dq.dtype == np.float32
    for name in ("dq", "dk", "dv"):
        assert rel_err(getattr(lo, name), getattr(ref, name)) < 1e-5


def test_backward_errors():
    rng = np.random.default_rng(5)
    t = attention_trace(rng.standard_normal((3, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 5)))
    with pytest.raises(ShapeError, match=r"d_out: shape \(3, 4\), expected the output's shape \(3, 5\)"):
        attention_backward(t, np.zeros((3, 4)))
    with pytest.raises(DTypeError, match="trace: expected an AttentionTrace"):
        attention_backward({"q": 1}, np.zeros((3, 5)))
    with pytest.raises(ValueError, match="d_out: holds nan"):
        attention_backward(t, np.full((3, 5), np.nan))
    tn = attention_trace(
        np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), np.array([[True, True], [False, False]]), masked_rows="nan"
    )
    with pytest.raises(MaskedRowError, match="masked_rows='zero'"):
        attention_backward(tn, np.ones((2, 2)))
    with pytest.raises(ShapeError, match="dropout: keep mask shape"):
        attention_backward(t, np.zeros((3, 5)), dropout=make_dropout((2, 2), 0.5, rng))
    assert isinstance(attention_backward(t, np.zeros((3, 5))), AttentionGrads)


# ---------------------------------------------------------------------------------------------------------------
# the multi-head layer


def torch_mha(xq, xkv, p, w, allowed, multiplier=None, causal=False):
    """The multi-head layer in plain PyTorch with explicit repeat_interleave; xkv None = self attention."""
    src = xq if xkv is None else xkv
    h, h_kv, d = w.num_heads, w.num_kv_heads, w.head_dim
    b, n_q, n_k = xq.shape[0], xq.shape[1], src.shape[1]

    def proj(x, wn, bn):
        y = x @ p[wn]
        return y if bn not in p else y + p[bn]

    q = proj(xq, "w_q", "b_q").reshape(b, n_q, h, d).transpose(1, 2)
    k = proj(src, "w_k", "b_k").reshape(b, n_k, h_kv, d).transpose(1, 2).repeat_interleave(h // h_kv, dim=1)
    v = proj(src, "w_v", "b_v").reshape(b, n_k, h_kv, d).transpose(1, 2).repeat_interleave(h // h_kv, dim=1)
    full = np.broadcast_to(allowed, (b, h, n_q, n_k))
    if causal:
        full = full & masks.causal(n_q, n_k, align="bottom_right")
    o = torch_attention(q, k, v, full, scale=d**-0.5, multiplier=multiplier)
    return proj(o.transpose(1, 2).reshape(b, n_q, h * d), "w_o", "b_o")


@given(
    seed=st.integers(0, 10_000),
    h_kv=st.sampled_from([1, 2]),
    n_rep=st.sampled_from([1, 3]),
    cross=st.booleans(),
    bias=st.booleans(),
    causal=st.booleans(),
    p=st.sampled_from([0.0, 0.3]),
)
def test_multi_head_backward_matches_torch_autograd(seed, h_kv, n_rep, cross, bias, causal, p):
    rng = np.random.default_rng(seed)
    h = h_kv * n_rep
    b, n_q, n_k = 2, int(rng.integers(1, 6)), int(rng.integers(1, 6))
    n_k = n_k if cross else n_q
    w = random_weights(rng, 6, h, h_kv, int(rng.integers(1, 4)), d_kv=(5 if cross else 6), bias=bias)
    x_q = rng.standard_normal((b, n_q, 6))
    x_kv = rng.standard_normal((b, n_k, 5)) if cross else None
    allowed = masks.key_padding(rng.integers(0, n_k + 1, size=b), n_k)
    r = multi_head_attention(
        x_q,
        x_kv,
        w,
        allowed,
        causal="bottom_right" if causal else False,
        masked_rows="zero",
        dropout_p=p,
        rng=np.random.default_rng(seed),
        training=True,
    )
    g = rng.standard_normal(r.output.shape)
    grads = multi_head_backward(r, g)

    pt = {n: torch.tensor(a, requires_grad=True) for n, a in w.arrays().items()}
    xq_t = torch.tensor(x_q, requires_grad=True)
    xkv_t = None if x_kv is None else torch.tensor(x_kv, requires_grad=True)
    mult = None if r.dropout is None else r.dropout.multiplier
    out = torch_mha(xq_t, xkv_t, pt, w, allowed, mult, causal)
    np.testing.assert_allclose(r.output, out.detach().numpy(), rtol=1e-12, atol=1e-12)
    (out * torch.tensor(g)).sum().backward()

    def close(got, ref, what):
        assert got.shape == tuple(ref.shape), what
        assert np.abs(got - ref.numpy()).max() <= 1e-10 * max(1.0, np.abs(ref.numpy()).max()), what

    close(grads.dx_q, xq_t.grad, "dx_q")
    if cross:
        close(grads.dx_kv, xkv_t.grad, "dx_kv")
    else:
        assert grads.dx_kv is None
    for n, t in pt.items():
        close(getattr(grads.weights, n), t.grad, n)
    if not bias:
        assert grads.weights.b_q is None and grads.weights.b_o is None


def test_multi_head_backward_matches_finite_differences_gqa_cross_dropout():
    rng = np.random.default_rng(7)
    w = random_weights(rng, 5, 4, 2, 2, d_kv=3)
    x_q, x_kv = rng.standard_normal((2, 3, 5)), rng.standard_normal((2, 4, 3))
    allowed = masks.key_padding([4, 2], 4)
    g = rng.standard_normal((2, 3, 5))

    def run(xq=x_q, xkv=x_kv, weights=w):
        return multi_head_attention(
            xq,
            xkv,
            weights,
            allowed,
            causal="bottom_right",
            dropout_p=0.25,
            rng=np.random.default_rng(99),
            training=True,
        )  # same seed, same mask

    r = run()
    assert r.dropout is not None and not r.dropout.keep.all()
    grads = multi_head_backward(r, g)

    def loss(**kw):
        return float((run(**kw).output * g).sum())

    assert_grad(grads.dx_q, central_diff(lambda x: loss(xq=x), x_q))
    assert_grad(grads.dx_kv, central_diff(lambda x: loss(xkv=x), x_kv))
    for name, a in w.arrays().items():

        def with_param(x, name=name):
            arrs = dict(w.arrays())
            arrs[name] = x
            return loss(weights=MultiHeadWeights(**arrs, num_heads=4, num_kv_heads=2, head_dim=2))

        assert_grad(getattr(grads.weights, name), central_diff(with_param, a), name)


def test_matches_torch_multihead_attention_autograd():
    """Gradients of nn.MultiheadAttention's own parameters (float64), packed in_proj_weight included."""
    from attnlab import weights_io

    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(12, 3, batch_first=True).double()
    with torch.no_grad():
        mha.in_proj_bias.normal_()
    rng = np.random.default_rng(8)
    x = torch.tensor(rng.standard_normal((2, 5, 12)), requires_grad=True)
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    out, _ = mha(x, x, x, key_padding_mask=kpm, need_weights=False)
    g = rng.standard_normal(out.shape)
    (out * torch.tensor(g)).sum().backward()

    w = weights_io.from_torch_mha(mha)
    r = multi_head_attention(x.detach().numpy(), None, w, masks.from_torch_mha(key_padding_mask=kpm.numpy()))
    grads = multi_head_backward(r, g)
    ours = weights_io.to_torch_mha(grads.weights)  # the gradients, packed the PyTorch way
    for name, param in mha.named_parameters():
        np.testing.assert_allclose(ours[name].numpy(), param.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(grads.dx_q, x.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_multi_head_backward_errors():
    rng = np.random.default_rng(9)
    w = random_weights(rng, 4, 2)
    r = multi_head_attention(rng.standard_normal((1, 3, 4)), None, w)
    with pytest.raises(ShapeError, match=r"d_out: shape \(1, 3, 5\), expected the output's shape \(1, 3, 4\)"):
        multi_head_backward(r, np.zeros((1, 3, 5)))
    with pytest.raises(DTypeError, match="result: expected the MultiHeadResult"):
        multi_head_backward(r.trace, np.zeros((1, 3, 4)))


def test_multi_head_backward_with_torch_tensors_and_dropout():
    rng = np.random.default_rng(10)
    w = random_weights(rng, 8, 4, 2)
    x = rng.standard_normal((2, 5, 8))
    g = rng.standard_normal((2, 5, 8))
    wt = MultiHeadWeights(**{n: torch.from_numpy(a) for n, a in w.arrays().items()}, num_heads=4, num_kv_heads=2)
    kw = dict(causal=True, dropout_p=0.2, training=True)
    rt = multi_head_attention(torch.from_numpy(x), None, wt, rng=np.random.default_rng(1), **kw)
    rn = multi_head_attention(x, None, w, rng=np.random.default_rng(1), **kw)
    gt, gn = multi_head_backward(rt, torch.from_numpy(g)), multi_head_backward(rn, g)
    assert isinstance(gt.dx_q, torch.Tensor) and isinstance(gt.weights.w_k, torch.Tensor)
    np.testing.assert_allclose(gt.dx_q.numpy(), gn.dx_q, rtol=1e-12, atol=1e-14)
    for n in w.arrays():
        np.testing.assert_allclose(getattr(gt.weights, n).numpy(), getattr(gn.weights, n), rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------------------------------------------------
# overflow in the backward: float32 redone in float64, float64 overflow a named RangeError


def _torch_grads(q, k, v, d_o, scale):
    qt, kt, vt = (torch.tensor(np.asarray(x, np.float64), requires_grad=True) for x in (q, k, v))
    out = torch.softmax(qt @ kt.T * scale, dim=-1) @ vt
    (out * torch.tensor(np.asarray(d_o, np.float64))).sum().backward()
    return qt.grad.numpy(), kt.grad.numpy(), vt.grad.numpy()


def test_float32_backward_whose_intermediates_overflow_is_redone_in_float64():
    rng = np.random.default_rng(7)
    q, k = (rng.standard_normal((3, 2)).astype(np.float32) for _ in range(2))
    v = np.stack([1e20 + 1e13 * np.arange(3), np.full(3, -1e20)], axis=1).astype(np.float32)
    d_o = np.full((3, 2), 1e20, np.float32)  # dO Vᵀ: products of 1e40 overflow float32, their sums do not
    t = attention_trace(q, k, v, scale=1.0)
    g = attention_backward(t, d_o)
    assert g.dq.dtype == np.float32 and all(np.isfinite(x).all() for x in (g.dq, g.dk, g.dv, g.ds))
    want = _torch_grads(q, k, v, d_o, 1.0)
    for got, ref in zip((g.dq, g.dk, g.dv), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_float64_backward_overflow_names_the_gradient():
    t = attention_trace(np.eye(3) * 1e100, np.eye(3) * 1e100, np.eye(3) * 1e200, scale=1e-200)
    with pytest.raises(RangeError) as err:
        attention_backward(t, np.ones((3, 3)) * 1e200)
    assert str(err.value) == (
        "dq: the attention gradient overflows float64 (largest finite 1.797693e+308) from finite inputs: max |d_out| "
        "1e+200, max |q| 1e+100, max |k| 1e+100, max |v| 1e+200, scale 1e-200, temperature 1; scale d_out (the loss) "
        "or the inputs down"
    )


def test_d_out_of_another_library_or_dtype_is_named():
    t = attention_trace(np.eye(2), np.eye(2), np.eye(2))
    with pytest.raises(DTypeError, match=r"forward is a numpy\.ndarray; d_out is a torch\.Tensor"):
        attention_backward(t, torch.ones(2, 2, dtype=torch.float64))
    with pytest.raises(DTypeError, match=r"^d_out: dtype complex128 is not supported"):
        attention_backward(t, np.ones((2, 2), complex))
    with pytest.raises(DTypeError, match=r"^d_out: expected an array"):
        attention_backward(t, "ones")
    with pytest.raises(DTypeError, match=r"^dropout: expected a Dropout"):
        attention_backward(t, np.ones((2, 2)), dropout=0.5)
    tt = attention_trace(*(torch.eye(2, dtype=torch.float64) for _ in range(3)))
    assert isinstance(attention_backward(tt, np.ones((2, 2))).dq, torch.Tensor)  # NumPy d_out: converted
