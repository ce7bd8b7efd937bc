"""A flash pair whose forward returns lse in nats while its backward recomputes P with exp2 as if lse were in log2
units (the TileLang/Triton kernels keep lse in log2). Source: https://github.com/tile-ai/tilelang/issues/547 (the
FlashAttention bwd example stores `lse = log2(logsum) + scores_max * scale` and recomputes with exp2). Bug: P =
exp2(s * log2(e) - lse_nats) is wrong by a row factor, so every gradient is wrong."""

import math

import numpy as np

SOURCE = "https://github.com/tile-ai/tilelang/issues/547"
KIND = "backward"
EXPECTED = "grad-lse"
ALSO_OK = ()
CHECK = {"backward": "attention_bwd", "lse_units": "nats"}
TARGET = "attention"

LOG2E = 1.4426950408889634


def attention(q, k, v, mask=None):
    """-> (out, lse `[..., n_q]` in nats; +inf for rows with no key)."""
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
    """(dq, dk, dv); recomputes P in base 2."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    p = np.exp2(s * LOG2E - lse[..., None])  # lse taken as log2 units
    dv = np.swapaxes(p, -1, -2) @ d_out
    dp = d_out @ np.swapaxes(v, -1, -2)
    delta = (d_out * out).sum(axis=-1, keepdims=True)
    ds = p * (dp - delta)
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv
