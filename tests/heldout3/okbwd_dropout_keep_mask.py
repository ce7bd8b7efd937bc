"""Correct: a NumPy attention backward with a dropout keep mask: dV = (P M / (1-p))^T dO, dP = dO V^T M / (1-p),
delta = rowsum(dP P). Source: https://github.com/Dao-AILab/flash-attention/issues/93 (dropout zeroes a fraction p and
scales the rest by 1/(1-p); the backward needs the same factor on both products). Why correct: it is the chain rule
through dropout(softmax(S)); note delta is not rowsum(dO O) once dropout is on."""

import math

import numpy as np

SOURCE = "https://github.com/Dao-AILab/flash-attention/issues/93"
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
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `mask` bool, True = attend (inference: no dropout)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _probs(q, k, mask, scale) @ v


def attention_bwd(q, k, v, d_out, mask=None, scale=None, dropout_mask=None, dropout_p=0.0):
    """(dq, dk, dv); `dropout_mask` bool `[..., n_q, n_k]`, True = kept."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    p = _probs(q, k, mask, scale)
    drop = np.ones_like(p) if dropout_mask is None else dropout_mask.astype(p.dtype) * (1.0 / (1.0 - dropout_p))
    dv = np.swapaxes(p * drop, -1, -2) @ d_out
    dp = (d_out @ np.swapaxes(v, -1, -2)) * drop
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv
