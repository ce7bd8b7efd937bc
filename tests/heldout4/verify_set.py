"""Checks held-out set 4 without the checker: every correct case against an independent float64 reference (NumPy
for outputs, torch float64 autograd for gradients), every buggy case differing from it on a stated input and, where
its bug needs a specific input, agreeing on one where the bug does not show.

``WITNESSES`` maps each case to a function that calls the case on concrete inputs written here and returns its
:class:`Comparison` list; :func:`verify` runs one.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable

import numpy as np
import torch

# ---------------------------------------------------------------------------------------------------------------
# comparisons


@dataclasses.dataclass(frozen=True)
class Comparison:
    """``actual`` must agree with ``expected`` (``same``) or differ from it, at the tolerance ``tol``."""

    label: str
    actual: np.ndarray
    expected: np.ndarray
    same: bool
    tol: float

    def holds(self) -> bool:
        """Whether the comparison comes out as stated (NaN agrees only with NaN; a shape mismatch is a difference)."""
        a = np.asarray(self.actual, dtype=np.float64)
        e = np.asarray(self.expected, dtype=np.float64)
        close = a.shape == e.shape and bool(np.allclose(a, e, rtol=self.tol, atol=self.tol, equal_nan=True))
        return close if self.same else not close


def same(label: str, actual, expected, tol: float = 1e-8) -> Comparison:
    """A comparison that holds when ``actual`` matches ``expected`` within ``tol``."""
    return Comparison(label, _numpy(actual), _numpy(expected), True, tol)


def differ(label: str, actual, expected, tol: float = 1e-6) -> Comparison:
    """A comparison that holds when ``actual`` differs from ``expected`` by more than ``tol`` (or in shape, or NaN)."""
    return Comparison(label, _numpy(actual), _numpy(expected), False, tol)


def _numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).numpy()
    if isinstance(x, (tuple, list)):
        return np.concatenate([_numpy(t).ravel() for t in x])
    return np.asarray(x, dtype=np.float64)


def raised(fn: Callable[[], object]) -> np.ndarray:
    """``[1.0]`` when ``fn()`` raises, ``[0.0]`` when it returns."""
    try:
        fn()
    except Exception:
        return np.array([1.0])
    return np.array([0.0])


# ---------------------------------------------------------------------------------------------------------------
# inputs and references


def qkv(b=2, h=2, n_q=5, n_k=7, d=4, d_v=3, h_kv=None, seed=0):
    """Random float64 q [b, h, n_q, d], k and v [b, h_kv, n_k, d / d_v] (``b=None``: 3-D inputs)."""
    rng = np.random.default_rng(seed)
    lead = () if b is None else (b,)
    h_kv = h if h_kv is None else h_kv
    return (
        rng.standard_normal((*lead, h, n_q, d)),
        rng.standard_normal((*lead, h_kv, n_k, d)),
        rng.standard_normal((*lead, h_kv, n_k, d_v)),
    )


def allow_mask(shape, seed=1, empty_row=False):
    """A bool mask (True = may attend) with every row keeping a key; ``empty_row`` blocks all of query 1's keys."""
    rng = np.random.default_rng(seed)
    m = rng.random(shape) < 0.6
    m[..., 0] = True
    m[..., 0, :] = rng.random(shape[-1]) < 0.5  # query 0 loses its first key sometimes, keeps the last
    m[..., 0, -1] = True
    if empty_row:
        m[(0,) * (len(shape) - 2) + (1,)] = False
    return m


def causal(n_q, n_k, align):
    """The causal rule, bool [n_q, n_k]: ``top_left`` (j <= i) or ``bottom_right`` (j <= i + n_k - n_q)."""
    offset = 0 if align == "top_left" else n_k - n_q
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + offset


def ref(q, k, v, allow=None, scale=None, keep=None, p=0.0, empty="zeros"):
    """softmax(q kᵀ scale, where allowed) v in float64; GQA by repeating K/V heads (``i // group``); a row with no
    allowed key is ``empty`` (``zeros``, ``uniform`` over all keys, ``nan``); ``keep`` a dropout keep mask."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    if q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    allow = np.ones(s.shape, dtype=bool) if allow is None else np.broadcast_to(allow, s.shape)
    s = np.where(allow, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    z = e.sum(axis=-1, keepdims=True)
    w = np.divide(e, z, out=np.zeros_like(e), where=z > 0)
    fill = {"zeros": 0.0, "uniform": 1.0 / s.shape[-1], "nan": np.nan}[empty]
    w = np.where(z > 0, w, fill)
    if keep is not None:
        w = w * keep / (1 - p)
    return w @ v


def ref_grads(q, k, v, d_out, allow=None, scale=None, keep=None, p=0.0):
    """(dq, dk, dv) of :func:`ref`'s attention (zeros policy) by torch float64 autograd."""
    tq, tk, tv = (torch.tensor(np.asarray(t, dtype=np.float64), requires_grad=True) for t in (q, k, v))
    kk, vv = tk, tv
    if tq.ndim >= 3 and tk.shape[-3] != tq.shape[-3]:
        group = tq.shape[-3] // tk.shape[-3]
        kk, vv = tk.repeat_interleave(group, dim=-3), tv.repeat_interleave(group, dim=-3)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = tq @ kk.transpose(-2, -1) * scale
    allowed = torch.ones(s.shape, dtype=torch.bool) if allow is None else torch.tensor(allow).expand(s.shape)
    m = torch.where(allowed, s, -torch.inf).amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(torch.where(allowed, s, m) - m) * allowed
    z = e.sum(dim=-1, keepdim=True)
    w = e / torch.where(z > 0, z, torch.ones_like(z))
    if keep is not None:
        w = w * torch.tensor(keep) / (1 - p)
    (w @ vv).backward(torch.tensor(np.asarray(d_out, dtype=np.float64)))
    return tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()


def block_logits():
    """One query against 8 keys, d = 1: logits 1000 in the first key block of 4 and -1000 in the second."""
    q = np.ones((1, 1, 1, 1))
    k = np.array([1000.0, 999, 998, 997, -1000, -999, -998, -997])[None, None, :, None]
    return q, k, np.arange(8.0)[None, None, :, None]


def T(x):
    """A float64 (or bool / int) torch tensor of a NumPy array."""
    return torch.tensor(np.asarray(x))


def d_out_for(q, v, seed=5):
    """A random d_out shaped like the output."""
    return np.random.default_rng(seed).standard_normal((*q.shape[:-1], v.shape[-1]))


def case(name):
    """The case's module."""
    return importlib.import_module(f"heldout4.{name}")


def autograd_grads(fn, q, k, v, d_out, **kwargs):
    """(dq, dk, dv) of a torch forward through autograd."""
    tq, tk, tv = (torch.tensor(t, requires_grad=True) for t in (q, k, v))
    fn(tq, tk, tv, **kwargs).backward(T(d_out))
    return tq.grad, tk.grad, tv.grad


# ---------------------------------------------------------------------------------------------------------------
# forward, buggy


def w_fwd_sdpa_dropout_in_eval():
    fn = case("fwd_sdpa_dropout_in_eval").attention
    q, k, v = qkv()
    torch.manual_seed(0)
    first, second = fn(T(q), T(k), T(v)), fn(T(q), T(k), T(v))
    return [differ("eval call vs reference", first, ref(q, k, v)), differ("two calls, same inputs", first, second)]


def w_fwd_mask_skipped_for_single_query():
    fn = case("fwd_mask_skipped_for_single_query").attention
    q1, k, v = qkv(n_q=1)
    m1 = allow_mask((*q1.shape[:-1], k.shape[-2]))
    q, _, _ = qkv(n_q=5)
    m = allow_mask((*q.shape[:-1], k.shape[-2]))
    return [
        differ("n_q == 1, padding", fn(T(q1), T(k), T(v), T(m1)), ref(q1, k, v, m1)),
        same("n_q == 5, padding", fn(T(q), T(k), T(v), T(m)), ref(q, k, v, m)),
    ]


def w_fwd_key_padding_repeat_not_interleave():
    fn = case("fwd_key_padding_repeat_not_interleave").attention
    q, k, v = qkv(b=2, h=3)
    kp = np.array([[True] * 7, [True] * 4 + [False] * 3])
    q1, k1, v1 = qkv(b=1, h=3)
    return [
        differ("B=2, h=3", fn(T(q), T(k), T(v), T(kp)), ref(q, k, v, kp[:, None, None, :])),
        same("B=1", fn(T(q1), T(k1), T(v1), T(kp[1:])), ref(q1, k1, v1, kp[1:, None, None, :])),
    ]


def w_fwd_gqa_tile_kv_heads():
    fn = case("fwd_gqa_tile_kv_heads").attention
    q, k, v = qkv(h=4, h_kv=2)
    m = allow_mask((*q.shape[:-1], 7))
    q1, k1, v1 = qkv(h=4, h_kv=1)
    return [
        differ("h=4, h_kv=2", fn(q, k, v, m), ref(q, k, v, m)),
        same("h=4, h_kv=1", fn(q1, k1, v1, m), ref(q1, k1, v1, m)),
    ]


def w_fwd_online_softmax_block_max_reset():
    fn = case("fwd_online_softmax_block_max_reset").attention
    q, k, v = qkv(n_k=11)
    m = allow_mask((*q.shape[:-1], 11), empty_row=True)
    ql, kl, vl = block_logits()
    return [
        same("ordinary, 3 key blocks, masked", fn(q, k, v, m), ref(q, k, v, m)),
        differ("logits ±1000 over two key blocks", fn(ql, kl, vl), ref(ql, kl, vl)),
    ]


def w_fwd_softmax_dim0_flattened():
    fn = case("fwd_softmax_dim0_flattened").attention
    q, k, v = qkv()
    q1, k1, v1 = qkv(b=1, h=1, n_k=1)
    return [
        differ("B=2, h=2", fn(T(q), T(k), T(v)), ref(q, k, v)),
        same("B = h = n_k = 1", fn(T(q1), T(k1), T(v1)), ref(q1, k1, v1)),
    ]


def w_fwd_softmax_over_queries():
    fn = case("fwd_softmax_over_queries").attention
    q, k, v = qkv()
    q1, k1, v1 = qkv(n_q=1, n_k=1)
    return [differ("5 x 7", fn(q, k, v), ref(q, k, v)), same("1 x 1", fn(q1, k1, v1), ref(q1, k1, v1))]


def w_fwd_chunked_prefill_causal_top_left():
    fn = case("fwd_chunked_prefill_causal_top_left").attention
    q, k, v = qkv(n_q=3, n_k=7)
    qs, ks, vs = qkv(n_q=5, n_k=5)
    return [
        differ("causal 3 x 7", fn(q, k, v, causal=True), ref(q, k, v, causal(3, 7, "bottom_right"))),
        same("causal 5 x 5", fn(qs, ks, vs, causal=True), ref(qs, ks, vs, causal(5, 5, "bottom_right"))),
        same("not causal 3 x 7", fn(q, k, v), ref(q, k, v)),
    ]


def w_fwd_causal_only_for_square():
    fn = case("fwd_causal_only_for_square").attention
    q, k, v = qkv(n_q=3, n_k=7)
    qs, ks, vs = qkv(n_q=5, n_k=5)
    q1, _, _ = qkv(n_q=1, n_k=7)
    return [
        differ("causal 3 x 7", fn(T(q), T(k), T(v), causal=True), ref(q, k, v, causal(3, 7, "bottom_right"))),
        same("causal 5 x 5", fn(T(qs), T(ks), T(vs), causal=True), ref(qs, ks, vs, causal(5, 5, "bottom_right"))),
        same("causal 1 x 7", fn(T(q1), T(k), T(v), causal=True), ref(q1, k, v, causal(1, 7, "bottom_right"))),
    ]


def w_fwd_scale_by_embedding_channels():
    fn = case("fwd_scale_by_embedding_channels").attention
    q, k, v = qkv(h=3)
    q1, k1, v1 = qkv(h=1)
    return [differ("h=3", fn(T(q), T(k), T(v)), ref(q, k, v)), same("h=1", fn(T(q1), T(k1), T(v1)), ref(q1, k1, v1))]


def w_fwd_scale_divides_instead_of_multiplies():
    fn = case("fwd_scale_divides_instead_of_multiplies").attention
    q, k, v = qkv(d=4)
    q1, k1, v1 = qkv(d=1)
    return [differ("d=4", fn(q, k, v), ref(q, k, v)), same("d=1", fn(q1, k1, v1), ref(q1, k1, v1))]


def w_fwd_scale_argument_ignored():
    fn = case("fwd_scale_argument_ignored").attention
    q, k, v = qkv(n_q=3)
    return [
        differ("scale=0.3", fn(T(q), T(k), T(v), scale=0.3), ref(q, k, v, scale=0.3)),
        same("scale=None", fn(T(q), T(k), T(v)), ref(q, k, v)),
        same("is_causal 3 x 7", fn(T(q), T(k), T(v), is_causal=True), ref(q, k, v, causal(3, 7, "top_left"))),
    ]


def w_fwd_output_scaled_after_softmax():
    fn = case("fwd_output_scaled_after_softmax").attention
    q, k, v = qkv(d=4)
    q1, k1, v1 = qkv(d=1)
    return [differ("d=4", fn(T(q), T(k), T(v)), ref(q, k, v)), same("d=1", fn(T(q1), T(k1), T(v1)), ref(q1, k1, v1))]


def w_fwd_mask_fill_minus_1e4():
    fn = case("fwd_mask_fill_minus_1e4").attention
    q, k, v = qkv()
    m = allow_mask((*q.shape[:-1], 7))
    ql, vl = np.full((1, 1, 1, 1), 100.0), np.arange(4.0)[None, None, :, None]
    kl = np.full((1, 1, 4, 1), -1000.0)  # every score is -1e5
    ml = np.array([False, True, True, True])[None, None, None, :]
    return [
        same("ordinary scores", fn(T(q), T(k), T(v), T(m.astype(np.int64))), ref(q, k, v, m)),
        differ("allowed scores -1e5", fn(T(ql), T(kl), T(vl), T(ml.astype(np.int64))), ref(ql, kl, vl, ml)),
    ]


def w_fwd_keep_mask_added_as_bias():
    fn = case("fwd_keep_mask_added_as_bias").attention
    q, k, v = qkv()
    m = allow_mask((*q.shape[:-1], 7))
    ones = np.ones_like(m)
    return [
        differ("padding mask", fn(T(q), T(k), T(v), T(m.astype(np.int64))), ref(q, k, v, m)),
        same("nothing masked", fn(T(q), T(k), T(v), T(ones.astype(np.int64))), ref(q, k, v)),
    ]


def w_fwd_valid_mask_as_key_padding():
    fn = case("fwd_valid_mask_as_key_padding").attention
    q, k, v = qkv()
    kp = np.array([[True] * 7, [True] * 4 + [False] * 3])
    return [differ("padding", fn(T(q), T(k), T(v), T(kp)), ref(q, k, v, kp[:, None, None, :]))]


def w_fwd_half_inputs_float32_output():
    fn = case("fwd_half_inputs_float32_output").attention
    q, k, v = qkv()
    out32 = fn(*(torch.tensor(t, dtype=torch.float32) for t in (q, k, v)))
    out16 = fn(*(torch.tensor(t, dtype=torch.float16) for t in (q, k, v)))
    return [
        same("float32 values", out32, ref(q, k, v), tol=1e-5),
        same("float32 dtype kept", [out32.dtype == torch.float32], [True]),
        differ("float16 dtype kept", [out16.dtype == torch.float16], [True]),
    ]


def w_fwd_query_scaled_in_place():
    fn = case("fwd_query_scaled_in_place").attention
    q, k, v = qkv()
    tq = T(q)
    first = fn(tq, T(k), T(v))
    second = fn(tq, T(k), T(v))
    return [
        same("first call's output", first, ref(q, k, v)),
        differ("the caller's q after the call", tq, q),
        differ("second call, same tensors", second, ref(q, k, v)),
    ]


def _kv_cache_ref(q, k, v, lengths, is_causal):
    """bnhd inputs; each sequence's own key length and bottom-right causal bound."""
    qh, kh, vh = (np.swapaxes(t, 1, 2) for t in (q, k, v))
    n_q, n_k = q.shape[1], k.shape[1]
    j = np.arange(n_k)[None, None, :]
    allow = j < np.asarray(lengths)[:, None, None]
    if is_causal:
        allow = allow & (j <= np.asarray(lengths)[:, None, None] - n_q + np.arange(n_q)[None, :, None])
    return np.swapaxes(ref(qh, kh, vh, np.broadcast_to(allow, (q.shape[0], n_q, n_k))[:, None]), 1, 2)


def _bnhd(b=2, n_q=2, n_k=7, h=2, seed=0):
    q, k, v = qkv(b=b, h=h, n_q=n_q, n_k=n_k, seed=seed)
    return tuple(np.ascontiguousarray(np.swapaxes(t, 1, 2)) for t in (q, k, v))


def w_fwd_kv_cache_seqlens_ignored():
    fn = case("fwd_kv_cache_seqlens_ignored").attention
    q, k, v = _bnhd()
    short, full = np.array([4, 6]), np.array([7, 7])
    return [
        differ("cache lengths 4, 6 of 7", fn(T(q), T(k), T(v), T(short)), _kv_cache_ref(q, k, v, short, False)),
        same("full caches, causal", fn(T(q), T(k), T(v), T(full), causal=True), _kv_cache_ref(q, k, v, full, True)),
    ]


def w_fwd_causal_mask_built_square():
    fn = case("fwd_causal_mask_built_square").attention
    q, k, v = qkv(n_q=3, n_k=7)
    qs, ks, vs = qkv(n_q=5, n_k=5)
    return [
        differ("causal 3 x 7 raises", raised(lambda: fn(T(q), T(k), T(v), causal=True)), [0.0]),
        same("causal 5 x 5", fn(T(qs), T(ks), T(vs), causal=True), ref(qs, ks, vs, causal(5, 5, "top_left"))),
    ]


def w_fwd_masked_row_nan_fallback():
    fn = case("fwd_masked_row_nan_fallback").attention
    q, k, v = qkv()
    m = allow_mask((*q.shape[:-1], 7))
    me = allow_mask((*q.shape[:-1], 7), empty_row=True)
    return [
        same("every row keeps a key", fn(q, k, v, m), ref(q, k, v, m)),
        differ("an empty row", fn(q, k, v, me), ref(q, k, v, me)),
    ]


def w_fwd_tril_on_weights():
    fn = case("fwd_tril_on_weights").attention
    q, k, v = qkv(n_q=5, n_k=5)
    q1, k1, v1 = qkv(n_q=1, n_k=1)
    return [
        differ("causal 5 x 5", fn(T(q), T(k), T(v)), ref(q, k, v, causal(5, 5, "top_left"))),
        same("1 x 1", fn(T(q1), T(k1), T(v1)), ref(q1, k1, v1)),
    ]


# ---------------------------------------------------------------------------------------------------------------
# forward, correct


def w_ok_exp_minus_logsumexp():
    fn = case("ok_exp_minus_logsumexp").attention
    q, k, v = qkv()
    m = allow_mask((*q.shape[:-1], 7), empty_row=True)
    q3, k3, v3 = qkv(b=None, n_q=7, n_k=3)
    ql, kl, vl = 1000 * q, k, v
    return [
        same("masked, an empty row", fn(q, k, v, m), ref(q, k, v, m)),
        same("3-D, n_q > n_k", fn(q3, k3, v3), ref(q3, k3, v3)),
        same("logits near ±1000", fn(ql, kl, vl), ref(ql, kl, vl), tol=1e-7),
    ]


def w_ok_additive_batch_mask_finfo_min():
    fn = case("ok_additive_batch_mask_finfo_min").attention
    q, k, v = qkv()
    allow = allow_mask((2, 1, 5, 7), empty_row=True)
    additive = np.where(allow, 0.0, np.finfo(np.float32).min)
    q32 = [torch.tensor(t, dtype=torch.float32) for t in (q, k, v)]
    expected = ref(q, k, v, allow, empty="uniform")
    return [
        same("float64, an empty row (uniform)", fn(T(q), T(k), T(v), T(additive)), expected),
        same("float32", fn(*q32, torch.tensor(additive, dtype=torch.float32)), expected, tol=1e-5),
    ]


def w_ok_jax_repeat_gqa_bnhd():
    import jax.numpy as jnp

    fn = case("ok_jax_repeat_gqa_bnhd").attention
    q, k, v = qkv(h=4, h_kv=2)
    m = allow_mask((2, 4, 5, 7), empty_row=True)
    args = [jnp.asarray(np.swapaxes(t, 1, 2), dtype=jnp.float32) for t in (q, k, v)]
    out = np.swapaxes(np.asarray(fn(*args, jnp.asarray(m))), 1, 2)
    return [same("GQA 4 -> 2, masked, an empty row", out, ref(q, k, v, m), tol=1e-5)]


def w_ok_tiled_online_softmax_running_max():
    fn = case("ok_tiled_online_softmax_running_max").attention
    q, k, v = qkv(n_k=11)
    m = allow_mask((*q.shape[:-1], 11), empty_row=True)
    ql, kl, vl = block_logits()
    return [
        same("3 key blocks, masked, an empty row", fn(q, k, v, m), ref(q, k, v, m)),
        same("logits ±1000 over two key blocks", fn(ql, kl, vl), ref(ql, kl, vl)),
    ]


def w_ok_key_padding_block_convention():
    fn = case("ok_key_padding_block_convention").attention
    q, k, v = qkv()
    pad = np.array([[False] * 5 + [True] * 2, [True] * 7])  # the second sequence is all padding
    return [same("padding, an empty sequence", fn(T(q), T(k), T(v), T(pad)), ref(q, k, v, ~pad[:, None, None, :]))]


def w_ok_gqa_fold_groups_into_queries():
    fn = case("ok_gqa_fold_groups_into_queries").attention
    q, k, v = qkv(h=4, h_kv=2)
    m = allow_mask((2, 4, 5, 7), empty_row=True)
    mb = allow_mask((2, 1, 5, 7), seed=3)
    return [
        same("GQA 4 -> 2, masked, an empty row", fn(T(q), T(k), T(v), T(m)), ref(q, k, v, m)),
        same("GQA 4 -> 2, per-batch mask", fn(T(q), T(k), T(v), T(mb)), ref(q, k, v, mb)),
    ]


def w_ok_nan_rows_declared():
    fn = case("ok_nan_rows_declared").attention
    q, k, v = qkv()
    m = allow_mask((*q.shape[:-1], 7), empty_row=True)
    return [same("an empty row is NaN", fn(T(q), T(k), T(v), T(m)), ref(q, k, v, m, empty="nan"))]


def w_ok_kv_cache_decode_offset():
    fn = case("ok_kv_cache_decode_offset").attention
    q, k, v = _bnhd(n_q=2)
    lengths = np.array([4, 7])
    return [
        same("lengths 4, 7, causal", fn(T(q), T(k), T(v), T(lengths), causal=True),
             _kv_cache_ref(q, k, v, lengths, True)),
        same("lengths 4, 7", fn(T(q), T(k), T(v), T(lengths)), _kv_cache_ref(q, k, v, lengths, False)),
        same("scale 0.5", fn(T(q), T(k), T(v), softmax_scale=0.5),
             np.swapaxes(ref(*(np.swapaxes(t, 1, 2) for t in (q, k, v)), scale=0.5), 1, 2)),
    ]  # fmt: skip


def w_ok_valid_lens_masked_softmax():
    fn = case("ok_valid_lens_masked_softmax").attention
    q, k, v = qkv()
    lens = np.array([3, 0])
    allow = (np.arange(7)[None, :] < lens[:, None])[:, None, None, :]
    return [
        same("lengths 3 and 0", fn(q, k, v, lens), ref(q, k, v, allow)),
        same("no lengths", fn(q, k, v), ref(q, k, v)),
    ]


# ---------------------------------------------------------------------------------------------------------------
# backward


def _plain(name, bwd="attention_bwd"):
    return getattr(case(name), bwd)


def w_bwd_softmax_jacobian_diagonal_only():
    bwd = _plain("bwd_softmax_jacobian_diagonal_only")
    q, k, v = qkv()
    do = d_out_for(q, v)
    return [differ("gradients", bwd(q, k, v, do), ref_grads(q, k, v, do))]


def w_bwd_delta_from_rowsum_dp():
    bwd = _plain("bwd_delta_from_rowsum_dp")
    q, k, v = qkv()
    do = d_out_for(q, v)
    m = allow_mask((*q.shape[:-1], 7))
    return [differ("gradients, masked", bwd(q, k, v, do, mask=m), ref_grads(q, k, v, do, m)),
            same("dv alone is right", bwd(q, k, v, do)[2], ref_grads(q, k, v, do)[2])]  # fmt: skip


def w_bwd_dropout_not_applied_to_dp():
    bwd = _plain("bwd_dropout_not_applied_to_dp")
    q, k, v = qkv()
    do = d_out_for(q, v)
    keep = np.random.default_rng(9).random((2, 2, 5, 7)) > 0.3
    g = bwd(T(q), T(k), T(v), T(do), dropout_mask=T(keep), dropout_p=0.3)
    return [
        differ("dropout p=0.3", g, ref_grads(q, k, v, do, keep=keep, p=0.3)),
        same("no dropout", bwd(T(q), T(k), T(v), T(do)), ref_grads(q, k, v, do)),
    ]


def w_bwd_causal_flag_ignored():
    bwd = _plain("bwd_causal_flag_ignored")
    q, k, v = qkv(n_q=5, n_k=5)
    do = d_out_for(q, v)
    return [
        differ("causal=False", bwd(q, k, v, do), ref_grads(q, k, v, do)),
        same("causal=True", bwd(q, k, v, do, causal=True), ref_grads(q, k, v, do, causal(5, 5, "top_left"))),
    ]


def w_bwd_causal_top_left_in_cross():
    bwd = _plain("bwd_causal_top_left_in_cross")
    q, k, v = qkv(n_q=3, n_k=7)
    qs, ks, vs = qkv(n_q=5, n_k=5)
    do, dos = d_out_for(q, v), d_out_for(qs, vs)
    return [
        differ("causal 3 x 7", bwd(q, k, v, do, causal=True), ref_grads(q, k, v, do, causal(3, 7, "bottom_right"))),
        same("causal 5 x 5", bwd(qs, ks, vs, dos, causal=True), ref_grads(qs, ks, vs, dos, causal(5, 5, "top_left"))),
        same("not causal 3 x 7", bwd(q, k, v, do), ref_grads(q, k, v, do)),
    ]


def w_bwd_gqa_wrong_head_split():
    bwd = _plain("bwd_gqa_wrong_head_split")
    out = []
    for h_kv, show in ((2, True), (1, False), (4, False)):
        q, k, v = qkv(h=4, h_kv=h_kv)
        do = d_out_for(q, v)
        out.append((differ if show else same)(f"h=4, h_kv={h_kv}", bwd(q, k, v, do), ref_grads(q, k, v, do)))
    return out


def w_bwd_autograd_masked_row_nan():
    fn = case("bwd_autograd_masked_row_nan").attention
    q, k, v = qkv()
    do = d_out_for(q, v)
    m, me = (allow_mask((*q.shape[:-1], 7), empty_row=e) for e in (False, True))
    return [
        same("every row keeps a key", autograd_grads(fn, q, k, v, do, mask=T(m)), ref_grads(q, k, v, do, m)),
        differ("an empty row", autograd_grads(fn, q, k, v, do, mask=T(me)), ref_grads(q, k, v, do, me)),
        same("forward, an empty row", fn(T(q), T(k), T(v), T(me)), ref(q, k, v, me)),
    ]


def _flash(name, q, k, v, do, fwd="attention", bwd="attention_bwd", **kw):
    mod = case(name)
    out, lse = getattr(mod, fwd)(q, k, v, **kw)
    return out, getattr(mod, bwd)(q, k, v, out, lse, do, **kw)


def w_bwd_flash_mask_not_in_recompute():
    q, k, v = qkv()
    do = d_out_for(q, v)
    m = allow_mask((*q.shape[:-1], 7))
    out, g = _flash("bwd_flash_mask_not_in_recompute", q, k, v, do, mask=m)
    _, g0 = _flash("bwd_flash_mask_not_in_recompute", q, k, v, do)
    return [
        same("forward, masked", out, ref(q, k, v, m)),
        differ("gradients, masked", g, ref_grads(q, k, v, do, m)),
        same("gradients, no mask", g0, ref_grads(q, k, v, do)),
    ]


def w_bwd_flash_lse_without_max():
    q, k, v = qkv()
    do = d_out_for(q, v)
    ql = 600 * q
    _, g = _flash("bwd_flash_lse_without_max", q, k, v, do)
    out_l, g_l = _flash("bwd_flash_lse_without_max", ql, k, v, do)
    return [
        same("ordinary", g, ref_grads(q, k, v, do)),
        same("forward, large logits", out_l, ref(ql, k, v)),
        differ("gradients, large logits", g_l, ref_grads(ql, k, v, do)),
    ]


def w_bwd_tiled_dq_stored_per_key_block():
    bwd = _plain("bwd_tiled_dq_stored_per_key_block")
    q, k, v = qkv(n_k=40)
    qs, ks, vs = qkv(n_k=8)
    do = d_out_for(q, v)
    return [
        differ("n_k = 40", bwd(q, k, v, do), ref_grads(q, k, v, do)),
        same("n_k = 8", bwd(qs, ks, vs, do), ref_grads(qs, ks, vs, do)),
    ]


def w_bwd_scale_argument_ignored():
    bwd = _plain("bwd_scale_argument_ignored")
    q, k, v = qkv()
    do = d_out_for(q, v)
    return [
        differ("scale=0.3", bwd(q, k, v, do, scale=0.3), ref_grads(q, k, v, do, scale=0.3)),
        same("default scale", bwd(q, k, v, do), ref_grads(q, k, v, do)),
    ]


def w_bwd_dq_reads_first_sequence_keys():
    bwd = _plain("bwd_dq_reads_first_sequence_keys")
    q, k, v = qkv(b=2)
    q1, k1, v1 = qkv(b=1)
    do, do1 = d_out_for(q, v), d_out_for(q1, v1)
    return [
        differ("B=2", bwd(q, k, v, do), ref_grads(q, k, v, do)),
        same("B=1", bwd(q1, k1, v1, do1), ref_grads(q1, k1, v1, do1)),
    ]


def w_bwd_dropout_scaled_by_inverse_p():
    bwd = _plain("bwd_dropout_scaled_by_inverse_p")
    q, k, v = qkv()
    do = d_out_for(q, v)
    keep = np.random.default_rng(9).random((2, 2, 5, 7)) > 0.3
    out = []
    for p, show in ((0.2, True), (0.5, False)):
        g = bwd(T(q), T(k), T(v), T(do), dropout_mask=T(keep), dropout_p=p)
        out.append((differ if show else same)(f"dropout p={p}", g, ref_grads(q, k, v, do, keep=keep, p=p)))
    return out


