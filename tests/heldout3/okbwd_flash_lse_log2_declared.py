"""Correct: a flash pair that keeps lse in log2 units (lse2 = m * log2(e) + log2(l)) and recomputes P with exp2, the
convention of the TileLang/Triton kernels, declared with lse_units="log2". Source:
https://github.com/tile-ai/tilelang/issues/547 (forward stores `log2(logsum) + scores_max * scale`, backward uses
exp2). Why correct: exp2(s * log2(e) - lse2) = exp(s - lse) exactly, and the units are declared."""

import math

import numpy as np

SOURCE = "https://github.com/tile-ai/tilelang/issues/547"
KIND = "backward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"backward": "attention_bwd", "lse_units": "log2"}
TARGET = "attention"

LOG2E = 1.4426950408889634


def attention(q, k, v, mask=None):
    """-> (out, lse `[..., n_q]` in log2 units; +inf on rows with no key)."""
    s2 = q @ np.swapaxes(k, -1, -2) * (LOG2E / math.sqrt(q.shape[-1]))
    if mask is not None:
        s2 = np.where(mask, s2, -np.inf)
    m = s2.max(axis=-1, keepdims=True)
    m0 = np.where(np.isfinite(m), m, 0)
    e = np.exp2(s2 - m0)
    den = e.sum(axis=-1, keepdims=True)
    out = np.divide(e, den, out=np.zeros_like(e), where=den > 0) @ v
    with np.errstate(divide="ignore"):
        lse2 = np.where(den > 0, m0 + np.log2(np.where(den > 0, den, 1)), np.inf)
    return out, lse2[..., 0]


def attention_bwd(q, k, v, out, lse, d_out, mask=None):
    """(dq, dk, dv) from lse in log2 units."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s2 = q @ np.swapaxes(k, -1, -2) * (scale * LOG2E)
    if mask is not None:
        s2 = np.where(mask, s2, -np.inf)
    finite = np.isfinite(lse)[..., None]
    p = np.where(finite, np.exp2(s2 - np.where(finite, lse[..., None], 0)), 0)
    dv = np.swapaxes(p, -1, -2) @ d_out
    ds = p * (d_out @ np.swapaxes(v, -1, -2) - (d_out * out).sum(axis=-1, keepdims=True))
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv
