"""A flash pair whose forward stores lse = -inf for a query with no allowed key and whose backward recomputes
P = exp(s - lse) unguarded. Source: https://github.com/Dao-AILab/flash-attention/issues/2082 (the -inf row max of a
fully masked block has to be special-cased because -inf - -inf is NaN; flash-attn stores lse = +inf for empty rows).
Bug: exp(-inf - (-inf)) = NaN on fully masked rows, and the NaN reaches dK/dV of every key; rows with a key are
right."""

import math

import numpy as np

SOURCE = "https://github.com/Dao-AILab/flash-attention/issues/2082"
KIND = "backward"
EXPECTED = "grad-masked-row"
ALSO_OK = ()
CHECK = {"backward": "attention_bwd"}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """-> (out `[..., n_q, d_v]`, zeros on rows with no key; lse `[..., n_q]` nats, -inf on those rows)."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m0 = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m0)
    den = e.sum(axis=-1, keepdims=True)
    out = np.divide(e, den, out=np.zeros_like(e), where=den > 0) @ v
    with np.errstate(divide="ignore"):
        lse = np.where(den > 0, m0 + np.log(np.where(den > 0, den, 1)), -np.inf)
    return out, lse[..., 0]


def attention_bwd(q, k, v, out, lse, d_out, mask=None):
    """(dq, dk, dv)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - lse[..., None])  # NaN where s = lse = -inf
    dv = np.swapaxes(p, -1, -2) @ d_out
    dp = d_out @ np.swapaxes(v, -1, -2)
    delta = (d_out * out).sum(axis=-1, keepdims=True)
    ds = p * (dp - delta)
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv
