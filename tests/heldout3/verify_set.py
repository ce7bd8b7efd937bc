"""Checks the held-out set itself, without the checker: every correct case matches a float64 reference on the inputs
below, and every buggy case differs from it on at least one concrete input stated here (and, where the bug is
input-specific, matches on an input where it does not show).

The forward reference is float64 NumPy with an explicit boolean "may attend" matrix (rows with no allowed key follow a
named policy); the gradient reference is torch float64 autograd of the same computation. Neither uses attnlab.

``verify(name)`` returns the comparisons for one case; ``WITNESSES`` maps each case name to the function that builds
them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import torch

from . import load_cases

#: Two results are "the same" within this (float64 inputs; float32/16 comparisons pass their own).
SAME_RTOL, SAME_ATOL = 1e-6, 1e-8
#: Two results "differ" when they are not close even to this looser rule (NaN never is).
DIFF_RTOL, DIFF_ATOL = 1e-3, 1e-4


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One concrete input: what the case returned, what the reference says, and whether they must agree."""

    label: str
    actual: tuple[np.ndarray, ...]
    expected: tuple[np.ndarray, ...]
    same: bool
    rtol: float = SAME_RTOL
    atol: float = SAME_ATOL

    def agrees(self, rtol: float, atol: float) -> bool:
        """All arrays have the reference's shape and are close to it (NaN only where the reference has NaN)."""
        if len(self.actual) != len(self.expected):
            return False
        for a, e in zip(self.actual, self.expected, strict=True):
            a, e = np.asarray(a, dtype=np.float64), np.asarray(e, dtype=np.float64)
            if a.shape != e.shape or not np.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True):
                return False
        return True

    def holds(self) -> bool:
        """A "same" comparison agrees under its own rule; a "differ" one disagrees even under the loose rule."""
        return self.agrees(self.rtol, self.atol) if self.same else not self.agrees(DIFF_RTOL, DIFF_ATOL)


# ---------------------------------------------------------------------------------------------------------- references


def causal(n_q: int, n_k: int, align: str) -> np.ndarray:
    """Bool `[n_q, n_k]`: query i may see key j iff j <= i (top_left) or j <= i + n_k - n_q (bottom_right)."""
    offset = 0 if align == "top_left" else n_k - n_q
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + offset


def lengths_mask(lengths, n_k: int) -> np.ndarray:
    """Bool `[B, n_k]`: the first lengths[b] keys of sequence b are real."""
    return np.arange(n_k)[None, :] < np.asarray(lengths)[:, None]


def ref_attention(q, k, v, allowed=None, scale=None, bias=None, masked="zeros", with_lse=False):
    """Float64 `softmax(q k^T * scale + bias | allowed) v` over `[..., n, d]`; K/V heads expanded for GQA.

    Rows with no allowed key are 0 (``zeros``), the mean of V (``uniform``) or NaN (``nan``).
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if q.ndim == 4 and k.shape[1] != q.shape[1]:
        g = q.shape[1] // k.shape[1]
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("...id,...jd->...ij", q, k) * scale
    if bias is not None:
        s = s + bias
    allowed = np.ones(s.shape, bool) if allowed is None else np.broadcast_to(allowed, s.shape)
    s = np.where(allowed, s, -np.inf)
    has = allowed.any(axis=-1, keepdims=True)
    m = np.where(has, s.max(axis=-1, keepdims=True), 0)
    e = np.where(allowed, np.exp(s - m), 0)
    total = e.sum(axis=-1, keepdims=True)
    p = e / np.where(has, total, 1)
    out = np.einsum("...ij,...jd->...id", p, v)
    empty = ~has[..., 0]
    if masked == "uniform":
        out = np.where(empty[..., None], np.broadcast_to(v.mean(axis=-2, keepdims=True), out.shape), out)
    elif masked == "nan":
        out = np.where(empty[..., None], np.nan, out)
    if with_lse:
        return out, np.where(empty, -np.inf, (m + np.log(np.where(has, total, 1)))[..., 0])
    return out


def ref_grads(q, k, v, d_out, allowed=None, scale=None, bias=None, keep=None, dropout_p=0.0):
    """(dq, dk, dv[, d_bias]) of `ref_attention` (rows with no key give 0), by torch float64 autograd.

    ``keep`` is a dropout keep mask (True = kept) applied to the weights with the 1/(1-p) scale.
    """
    leaves = [torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=True) for x in (q, k, v)]
    tq, tk, tv = leaves
    if tq.ndim == 4 and tk.shape[1] != tq.shape[1]:
        g = tq.shape[1] // tk.shape[1]
        tk, tv = tk.repeat_interleave(g, dim=1), tv.repeat_interleave(g, dim=1)
    scale = 1.0 / math.sqrt(tq.shape[-1]) if scale is None else scale
    s = tq @ tk.transpose(-2, -1) * scale
    tb = None
    if bias is not None:
        tb = torch.tensor(np.asarray(bias, dtype=np.float64), requires_grad=True)
        s = s + tb
    allowed_t = (
        torch.ones(s.shape, dtype=torch.bool)
        if allowed is None
        else torch.from_numpy(np.array(np.broadcast_to(allowed, s.shape)))
    )
    has = allowed_t.any(dim=-1, keepdim=True)
    s = torch.where(has, s.masked_fill(~allowed_t, float("-inf")), torch.zeros_like(s))
    p = torch.softmax(s, dim=-1) * has
    if keep is not None:
        p = p * torch.from_numpy(np.asarray(keep)).to(p.dtype) / (1.0 - dropout_p)
    out = p @ tv
    out.backward(torch.tensor(np.asarray(d_out, dtype=np.float64)))
    grads = tuple(x.grad.numpy() for x in leaves)
    return grads + ((tb.grad.numpy(),) if tb is not None else ())


# ------------------------------------------------------------------------------------------------------------- inputs


def rand(*shape, seed=0, scale=1.0):
    """Float64 normal draws of the given shape."""
    return np.random.default_rng(seed).standard_normal(shape) * scale


def qkv(B=2, h=2, n_q=5, n_k=7, d=8, d_v=None, h_kv=None, seed=0):
    """q `[B, h, n_q, d]`, k `[B, h_kv, n_k, d]`, v `[B, h_kv, n_k, d_v]` in float64."""
    h_kv = h if h_kv is None else h_kv
    d_v = d if d_v is None else d_v
    return rand(B, h, n_q, d, seed=seed), rand(B, h_kv, n_k, d, seed=seed + 1), rand(B, h_kv, n_k, d_v, seed=seed + 2)


def random_allowed(shape, seed=3, empty_row=None):
    """A random bool "may attend" mask with every row allowed at least one key, except ``empty_row`` (an index)."""
    m = np.random.default_rng(seed).random(shape) < 0.6
    m[..., 0] |= ~m.any(axis=-1)
    if empty_row is not None:
        m[empty_row] = False
    return m


def T(x):
    """A torch tensor of a NumPy array (no copy)."""
    return torch.from_numpy(np.asarray(x))


def A(x):
    """A NumPy array from a tensor, an array or a JAX array."""
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def bnhd(x):
    """`[B, h, n, d]` <-> `[B, n, h, d]`."""
    return np.swapaxes(x, 1, 2)


def same(label, actual, expected, **tol):
    """A comparison that must agree."""
    return Comparison(label, _tup(actual), _tup(expected), True, **tol)


def differ(label, actual, expected):
    """A comparison that must disagree (the bug's witness)."""
    return Comparison(label, _tup(actual), _tup(expected), False)


def _tup(x):
    return tuple(A(a) for a in x) if isinstance(x, tuple | list) else (A(x),)


# ----------------------------------------------------------------------------------------------------------- witnesses

WITNESSES: dict[str, Callable[..., list[Comparison]]] = {}


def witness(name):
    """Register the comparisons of one case file."""

    def register(fn):
        WITNESSES[name] = fn
        return fn

    return register


def verify(name: str) -> list[Comparison]:
    """The comparisons of one case (its target and backward loaded fresh)."""
    case = {c.name: c for c in load_cases()}[name]
    with np.errstate(all="ignore"):
        return WITNESSES[name](case)


# forward, buggy --------------------------------------------------------------------------------------------------


@witness("fwd_decode_causal_flag_top_left")
def _(case):
    f = case.target
    q, k, v = qkv(n_q=1, n_k=5)
    q2, k2, v2 = qkv(n_q=6, n_k=6)
    return [
        differ(
            "decode n_q=1, n_k=5, causal",
            f(T(q), T(k), T(v), is_causal=True),
            ref_attention(q, k, v, causal(1, 5, "bottom_right")),
        ),
        same(
            "square causal",
            f(T(q2), T(k2), T(v2), is_causal=True),
            ref_attention(q2, k2, v2, causal(6, 6, "bottom_right")),
        ),
    ]


@witness("fwd_bottom_right_flag_declared_top_left")
def _(case):
    f = case.target
    q, k, v = qkv(n_q=3, n_k=6)
    q2, k2, v2 = qkv(n_q=6, n_k=6)
    return [
        differ(
            "n_q=3, n_k=6, causal",
            bnhd(f(bnhd(q), bnhd(k), bnhd(v), causal=True)),
            ref_attention(q, k, v, causal(3, 6, "top_left")),
        ),
        same(
            "square causal",
            bnhd(f(bnhd(q2), bnhd(k2), bnhd(v2), causal=True)),
            ref_attention(q2, k2, v2, causal(6, 6, "top_left")),
        ),
    ]


@witness("fwd_decode_step_drops_padding_mask")
def _(case):
    f = case.target
    kpm = lengths_mask([3, 7], 7)
    allowed = kpm[:, None, None, :]
    q, k, v = qkv(n_q=4, n_k=7)
    q1 = q[:, :, :1]
    return [
        differ(
            "decode n_q=1, lengths 3 and 7",
            f(T(q1), T(k), T(v), key_padding_mask=T(kpm)),
            ref_attention(q1, k, v, allowed),
        ),
        same("prefill n_q=4", f(T(q), T(k), T(v), key_padding_mask=T(kpm)), ref_attention(q, k, v, allowed)),
    ]


@witness("fwd_padding_mask_broadcast_over_queries")
def _(case):
    f = case.target
    q, k, v = qkv(n_q=6, n_k=6)
    kpm = lengths_mask([4, 6], 6)
    full = np.ones((2, 6), bool)
    return [
        differ("lengths 4 and 6", f(T(q), T(k), T(v), mask=T(kpm)), ref_attention(q, k, v, kpm[:, None, None, :])),
        same("no padding", f(T(q), T(k), T(v), mask=T(full)), ref_attention(q, k, v)),
    ]


@witness("fwd_gqa_tile_instead_of_repeat")
def _(case):
    f = case.target
    q, k, v = qkv(h=4, h_kv=2)
    q2, k2, v2 = qkv(h=2)
    return [
        differ("GQA 4 -> 2", f(T(q), T(k), T(v)), ref_attention(q, k, v)),
        same("no GQA", f(T(q2), T(k2), T(v2)), ref_attention(q2, k2, v2)),
    ]


@witness("fwd_scale_by_n_embd")
def _(case):
    f = case.target
    q, k, v = qkv(h=4)
    q1, k1, v1 = qkv(h=1)
    return [
        differ("4 heads", f(q, k, v), ref_attention(q, k, v)),
        same("1 head", f(q1, k1, v1), ref_attention(q1, k1, v1)),
    ]


@witness("fwd_mask_filled_after_softmax")
def _(case):
    f = case.target
    q, k, v = qkv()
    allowed = random_allowed((2, 2, 5, 7))
    return [
        differ("random mask", f(T(q), T(k), T(v), attn_mask=T(allowed)), ref_attention(q, k, v, allowed)),
        same("no mask", f(T(q), T(k), T(v)), ref_attention(q, k, v)),
    ]


@witness("fwd_scores_multiplied_by_mask")
def _(case):
    f = case.target
    q, k, v = qkv()
    allowed = random_allowed((2, 2, 5, 7))
    return [
        differ("random mask", f(q, k, v, allowed), ref_attention(q, k, v, allowed)),
        same("no mask", f(q, k, v), ref_attention(q, k, v)),
    ]


@witness("fwd_mask_multiplied_after_softmax")
def _(case):
    f = case.target
    q, k, v = qkv()
    allowed = random_allowed((2, 2, 5, 7))
    return [
        differ("random mask", f(T(q), T(k), T(v), mask=T(allowed)), ref_attention(q, k, v, allowed)),
        same("no mask", f(T(q), T(k), T(v)), ref_attention(q, k, v)),
    ]


@witness("fwd_k_mask_constant_float16")
def _(case):
    import jax
    import jax.numpy as jnp

    f = jax.jit(case.target)  # one compilation per dtype instead of one per operation
    q, k, v = qkv()
    allowed = random_allowed((2, 2, 5, 7), empty_row=(0, 1, 2))
    q32, k32, v32 = (jnp.asarray(x, dtype=jnp.float32) for x in (q, k, v))
    q16, k16, v16 = (jnp.asarray(x, dtype=jnp.float16) for x in (q, k, v))
    ref = ref_attention(q32, k32, v32, allowed, masked="uniform")
    out16 = np.asarray(f(q16, k16, v16, mask=jnp.asarray(allowed)), dtype=np.float64)
    return [
        same(
            "float32, one query of (b0, h1) fully masked: a uniform row",
            f(q32, k32, v32, mask=jnp.asarray(allowed)),
            ref,
            rtol=1e-4,
            atol=1e-5,
        ),
        differ("float16, the same row is NaN", out16[0, 1, 2], ref[0, 1, 2]),
        same(
            "float16, the other rows",
            np.delete(out16.reshape(-1, 8), 7, axis=0),
            np.delete(ref.reshape(-1, 8), 7, axis=0),
            rtol=2e-2,
            atol=2e-2,
        ),
    ]


@witness("fwd_blockwise_lse_merge_overflow")
def _(case):
    f = case.target
    d, n_k = 8, 40
    a = math.sqrt(1000 / math.sqrt(d))  # q . k / sqrt(d) = 1000 for q = k = a * ones
    q = np.full((1, 1, 3, d), a) + rand(1, 1, 3, d, seed=5, scale=1e-3)
    k = np.full((1, 1, n_k, d), a) + rand(1, 1, n_k, d, seed=6, scale=1e-3)
    v = rand(1, 1, n_k, d, seed=7)
    q2, k2, v2 = qkv(n_k=n_k)
    return [
        differ("logits about +1000", f(q, k, v), ref_attention(q, k, v)),
        same("ordinary logits, 2 blocks", f(q2, k2, v2), ref_attention(q2, k2, v2)),
    ]


@witness("fwd_softmax_dim2_written_for_3d")
def _(case):
    f = case.target
    q, k, v = qkv()
    return [
        differ("4-D [B, h, n, d]", f(T(q), T(k), T(v)), ref_attention(q, k, v)),
        same("3-D [h, n, d]", f(T(q[0]), T(k[0]), T(v[0])), ref_attention(q[0], k[0], v[0])),
    ]


@witness("fwd_sdpa_dropout_in_eval")
def _(case):
    f = case.target
    q, k, v = (T(x) for x in qkv(n_q=6, n_k=6))
    torch.manual_seed(0)
    first, second = f(q, k, v), f(q, k, v)
    return [
        differ("the same call twice", first, second),
        differ("against the reference", first, ref_attention(A(q), A(k), A(v))),
    ]


@witness("fwd_kv_cache_not_reset")
def _(case):
    f = type(case.target)()  # a fresh layer: the module's instance keeps state between tests
    qa, ka, va = qkv(seed=0)
    qb, kb, vb = qkv(seed=20)
    first = f(T(qa), T(ka), T(va))
    second = f(T(qb), T(kb), T(vb))
    third = f(T(qb), T(kb), T(vb))
    return [
        same("first call", first, ref_attention(qa, ka, va)),
        differ("a second sequence of the same shape", second, ref_attention(qb, kb, vb)),
        differ("that call repeated", third, second),
    ]


@witness("fwd_padding_mask_repeat_not_interleave")
def _(case):
    f = case.target
    q, k, v = qkv()
    pad = ~lengths_mask([3, 7], 7)
    q1, k1, v1 = (x[:1] for x in (q, k, v))
    return [
        differ(
            "B=2, h=2, lengths 3 and 7",
            f(T(q), T(k), T(v), key_padding_mask=T(pad)),
            ref_attention(q, k, v, ~pad[:, None, None, :]),
        ),
        same(
            "B=1",
            f(T(q1), T(k1), T(v1), key_padding_mask=T(pad[:1])),
            ref_attention(q1, k1, v1, ~pad[:1, None, None, :]),
        ),
    ]


def _kv_cache_allowed(lengths, n_q, n_k, is_causal):
    L = np.asarray(lengths)[:, None, None, None]
    j = np.arange(n_k)[None, None, None, :]
    i = np.arange(n_q)[None, None, :, None]
    allowed = j < L
    return allowed & (j <= L - n_q + i) if is_causal else allowed


@witness("fwd_kv_cache_assumes_left_padding")
def _(case):
    f = case.target
    q, k, v = qkv(h=4, h_kv=2, n_q=2, n_k=7)
    lens = torch.tensor([3, 7], dtype=torch.int32)
    full = torch.tensor([7, 7], dtype=torch.int32)
    call = lambda seqlens: bnhd(A(f(T(bnhd(q)), T(bnhd(k)), T(bnhd(v)), cache_seqlens=seqlens, causal=True)))  # noqa: E731
    return [
        differ("cache lengths 3 and 7", call(lens), ref_attention(q, k, v, _kv_cache_allowed([3, 7], 2, 7, True))),
        same("full caches", call(full), ref_attention(q, k, v, _kv_cache_allowed([7, 7], 2, 7, True))),
    ]


def _varlen(f, lq, lk, h=4, h_kv=2, d=8, is_causal=False, seed=0):
    """Pack sequences, call ``f``, and return (outputs, references) concatenated."""
    outs_ref = []
    qs, ks, vs = [], [], []
    for b, (a, c) in enumerate(zip(lq, lk, strict=True)):
        q, k, v = qkv(B=1, h=h, h_kv=h_kv, n_q=a, n_k=c, d=d, seed=seed + 10 * b)
        qs.append(bnhd(q)[0])
        ks.append(bnhd(k)[0])
        vs.append(bnhd(v)[0])
        allowed = causal(a, c, "bottom_right") if is_causal else None
        outs_ref.append(bnhd(ref_attention(q, k, v, allowed))[0])
    cu_q = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    out = f(np.concatenate(qs), np.concatenate(ks), np.concatenate(vs), cu_q, cu_k, max(lq), max(lk), causal=is_causal)
    return out, np.concatenate(outs_ref)


@witness("fwd_varlen_causal_top_left")
def _(case):
    f = case.target
    return [
        differ("causal, L_q = 2, 3 and L_k = 5, 3", *_varlen(f, [2, 3], [5, 3], is_causal=True)),
        same("not causal", *_varlen(f, [2, 3], [5, 3])),
        same("causal, L_q = L_k", *_varlen(f, [4, 3], [4, 3], is_causal=True)),
    ]


@witness("fwd_key_padding_true_read_as_keep")
def _(case):
    f = case.target
    q, k, v = qkv()
    pad = ~lengths_mask([3, 7], 7)
    return [
        differ(
            "padding after 3 keys in batch 0",
            f(T(q), T(k), T(v), key_padding_mask=T(pad)),
            ref_attention(q, k, v, ~pad[:, None, None, :]),
        ),
        same("no mask", f(T(q), T(k), T(v)), ref_attention(q, k, v)),
    ]


@witness("fwd_split_heads_view_without_transpose")
def _(case):
    f = case.target
    q, k, v = qkv(h=3)
    q1, k1, v1 = qkv(h=1)
    return [
        differ("3 heads", bnhd(A(f(T(bnhd(q)), T(bnhd(k)), T(bnhd(v))))), ref_attention(q, k, v)),
        same("1 head", bnhd(A(f(T(bnhd(q1)), T(bnhd(k1)), T(bnhd(v1))))), ref_attention(q1, k1, v1)),
    ]


# forward, correct ------------------------------------------------------------------------------------------------


@witness("ok_mean_centred_keys")
def _(case):
    f = case.target
    q, k, v = qkv(d_v=5)
    allowed = random_allowed((2, 2, 5, 7), empty_row=(1, 0, 3))
    q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
    return [
        same("random mask, one empty row", f(q, k, v, allowed), ref_attention(q, k, v, allowed)),
        same("float32", f(q32, k32, v32), ref_attention(q32, k32, v32), rtol=1e-4, atol=1e-5),
    ]


@witness("ok_logsumexp_softmax")
def _(case):
    f = case.target
    q, k, v = qkv(n_q=6, n_k=9)
    allowed = random_allowed((2, 2, 6, 9), empty_row=(0, 1, 0))
    big_q = q * 300  # logits in the thousands
    return [
        same("mask, empty row, scale 0.3", f(q, k, v, allowed, scale=0.3), ref_attention(q, k, v, allowed, scale=0.3)),
        same("large logits", f(big_q, k, v), ref_attention(big_q, k, v)),
    ]


@witness("ok_tiled_online_softmax")
def _(case):
    f = case.target
    q, k, v = qkv(n_q=5, n_k=40, d_v=6)
    allowed = random_allowed((2, 2, 5, 40), empty_row=(1, 1, 0))
    both = allowed & causal(5, 40, "bottom_right")
    return [
        same(
            "mask over 3 blocks (out, lse)",
            f(T(q), T(k), T(v), mask=T(allowed)),
            ref_attention(q, k, v, allowed, with_lse=True),
        ),
        same(
            "mask and causal",
            f(T(q), T(k), T(v), mask=T(allowed), causal=True),
            ref_attention(q, k, v, both, with_lse=True),
        ),
    ]


@witness("ok_sdpa_bnhd_gqa_wrapper")
def _(case):
    f = case.target
    q, k, v = qkv(h=4, h_kv=2, n_q=6, n_k=6)
    allowed = random_allowed((2, 4, 6, 6))
    call = lambda **kw: bnhd(A(f(T(bnhd(q)), T(bnhd(k)), T(bnhd(v)), **kw)))  # noqa: E731
    return [
        same("GQA with a mask", call(attn_mask=T(allowed)), ref_attention(q, k, v, allowed)),
        same("GQA causal", call(is_causal=True), ref_attention(q, k, v, causal(6, 6, "top_left"))),
    ]


@witness("ok_kv_cache_decode_gqa")
def _(case):
    f = case.target
    q, k, v = qkv(h=4, h_kv=2, n_q=2, n_k=7)
    out = f(T(bnhd(q)), T(bnhd(k)), T(bnhd(v)), cache_seqlens=torch.tensor([3, 7], dtype=torch.int32), causal=True)
    return [
        same(
            "cache lengths 3 and 7, causal", bnhd(A(out)), ref_attention(q, k, v, _kv_cache_allowed([3, 7], 2, 7, True))
        )
    ]


@witness("ok_varlen_packed_bottom_right")
def _(case):
    f = case.target
    return [
        same("causal, L_q = 2, 3, 1 and L_k = 5, 3, 4", *_varlen(f, [2, 3, 1], [5, 3, 4], is_causal=True)),
        same("not causal", *_varlen(f, [2, 3], [5, 3])),
    ]


@witness("ok_additive_batch_mask_float32_softmax")
def _(case):
    f = case.target
    q, k, v = qkv()
    allowed = random_allowed((2, 1, 5, 7))
    additive = np.where(allowed, 0.0, np.finfo(np.float32).min)
    return [
        same(
            "additive [B, 1, n_q, n_k]",
            f(T(q), T(k), T(v), attention_mask=T(additive)),
            ref_attention(q, k, v, allowed),
        )
    ]


@witness("ok_softcap_optional")
def _(case):
    f = case.target
    q, k, v = qkv()
    allowed = random_allowed((2, 2, 5, 7), empty_row=(0, 0, 0))
    return [
        same("mask with an empty row", f(T(q), T(k), T(v), attn_mask=T(allowed)), ref_attention(q, k, v, allowed)),
        same("scale 0.5", f(T(q), T(k), T(v), scale=0.5), ref_attention(q, k, v, scale=0.5)),
    ]


@witness("ok_nan_rows_declared")
def _(case):
    f = case.target
    q, k, v = qkv()
    allowed = random_allowed((2, 2, 5, 7), empty_row=(1, 1, 4))
    return [same("mask, one empty row (NaN)", f(q, k, v, allowed), ref_attention(q, k, v, allowed, masked="nan"))]


@witness("ok_keep_int_mask_dtype_min")
def _(case):
    f = case.target
    q, k, v = qkv()
    allowed = random_allowed((2, 2, 5, 7), empty_row=(0, 1, 1))
    keep = T(allowed.astype(np.int64))
    q16, k16, v16 = (T(x.astype(np.float16)) for x in (q, k, v))
    return [
        same(
            "int mask, one empty row (uniform)",
            f(T(q), T(k), T(v), attention_mask=keep),
            ref_attention(q, k, v, allowed, masked="uniform"),
        ),
        same(
            "float16",
            f(q16, k16, v16, attention_mask=keep),
            ref_attention(A(q16), A(k16), A(v16), allowed, masked="uniform"),
            rtol=2e-2,
            atol=2e-2,
        ),
    ]


# backward --------------------------------------------------------------------------------------------------------


def _plain(bwd, q, k, v, d_out, to=np.asarray, **kw):
    return bwd(*(to(x) for x in (q, k, v, d_out)), **kw)


def _flash(case, q, k, v, d_out, to=np.asarray, **kw):
    tq, tk, tv, td = (to(x) for x in (q, k, v, d_out))
    out, lse = case.target(tq, tk, tv, **kw)
    return case.backward(tq, tk, tv, out, lse, td, **kw)


def _grad_inputs(n_q=5, n_k=7, h=2, h_kv=None, d_v=6, seed=0):
    q, k, v = qkv(n_q=n_q, n_k=n_k, h=h, h_kv=h_kv, d_v=d_v, seed=seed)
    return q, k, v, rand(*q.shape[:-1], d_v, seed=seed + 9)


@witness("bwd_dropout_scaled_by_p")
def _(case):
    q, k, v, g = _grad_inputs()
    keep = np.random.default_rng(4).random((2, 2, 5, 7)) > 0.2
    return [
        differ(
            "dropout p=0.2",
            _plain(case.backward, q, k, v, g, dropout_mask=keep, dropout_p=0.2),
            ref_grads(q, k, v, g, keep=keep, dropout_p=0.2),
        ),
        same("no dropout", _plain(case.backward, q, k, v, g), ref_grads(q, k, v, g)),
    ]


@witness("bwd_flash_mask_not_forwarded")
def _(case):
    q, k, v, g = _grad_inputs()
    allowed = random_allowed((2, 2, 5, 7))
    return [
        differ("random mask", _flash(case, q, k, v, g, mask=allowed), ref_grads(q, k, v, g, allowed)),
        same("no mask", _flash(case, q, k, v, g), ref_grads(q, k, v, g)),
    ]


@witness("bwd_flash_causal_missing")
def _(case):
    q, k, v, g = _grad_inputs(n_q=6, n_k=6)
    allowed = random_allowed((2, 2, 6, 6))
    return [
        differ(
            "causal", _flash(case, q, k, v, g, to=T, causal=True), ref_grads(q, k, v, g, causal(6, 6, "bottom_right"))
        ),
        same("mask, not causal", _flash(case, q, k, v, g, to=T, mask=T(allowed)), ref_grads(q, k, v, g, allowed)),
    ]


@witness("bwd_flash_lse_read_as_log2")
def _(case):
    q, k, v, g = _grad_inputs()
    fwd_out, fwd_lse = case.target(q, k, v)
    ref_out, ref_lse = ref_attention(q, k, v, with_lse=True)
    return [
        same("the forward (out, lse in nats)", (fwd_out, fwd_lse), (ref_out, ref_lse)),
        differ("gradients", _flash(case, q, k, v, g), ref_grads(q, k, v, g)),
    ]


@witness("bwd_dk_missing_scale")
def _(case):
    q, k, v, g = _grad_inputs()
    dq, dk, dv = _plain(case.backward, q, k, v, g, to=T)
    rq, rk, rv = ref_grads(q, k, v, g)
    return [same("dq and dv", (dq, dv), (rq, rv)), differ("dk", dk, rk)]


@witness("bwd_jacobian_term_dropped")
def _(case):
    q, k, v, g = _grad_inputs()
    return [differ("gradients", _plain(case.backward, q, k, v, g), ref_grads(q, k, v, g))]


@witness("bwd_delta_from_dp")
def _(case):
    q, k, v, g = _grad_inputs()
    dq, dk, dv = _plain(case.backward, q, k, v, g, to=T)
    rq, rk, rv = ref_grads(q, k, v, g)
    return [same("dv", dv, rv), differ("dq and dk", (dq, dk), (rq, rk))]


@witness("bwd_dv_unnormalised_p")
def _(case):
    q, k, v, g = _grad_inputs()
    dq, dk, dv = _flash(case, q, k, v, g)
    rq, rk, rv = ref_grads(q, k, v, g)
    return [same("dq and dk", (dq, dk), (rq, rk)), differ("dv", dv, rv)]


@witness("bwd_gqa_first_head_only")
def _(case):
    q, k, v, g = _grad_inputs(h=4, h_kv=2)
    q2, k2, v2, g2 = _grad_inputs()
    return [
        differ("GQA 4 -> 2", _plain(case.backward, q, k, v, g, to=T), ref_grads(q, k, v, g)),
        same("no GQA", _plain(case.backward, q2, k2, v2, g2, to=T), ref_grads(q2, k2, v2, g2)),
    ]


@witness("bwd_tiled_dq_overwritten")
def _(case):
    q, k, v, g = _grad_inputs(n_k=40)
    q2, k2, v2, g2 = _grad_inputs(n_k=16)
    return [
        differ("n_k = 40 (3 blocks)", _flash(case, q, k, v, g), ref_grads(q, k, v, g)),
        same("n_k = 16 (1 block)", _flash(case, q2, k2, v2, g2), ref_grads(q2, k2, v2, g2)),
    ]


@witness("bwd_flash_masked_row_nan")
def _(case):
    q, k, v, g = _grad_inputs()
    empty = random_allowed((2, 2, 5, 7), empty_row=(0, 0, 1))
    allowed = random_allowed((2, 2, 5, 7))
    return [
        differ("one empty row", _flash(case, q, k, v, g, mask=empty), ref_grads(q, k, v, g, empty)),
        same("no empty row", _flash(case, q, k, v, g, mask=allowed), ref_grads(q, k, v, g, allowed)),
    ]


def _autograd(fn, q, k, v, g, **kw):
    leaves = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    fn(*leaves, **kw).backward(T(g))
    return tuple(x.grad for x in leaves)


@witness("bwd_autograd_function_delta_layout")
def _(case):
    q, k, v, g = _grad_inputs(h=3)
    q1, k1, v1, g1 = _grad_inputs(h=1)
    out = case.target(T(q), T(k), T(v))
    return [
        same("the forward", out, ref_attention(q, k, v)),
        differ("gradients, 3 heads", _autograd(case.target, q, k, v, g), ref_grads(q, k, v, g)),
        same("gradients, 1 head", _autograd(case.target, q1, k1, v1, g1), ref_grads(q1, k1, v1, g1)),
    ]


@witness("bwd_dropout_only_in_dv")
def _(case):
    q, k, v, g = _grad_inputs()
    keep = np.random.default_rng(4).random((2, 2, 5, 7)) > 0.2
    return [
        differ(
            "dropout p=0.2",
            _plain(case.backward, q, k, v, g, to=T, dropout_mask=T(keep), dropout_p=0.2),
            ref_grads(q, k, v, g, keep=keep, dropout_p=0.2),
        ),
        same("no dropout", _plain(case.backward, q, k, v, g, to=T), ref_grads(q, k, v, g)),
    ]


@witness("okbwd_numpy_analytic_scale")
def _(case):
    q, k, v, g = _grad_inputs()
    allowed = random_allowed((2, 2, 5, 7), empty_row=(1, 0, 2))
    return [
        same(
            "mask with an empty row, scale 0.7",
            _plain(case.backward, q, k, v, g, mask=allowed, scale=0.7),
            ref_grads(q, k, v, g, allowed, scale=0.7),
        )
    ]


@witness("okbwd_flash_tiled_causal")
def _(case):
    q, k, v, g = _grad_inputs(n_q=9, n_k=40)
    allowed = random_allowed((2, 2, 9, 40), empty_row=(0, 1, 3))
    both = allowed & causal(9, 40, "bottom_right")
    q2, k2, v2, g2 = _grad_inputs(n_q=40, n_k=33)
    return [
        same(
            "mask and causal, 3 key blocks",
            _flash(case, q, k, v, g, mask=allowed, causal=True),
            ref_grads(q, k, v, g, both),
        ),
        same(
            "causal with n_q > n_k",
            _flash(case, q2, k2, v2, g2, causal=True),
            ref_grads(q2, k2, v2, g2, causal(40, 33, "bottom_right")),
        ),
    ]


@witness("okbwd_flash_lse_log2_declared")
def _(case):
    q, k, v, g = _grad_inputs()
    allowed = random_allowed((2, 2, 5, 7), empty_row=(1, 1, 1))
    out, lse2 = case.target(q, k, v, mask=allowed)
    ref_out, ref_lse = ref_attention(q, k, v, allowed, with_lse=True)
    lse_nats = np.where(np.isfinite(ref_lse), ref_lse, np.inf)  # flash-attn's +inf on an empty row
    return [
        same("out, lse in log2", (out, lse2), (ref_out, lse_nats / math.log(2))),
        same("gradients", _flash(case, q, k, v, g, mask=allowed), ref_grads(q, k, v, g, allowed)),
    ]


@witness("okbwd_autograd_function_mask_saved")
def _(case):
    q, k, v, g = _grad_inputs()
    allowed = random_allowed((2, 2, 5, 7), empty_row=(0, 1, 4))
    return [
        same(
            "mask with an empty row",
            _autograd(case.target, q, k, v, g, mask=T(allowed)),
            ref_grads(q, k, v, g, allowed),
        )
    ]


@witness("okbwd_dropout_keep_mask")
def _(case):
    q, k, v, g = _grad_inputs()
    keep = np.random.default_rng(4).random((2, 2, 5, 7)) > 0.3
    allowed = random_allowed((2, 2, 5, 7))
    return [
        same(
            "mask and dropout p=0.3",
            _plain(case.backward, q, k, v, g, mask=allowed, dropout_mask=keep, dropout_p=0.3),
            ref_grads(q, k, v, g, allowed, keep=keep, dropout_p=0.3),
        )
    ]


@witness("okbwd_gqa_group_sum")
def _(case):
    q, k, v, g = _grad_inputs(h=6, h_kv=3)
    allowed = random_allowed((2, 6, 5, 7))
    return [
        same(
            "GQA 6 -> 3 with a mask",
            _plain(case.backward, q, k, v, g, to=T, mask=T(allowed)),
            ref_grads(q, k, v, g, allowed),
        )
    ]


@witness("okbwd_bias_grad")
def _(case):
    q, k, v, g = _grad_inputs()
    bias = rand(2, 2, 5, 7, seed=11)
    allowed = random_allowed((2, 2, 5, 7))
    return [
        same(
            "bias and mask (dq, dk, dv, d_bias)",
            _plain(case.backward, q, k, v, g, mask=allowed, bias=bias),
            ref_grads(q, k, v, g, allowed, bias=bias),
        )
    ]


@witness("fwd_tiled_scale_compounds_per_block")
def _(case):
    f = case.target
    q, k, v = qkv(n_k=40)
    q2, k2, v2 = qkv(n_k=16)
    allowed = random_allowed((2, 2, 5, 16))
    return [
        differ("n_k = 40 (3 blocks)", f(q, k, v), ref_attention(q, k, v)),
        same("n_k = 16 (1 block), masked", f(q2, k2, v2, allowed), ref_attention(q2, k2, v2, allowed)),
    ]


@witness("fwd_scale_applied_twice")
def _(case):
    f = case.target
    q, k, v = qkv()
    return [
        differ("any input", f(T(q), T(k), T(v)), ref_attention(q, k, v)),
        same("q pre-multiplied by sqrt(d_k)", f(T(q * math.sqrt(8)), T(k), T(v)), ref_attention(q, k, v)),
    ]


@witness("fwd_causal_ignore_minus_1e5")
def _(case):
    f = case.target
    q, k, v = qkv(n_q=6, n_k=6)
    big = -np.abs(q) * 3e3  # allowed scores far below -1e5 (q . k / sqrt(d) ~ -1e5 .. -1e6)
    k_pos = np.abs(k) * 30
    return [
        same("ordinary scores", f(T(q), T(k), T(v)), ref_attention(q, k, v, causal(6, 6, "top_left"))),
        differ("scores below -1e5", f(T(big), T(k_pos), T(v)), ref_attention(big, k_pos, v, causal(6, 6, "top_left"))),
    ]


@witness("ok_jax_einsum_bnhd")
def _(case):
    import jax
    import jax.numpy as jnp

    f = jax.jit(case.target, static_argnames="is_causal")  # one compilation per call form
    q, k, v = qkv(n_q=5, n_k=7)
    allowed = random_allowed((2, 2, 5, 7), empty_row=(1, 0, 2))
    args = [jnp.asarray(bnhd(x), dtype=jnp.float32) for x in (q, k, v)]
    tol = {"rtol": 1e-4, "atol": 1e-5}
    return [
        same(
            "mask with an empty row",
            bnhd(A(f(*args, mask=jnp.asarray(allowed)))),
            ref_attention(q, k, v, allowed),
            **tol,
        ),
        same(
            "causal, n_q < n_k (top-left)",
            bnhd(A(f(*args, is_causal=True))),
            ref_attention(q, k, v, causal(5, 7, "top_left")),
            **tol,
        ),
    ]


@witness("bwd_dv_missing_transpose")
def _(case):
    q, k, v, g = _grad_inputs(n_q=6, n_k=6)
    return [differ("square, n_q = n_k = 6", _plain(case.backward, q, k, v, g), ref_grads(q, k, v, g))]


@witness("bwd_flash_causal_top_left")
def _(case):
    q, k, v, g = _grad_inputs(n_q=4, n_k=9)
    q2, k2, v2, g2 = _grad_inputs(n_q=6, n_k=6)
    return [
        differ(
            "causal, n_q = 4, n_k = 9",
            _flash(case, q, k, v, g, to=T, causal=True),
            ref_grads(q, k, v, g, causal(4, 9, "bottom_right")),
        ),
        same(
            "causal, square",
            _flash(case, q2, k2, v2, g2, to=T, causal=True),
            ref_grads(q2, k2, v2, g2, causal(6, 6, "bottom_right")),
        ),
    ]


@witness("fwd_probs_cast_to_bfloat16")
def _(case):
    f = case.target
    q, k, v = qkv(d=16, n_k=40)
    allowed = random_allowed((2, 2, 5, 40))
    ref = ref_attention(q, k, v, allowed)
    q16, k16, v16 = (T(x).to(torch.bfloat16) for x in (q, k, v))
    ref16 = ref_attention(A(q16.float()), A(k16.float()), A(v16.float()), allowed)
    return [
        differ("float64 inputs", f(T(q), T(k), T(v), mask=T(allowed)), ref),
        same(
            "bfloat16 inputs, to bfloat16's precision",
            f(q16, k16, v16, mask=T(allowed)).float(),
            ref16,
            rtol=3e-2,
            atol=3e-2,
        ),
    ]


@witness("fwd_softmax_over_flattened_heads")
def _(case):
    f = case.target
    q, k, v = qkv(h=3)
    q1, k1, v1 = qkv(h=1)
    allowed = random_allowed((2, 1, 5, 7))
    return [
        differ("3 heads", f(T(q), T(k), T(v)), ref_attention(q, k, v)),
        same("1 head, masked", f(T(q1), T(k1), T(v1), mask=T(allowed)), ref_attention(q1, k1, v1, allowed)),
    ]


@witness("okbwd_jax_plain")
def _(case):
    import jax
    import jax.numpy as jnp

    bwd = jax.jit(case.backward)
    q, k, v, g = _grad_inputs()
    allowed = random_allowed((2, 2, 5, 7), empty_row=(0, 0, 3))
    grads = bwd(*(jnp.asarray(x, dtype=jnp.float32) for x in (q, k, v, g)), mask=jnp.asarray(allowed))
    return [same("float32, mask with an empty row", grads, ref_grads(q, k, v, g, allowed), rtol=1e-4, atol=1e-5)]