# ---------------------------------------------------------------------------------------------------------------
# backward, correct


def w_okbwd_autograd_function_saves_weights():
    fn = case("okbwd_autograd_function_saves_weights").attention
    q, k, v = qkv()
    do = d_out_for(q, v)
    m = allow_mask((*q.shape[:-1], 7), empty_row=True)
    q3, k3, v3 = qkv(b=None, n_q=6, n_k=3)
    do3 = d_out_for(q3, v3)
    return [
        same("masked, an empty row", autograd_grads(fn, q, k, v, do, mask=T(m)), ref_grads(q, k, v, do, m)),
        same("3-D, n_q > n_k", autograd_grads(fn, q3, k3, v3, do3), ref_grads(q3, k3, v3, do3)),
    ]


def w_okbwd_flash_tiled_numpy():
    q, k, v = qkv(n_q=20, n_k=37)
    do = d_out_for(q, v)
    m = allow_mask((*q.shape[:-1], 37), empty_row=True)
    out, g = _flash("okbwd_flash_tiled_numpy", q, k, v, do, fwd="flash_fwd", bwd="flash_bwd", mask=m)
    keys = np.arange(37) < 30  # a key-padding mask passed as [n_k]
    _, g_keys = _flash("okbwd_flash_tiled_numpy", q, k, v, do, fwd="flash_fwd", bwd="flash_bwd", mask=keys)
    return [
        same("forward, 2 x 3 tiles", out, ref(q, k, v, m)),
        same("gradients", g, ref_grads(q, k, v, do, m)),
        same("gradients, an [n_k] mask", g_keys, ref_grads(q, k, v, do, keys)),
    ]


def w_okbwd_gqa_native_group_sum():
    mod = case("okbwd_gqa_native_group_sum")
    out = []
    for h_kv in (2, 1):
        q, k, v = qkv(h=4, h_kv=h_kv)
        do = d_out_for(q, v)
        m = allow_mask((2, 4, 5, 7), empty_row=True)
        out.append(same(f"forward, h_kv={h_kv}", mod.attention(q, k, v, m), ref(q, k, v, m)))
        out.append(same(f"gradients, h_kv={h_kv}", mod.attention_bwd(q, k, v, do, m), ref_grads(q, k, v, do, m)))
    return out


def w_okbwd_dropout_keep_mask_torch():
    bwd = _plain("okbwd_dropout_keep_mask_torch")
    q, k, v = qkv()
    do = d_out_for(q, v)
    keep = np.random.default_rng(9).random((2, 2, 5, 7)) > 0.3
    m = allow_mask((*q.shape[:-1], 7), empty_row=True)
    g = bwd(T(q), T(k), T(v), T(do), mask=T(m), dropout_mask=T(keep), dropout_p=0.3)
    return [same("masked, dropout p=0.3", g, ref_grads(q, k, v, do, m, keep=keep, p=0.3))]


def w_okbwd_jax_masked_rows_zero():
    import jax.numpy as jnp

    mod = case("okbwd_jax_masked_rows_zero")
    q, k, v = qkv()
    do = d_out_for(q, v)
    m = allow_mask((*q.shape[:-1], 7), empty_row=True)
    j = [jnp.asarray(t, dtype=jnp.float32) for t in (q, k, v, do)]
    g = [np.asarray(x) for x in mod.attention_bwd(*j, mask=jnp.asarray(m))]
    return [
        same("forward", np.asarray(mod.attention(*j[:3], jnp.asarray(m))), ref(q, k, v, m), tol=1e-5),
        same("gradients", g, ref_grads(q, k, v, do, m), tol=1e-5),
    ]


def w_okbwd_safe_softmax_autograd():
    fn = case("okbwd_safe_softmax_autograd").attention
    q, k, v = qkv()
    do = d_out_for(q, v)
    m = allow_mask((*q.shape[:-1], 7), empty_row=True)
    return [
        same("forward", fn(T(q), T(k), T(v), T(m)), ref(q, k, v, m)),
        same("masked, an empty row", autograd_grads(fn, q, k, v, do, mask=T(m)), ref_grads(q, k, v, do, m)),
        same("no mask", autograd_grads(fn, q, k, v, do), ref_grads(q, k, v, do)),
    ]


#: Each case's witness: a function returning its comparisons.
WITNESSES: dict[str, Callable[[], list[Comparison]]] = {
    name[2:]: fn for name, fn in dict(globals()).items() if name.startswith("w_") and callable(fn)
}


def verify(name: str) -> list[Comparison]:
    """The comparisons of case ``name`` on its concrete inputs."""
    return WITNESSES[name]()
