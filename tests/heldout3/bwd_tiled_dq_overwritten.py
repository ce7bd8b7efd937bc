"""A tiled FlashAttention-2-style NumPy backward (blocks of 16 keys) that stores each key block's dQ contribution
instead of adding it. Source: https://github.com/triton-lang/triton/issues/919 (the fused-attention backward keeps dQ
in memory and accumulates it across key blocks with `dq = tl.load(dq_ptrs); dq += tl.dot(ds, k); tl.store(...)`);
rebuilt as the port that drops the load. Bug: dQ keeps only the last key block; dK and dV are right, and every
call with n_k <= 16 is right."""

import math

import numpy as np

SOURCE = "https://github.com/triton-lang/triton/issues/919"
KIND = "backward"
EXPECTED = "grad-accumulate"
ALSO_OK = ()
CHECK = {"backward": "attention_bwd"}
TARGET = "attention"

BLOCK_N = 16


def attention(q, k, v, mask=None):
    """-> (out, lse `[..., n_q]` nats; +inf for rows with no key)."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m0 = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m0)
    den = e.sum(axis=-1, keepdims=True)
    out = np.divide(e, den, out=np.zeros_like(e), where=den > 0) @ v
    with np.errstate(divide="ignore"):
        lse = np.where(den > 0, m0 + np.log(np.where(den > 0, den, 1)), np.inf)
    return out, lse[..., 0]


def attention_bwd(q, k, v, out, lse, d_out, mask=None):
    """(dq, dk, dv), one block of BLOCK_N keys at a time."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    delta = (d_out * out).sum(axis=-1, keepdims=True)
    dq = np.zeros_like(q)
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    for start in range(0, k.shape[-2], BLOCK_N):
        blk = slice(start, start + BLOCK_N)
        s = q @ np.swapaxes(k[..., blk, :], -1, -2) * scale
        if mask is not None:
            s = np.where(mask[..., blk], s, -np.inf)
        p = np.exp(s - lse[..., None])
        dv[..., blk, :] = np.swapaxes(p, -1, -2) @ d_out
        dp = d_out @ np.swapaxes(v[..., blk, :], -1, -2)
        ds = p * (dp - delta)
        dk[..., blk, :] = np.swapaxes(ds, -1, -2) @ q * scale
        dq = ds @ k[..., blk, :] * scale  # should be dq += ...
    return dq, dk, dv
