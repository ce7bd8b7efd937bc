"""Correct: a NumPy attention backward `bwd(q, k, v, d_out, mask=None, scale=None)` with the analytic formulas
dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dP P)), dQ = dS K s, dK = dS^T Q s. Source:
https://github.com/Dao-AILab/flash-attention/issues/2555 (the FlashAttention papers' backward, D_i = rowsum(dO_i * O_i)
= rowsum(dP_i * P_i)). Why correct: it is the chain rule through the masked softmax, rows with no key giving 0."""

import math

import numpy as np

SOURCE = "https://github.com/Dao-AILab/flash-attention/issues/2555"
KIND = "backward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"backward": "attention_bwd"}
TARGET = "attention"


def _probs(q, k, mask, scale):
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    d = e.sum(axis=-1, keepdims=True)
    return np.divide(e, d, out=np.zeros_like(e), where=d > 0)


def attention(q, k, v, mask=None, scale=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `mask` bool, True = attend."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _probs(q, k, mask, scale) @ v


def attention_bwd(q, k, v, d_out, mask=None, scale=None):
    """(dq, dk, dv)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    p = _probs(q, k, mask, scale)
    dv = np.swapaxes(p, -1, -2) @ d_out
    dp = d_out @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv
