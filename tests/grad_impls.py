"""Attention backward passes for the gradient battery's tests: correct ones, and ones with one known bug each.

* :func:`analytic` — a NumPy analytic backward ``bwd(q, k, v, d_out, mask=None, scale=None, causal=False)`` with
  ``bug=`` choosing a mistake (bound with functools.partial into a backward of the plain signature);
* :func:`tiled_forward` / :func:`tiled_backward` — a tiled NumPy FlashAttention-2 forward ``(out, lse)`` and
  backward ``bwd(q, k, v, out, lse, d_out, ...)`` (P recomputed from lse, block by block), ``bug=`` likewise;
* :func:`torch_function` — a custom ``torch.autograd.Function`` whose backward has ``bug=``.

Written from the formulas (article 001 §9, FlashAttention-2 Algorithm 2), not from the checker's hypotheses.
"""

from __future__ import annotations

import math

import numpy as np


def _causal(n_q: int, n_k: int, shift: int = 0) -> np.ndarray:
    i, j = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
    return j <= i + shift


def _expand(x: np.ndarray, h: int) -> np.ndarray:
    return x if x.shape[-3] == h else np.repeat(x, h // x.shape[-3], axis=-3)


def _fold(x: np.ndarray, h_kv: int, how: str = "sum") -> np.ndarray:
    h = x.shape[-3]
    if h == h_kv:
        return x
    g = x.reshape(*x.shape[:-3], h_kv, h // h_kv, *x.shape[-2:])
    if how == "first":
        return g[..., 0, :, :]
    if how == "mean":
        return g.mean(axis=-3)
    return g.sum(axis=-3)


def analytic(
    q, k, v, d_out, mask=None, scale=None, causal=False, dropout_mask=None, dropout_p=0.0, bias=None, *, bug=None
):
    """The §9 backward in NumPy, computed in the inputs' dtype (float32 for float16)."""
    dt = q.dtype
    work = np.float64 if dt == np.float64 else np.float32
    if bug == "mutate":
        d_out *= 0.5  # writes into the caller's array
    q, k, v, do = (np.asarray(x, dtype=work) for x in (q, k, v, d_out))
    h, h_kv = q.shape[-3], k.shape[-3]
    kx, vx = _expand(k, h), _expand(v, h)
    n_q, n_k = q.shape[-2], k.shape[-2]
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(kx, -1, -2) * sc
    if bias is not None and bug != "bias-ignored":
        s = s + np.asarray(bias, dtype=work)
    ok = np.ones(s.shape, bool) if mask is None else np.broadcast_to(mask, s.shape)
    if causal:
        shift = {"causal-off": -1}.get(bug, 0) + (n_k - n_q if causal == "bottom_right" else 0)
        ok = ok & _causal(n_q, n_k, shift)
    if bug == "masked-leak":
        ok = np.ones(s.shape, bool)
    s = np.where(ok, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m)
    den = e.sum(axis=-1, keepdims=True)
    if bug == "masked-row-nan":
        p = e / den
    else:
        p = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
    pd = p
    if dropout_mask is not None:
        pd = p * dropout_mask / (1 - dropout_p) if bug != "dropout-off" else p
    out = pd @ vx
    dv = np.swapaxes(p if bug == "transposed-dv-p" else pd, -1, -2) @ do
    if bug == "transposed-dv":
        dv = pd @ do
    dp = do @ np.swapaxes(vx, -1, -2)
    if dropout_mask is not None and bug != "dropout-off":
        dp = dp * dropout_mask / (1 - dropout_p)
    if bug == "delta-dp":
        delta = dp.sum(axis=-1, keepdims=True)
    elif bug == "delta-p":
        delta = p.sum(axis=-1, keepdims=True)
    else:
        delta = (do * out).sum(axis=-1, keepdims=True)
    ds = p * dp if bug == "jacobian" else p * (dp - delta)
    s_q = 1.0 if bug == "scale-missing" else (sc * sc if bug == "scale-twice" else sc)
    dq = ds @ kx * s_q
    dk = (ds @ q if bug == "transposed-dk" else np.swapaxes(ds, -1, -2) @ q) * s_q
    how = {"gqa-first": "first", "gqa-mean": "mean"}.get(bug, "sum")
    dk, dv = _fold(dk, h_kv, how), _fold(dv, h_kv, how)
    if bug == "batch-leak":
        dq = dq + 0.1 * dq[:1]
    if bug == "dtype":
        return dq.astype(np.float64), dk.astype(dt), dv.astype(dt)
    if bias is not None:
        return dq.astype(dt), dk.astype(dt), dv.astype(dt), ds.astype(dt)
    return dq.astype(dt), dk.astype(dt), dv.astype(dt)


def plain(bug=None):
    """``bwd(q, k, v, d_out, mask=None, scale=None, causal=False)`` with ``bug``."""

    def bwd(q, k, v, d_out, mask=None, scale=None, causal=False):
        return analytic(q, k, v, d_out, mask, scale, causal, bug=bug)

    bwd.__name__ = bwd.__qualname__ = f"analytic_{bug or 'correct'}".replace("-", "_")
    return bwd


def plain_bias(bug=None):
    def bwd(q, k, v, d_out, mask=None, scale=None, bias=None):
        return analytic(q, k, v, d_out, mask, scale, bias=bias, bug=bug)

    return bwd


def plain_align(bug=None, bottom_right=False):
    """``causal=`` takes the alignment string (declare causal_value="align"); ``bottom_right``: a bool causal is
    bottom-right."""

    def bwd(q, k, v, d_out, mask=None, scale=None, causal=False):
        if causal is True and bottom_right:
            causal = "bottom_right"
        if bug == "align-ignored" and causal:
            causal = True
        return analytic(q, k, v, d_out, mask, scale, causal, bug=bug)

    return bwd


def plain_dropout(bug=None):
    def bwd(q, k, v, d_out, mask=None, scale=None, causal=False, dropout_mask=None, dropout_p=0.0):
        return analytic(q, k, v, d_out, mask, scale, causal, dropout_mask, dropout_p, bug=bug)

    return bwd


# ----------------------------------------------------------------------------------------------------------------
# tiled FlashAttention-2 in NumPy


def tiled_forward(q, k, v, mask=None, scale=None, causal=False, *, block_q=16, block_k=16, lse_bug=None):
    """``(out, lse)`` by the online softmax, tile by tile (fully masked rows: out 0, lse -inf)."""
    dt = q.dtype
    work = np.float64 if dt == np.float64 else np.float32
    q, k, v = (np.asarray(x, dtype=work) for x in (q, k, v))
    h = q.shape[-3]
    kx, vx = _expand(k, h), _expand(v, h)
    n_q, n_k = q.shape[-2], kx.shape[-2]
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    lead = np.broadcast_shapes(q.shape[:-2], kx.shape[:-2])
    out = np.zeros((*lead, n_q, v.shape[-1]), work)
    lse = np.full((*lead, n_q), -np.inf, work)
    for i0 in range(0, n_q, block_q):
        qi = q[..., i0 : i0 + block_q, :]
        bq = qi.shape[-2]
        m = np.full((*lead, bq, 1), -np.inf, work)
        l_ = np.zeros((*lead, bq, 1), work)
        acc = np.zeros((*lead, bq, v.shape[-1]), work)
        for j0 in range(0, n_k, block_k):
            s = qi @ np.swapaxes(kx[..., j0 : j0 + block_k, :], -1, -2) * sc
            ok = np.ones(s.shape, bool)
            if mask is not None:
                ok = ok & np.broadcast_to(mask, (*lead, n_q, n_k))[..., i0 : i0 + bq, j0 : j0 + block_k]
            if causal:
                ok = ok & _causal(n_q, n_k)[i0 : i0 + bq, j0 : j0 + block_k]
            s = np.where(ok, s, -np.inf)
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
            safe = np.where(np.isfinite(m_new), m_new, 0)
            pt = np.exp(s - safe)
            alpha = np.exp(np.where(np.isfinite(m), m, -np.inf) - safe)
            l_ = l_ * alpha + pt.sum(axis=-1, keepdims=True)
            acc = acc * alpha + pt @ vx[..., j0 : j0 + block_k, :]
            m = m_new
        out[..., i0 : i0 + bq, :] = np.divide(acc, l_, out=np.zeros_like(acc), where=l_ > 0)
        with np.errstate(divide="ignore"):
            part = np.log(l_)[..., 0]
        if lse_bug == "nomax":
            lse[..., i0 : i0 + bq] = part
        else:
            lse[..., i0 : i0 + bq] = np.where(l_[..., 0] > 0, m[..., 0] + part, -np.inf)
        if lse_bug == "log2":
            lse[..., i0 : i0 + bq] = lse[..., i0 : i0 + bq] / math.log(2)
    return out.astype(dt), lse


def tiled_backward(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False, *, block_q=16, block_k=16, bug=None):
    """FlashAttention-2's backward: outer loop over key blocks, inner over query blocks; P from lse."""
    dt = q.dtype
    work = np.float64 if dt == np.float64 else np.float32
    q, k, v, o, do = (np.asarray(x, dtype=work) for x in (q, k, v, out, d_out))
    lse = np.asarray(lse, dtype=work)
    h, h_kv = q.shape[-3], k.shape[-3]
    kx, vx = _expand(k, h), _expand(v, h)
    n_q, n_k = q.shape[-2], kx.shape[-2]
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    lead = np.broadcast_shapes(q.shape[:-2], kx.shape[:-2])
    delta = (do * o).sum(axis=-1)  # [.., n_q]
    if bug == "delta-dp":  # rowsum(dP) over every key (what delta is not)
        delta = (do @ np.swapaxes(vx, -1, -2)).sum(axis=-1)
    dq = np.zeros((*lead, n_q, q.shape[-1]), work)
    dk = np.zeros((*lead, n_k, q.shape[-1]), work)
    dv = np.zeros((*lead, n_k, v.shape[-1]), work)
    full = None if mask is None else np.broadcast_to(mask, (*lead, n_q, n_k))
    for j0 in range(0, n_k, block_k):
        kj, vj = kx[..., j0 : j0 + block_k, :], vx[..., j0 : j0 + block_k, :]
        dkj = np.zeros_like(kj)
        dvj = np.zeros_like(vj)
        for i0 in range(0, n_q, block_q):
            qi, doi = q[..., i0 : i0 + block_q, :], do[..., i0 : i0 + block_q, :]
            bq = qi.shape[-2]
            s = qi @ np.swapaxes(kj, -1, -2) * sc
            ok = np.ones(s.shape, bool)
            if full is not None and bug != "masked-leak":
                ok = ok & full[..., i0 : i0 + bq, j0 : j0 + block_k]
            if causal:
                ok = ok & _causal(n_q, n_k, 1 if bug == "causal-off" else 0)[i0 : i0 + bq, j0 : j0 + block_k]
            li = lse[..., i0 : i0 + bq, None]
            if bug == "lse-log2":  # reads a nats lse as log2
                p = np.where(ok & np.isfinite(li), np.exp2(s / math.log(2) - np.where(np.isfinite(li), li, 0)), 0)
            else:
                p = np.where(ok & np.isfinite(li), np.exp(s - np.where(np.isfinite(li), li, 0)), 0.0)
            dp = doi @ np.swapaxes(vj, -1, -2)
            di = delta[..., i0 : i0 + bq, None]
            ds = p * (dp - di)
            if bug == "accumulate-kv":
                dvj = np.swapaxes(p, -1, -2) @ doi
                dkj = np.swapaxes(ds, -1, -2) @ qi * sc
            else:
                dvj += np.swapaxes(p, -1, -2) @ doi
                dkj += np.swapaxes(ds, -1, -2) @ qi * sc
            if bug == "accumulate-q":
                dq[..., i0 : i0 + bq, :] = ds @ kj * sc
            else:
                dq[..., i0 : i0 + bq, :] += ds @ kj * (1.0 if bug == "scale-missing" else sc)
        dk[..., j0 : j0 + block_k, :] = dkj
        dv[..., j0 : j0 + block_k, :] = dvj
    how = "first" if bug == "gqa-first" else "sum"
    return dq.astype(dt), _fold(dk, h_kv, how).astype(dt), _fold(dv, h_kv, how).astype(dt)


def flash(bug=None, block=16):
    def bwd(q, k, v, out, lse, d_out, mask=None, scale=None, causal=False):
        return tiled_backward(q, k, v, out, lse, d_out, mask, scale, causal, block_q=block, block_k=block, bug=bug)

    return bwd


def flash_forward(lse_bug=None, block=16):
    def fwd(q, k, v, mask=None, scale=None, causal=False):
        return tiled_forward(q, k, v, mask, scale, causal, block_q=block, block_k=block, lse_bug=lse_bug)

    return fwd


# ----------------------------------------------------------------------------------------------------------------
# PyTorch


def torch_function(bug=None):
    """``fn(q, k, v, mask=None, scale=None)`` through a custom autograd.Function whose backward has ``bug``."""
    import torch

    class Attn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, mask, scale):
            sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
            s = q @ k.transpose(-1, -2) * sc
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            m = s.amax(dim=-1, keepdim=True)
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            e = torch.exp(s - m)
            den = e.sum(dim=-1, keepdim=True)
            p = torch.where(den > 0, e / den.clamp_min(1e-30), torch.zeros_like(e))
            out = p @ v
            ctx.save_for_backward(q, k, v, p, out)
            ctx.sc = sc
            return out

        @staticmethod
        def backward(ctx, do):
            q, k, v, p, out = ctx.saved_tensors
            sc = ctx.sc
            dv = p.transpose(-1, -2) @ do if bug != "transposed-dv" else p @ do
            dp = do @ v.transpose(-1, -2)
            delta = (do * out).sum(-1, keepdim=True)
            ds = p * (dp - delta) if bug != "jacobian" else p * dp
            f = sc * sc if bug == "scale-twice" else sc
            dq = ds @ k * f
            dk = ds.transpose(-1, -2) @ q * f
            return dq, dk, dv, None, None

    def attention(q, k, v, mask=None, scale=None):
        return Attn.apply(q, k, v, mask, scale)

    return attention


# ----------------------------------------------------------------------------------------------------------------
# written in other styles (einsum, a recomputed lse, a torch import inside the function)


def e_sm(s):
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m)
    d = e.sum(-1, keepdims=True)
    return np.divide(e, d, out=np.zeros_like(e), where=d > 0)


def einsum_delta_do(q, k, v, d_out, mask=None, scale=None):
    sc = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * sc
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    p = e_sm(s)
    dv = np.einsum("bhqk,bhqd->bhkd", p, d_out)
    dp = np.einsum("bhqd,bhkd->bhqk", d_out, v)
    ds = p * (dp - d_out.sum(-1, keepdims=True))
    return (
        (np.einsum("bhqk,bhkd->bhqd", ds, k) * sc).astype(q.dtype),
        (np.einsum("bhqk,bhqd->bhkd", ds, q) * sc).astype(q.dtype),
        dv.astype(q.dtype),
    )


def flash_lse_unmasked(q, k, v, out, lse, d_out, mask=None, scale=None):
    sc = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    w = np.float64 if q.dtype == np.float64 else np.float32
    out_dtype = q.dtype
    q, k, v, out, d_out = (np.asarray(x, w) for x in (q, k, v, out, d_out))
    s = q @ np.swapaxes(k, -1, -2) * sc
    m = s.max(-1, keepdims=True)
    lse2 = m + np.log(np.exp(s - m).sum(-1, keepdims=True))  # recomputed, over every key
    p = np.exp(s - lse2)
    if mask is not None:
        p = np.where(mask, p, 0)
    dv = np.swapaxes(p, -1, -2) @ d_out
    dp = d_out @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (d_out * out).sum(-1, keepdims=True))
    return tuple(x.astype(out_dtype) for x in (ds @ k * sc, np.swapaxes(ds, -1, -2) @ q * sc, dv))


def torch_dk_unscaled():
    import torch

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            sc = 1 / math.sqrt(q.shape[-1])
            p = torch.softmax(q @ k.transpose(-1, -2) * sc, -1)
            ctx.save_for_backward(q, k, v, p)
            ctx.sc = sc
            return p @ v

        @staticmethod
        def backward(ctx, do):
            q, k, v, p = ctx.saved_tensors
            dv = p.transpose(-1, -2) @ do
            dp = do @ v.transpose(-1, -2)
            ds = p * (dp - (dp * p).sum(-1, keepdim=True))
            return ds @ k * ctx.sc, ds.transpose(-1, -2) @ q, dv

    def attn(q, k, v):
        return F.apply(q, k, v)

    return attn


def torch_plain_bwd_leak(q, k, v, d_out, mask=None):
    import torch

    sc = 1 / math.sqrt(q.shape[-1])
    s = q @ k.transpose(-1, -2) * sc
    p = torch.softmax(s, -1)  # mask forgotten entirely
    dv = p.transpose(-1, -2) @ d_out
    dp = d_out @ v.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    return ds @ k * sc, ds.transpose(-1, -2) @ q * sc, dv


def dropout_twice(q, k, v, d_out, mask=None, dropout_mask=None, dropout_p=0.0):
    sc = 1 / math.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) * sc
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    p = e_sm(s)
    keep = 1.0 if dropout_mask is None else dropout_mask / (1 - dropout_p)
    pd = p * keep
    out = pd @ v
    dv = np.swapaxes(pd, -1, -2) @ d_out
    dp = (d_out @ np.swapaxes(v, -1, -2)) * keep * keep  # twice
    ds = p * (dp - (d_out * out).sum(-1, keepdims=True))
    return (ds @ k * sc).astype(q.dtype), (np.swapaxes(ds, -1, -2) @ q * sc).astype(q.dtype), dv.astype(q.dtype)


# ----------------------------------------------------------------------------------------------------------------
# backwards whose bug shows only in the gradient side's wider case space (issue 20 §2)


def _softmax_bwd(q, k, v, d_out, mask=None, scale=None, bias=None, keep=None, p_drop=0.0, *, naive_lse=False, d_k=None):
    """The plain §9 backward over any leading axes; ``naive_lse``: lse = log(sum(exp(s))), no max subtracted;
    ``d_k``: the head dim the scale is computed from. Returns (dq, dk, dv, ds)."""
    dt = q.dtype
    q, k, v, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, d_out))
    sc = 1.0 / math.sqrt(q.shape[-1] if d_k is None else d_k) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * sc
    if bias is not None:
        s = s + np.asarray(bias, dtype=np.float64)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if naive_lse:
            lse = np.log(np.exp(s).sum(axis=-1, keepdims=True))
        else:
            m = s.max(axis=-1, keepdims=True)
            m = np.where(np.isfinite(m), m, 0.0)
            lse = m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True))
        p = np.where(np.isfinite(lse), np.exp(s - lse), 0.0)
    drop = 1.0 if keep is None else keep / (1.0 - p_drop)
    dv = np.swapaxes(p * drop, -1, -2) @ do
    dp = (do @ np.swapaxes(v, -1, -2)) * drop
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    grads = (ds @ k * sc, np.swapaxes(ds, -1, -2) @ q * sc, dv, ds)
    return tuple(g.astype(dt) for g in grads)


def lse_without_max(q, k, v, d_out, mask=None, scale=None):
    """Recomputes lse as log(sum(exp(s))) without subtracting the row maximum: overflows at large logits."""
    return _softmax_bwd(q, k, v, d_out, mask, scale, naive_lse=True)[:3]


def rank3_head_dim(q, k, v, d_out, mask=None, scale=None):
    """Reads d_k from a fixed axis (``q.shape[3]`` for [B, h, n, d], ``q.shape[1]`` otherwise): right on 4-D
    inputs, the sequence length on 3-D ``[h, n, d]`` ones."""
    d_k = q.shape[3] if q.ndim == 4 else q.shape[1]
    return _softmax_bwd(q, k, v, d_out, mask, scale, d_k=d_k)[:3]


def bias_grad_missing(q, k, v, d_out, mask=None, scale=None, bias=None):
    """Uses the bias in the recomputed scores but returns zeros for its gradient (d_bias never computed)."""
    dq, dk, dv, ds = _softmax_bwd(q, k, v, d_out, mask, scale, bias)
    return (dq, dk, dv) if bias is None else (dq, dk, dv, np.zeros_like(ds))


def keep_ignored(q, k, v, d_out, mask=None, scale=None, keep=None, dropout_p=0.0):
    """Takes its dropout keep mask as ``keep=`` (declare ``dropout_arg="keep"``) and ignores it in the backward."""
    return _softmax_bwd(q, k, v, d_out, mask, scale)[:3]


def keep_correct(q, k, v, d_out, mask=None, scale=None, keep=None, dropout_p=0.0):
    """The right backward with its dropout keep mask under the name ``keep=``."""
    return _softmax_bwd(q, k, v, d_out, mask, scale, keep=keep, p_drop=dropout_p)[:3]


def bias_correct(q, k, v, d_out, mask=None, scale=None, bias=None):
    """The right backward with a bias (d_bias = dS, returned fourth)."""
    dq, dk, dv, ds = _softmax_bwd(q, k, v, d_out, mask, scale, bias)
    return (dq, dk, dv) if bias is None else (dq, dk, dv, ds)


__all__ = [
    "analytic",
    "bias_correct",
    "bias_grad_missing",
    "flash",
    "flash_forward",
    "keep_correct",
    "keep_ignored",
    "lse_without_max",
    "plain",
    "plain_dropout",
    "rank3_head_dim",
    "tiled_backward",
    "tiled_forward",
]
