"""Correct: a NumPy attention with an additive bias (ALiBi / relative position) whose backward returns d_bias = dS
as its fourth output. Source: https://github.com/facebookresearch/xformers/issues/645 (support for the backward pass
"including with gradient for the bias"). Why correct: S = Q K^T s + bias, so dL/dbias = dS element-wise."""

import math

import numpy as np

SOURCE = "https://github.com/facebookresearch/xformers/issues/645"
KIND = "backward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"backward": "attention_bwd"}
TARGET = "attention"


def _probs(q, k, mask, bias, scale):
    s = q @ np.swapaxes(k, -1, -2) * scale
    if bias is not None:
        s = s + bias
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    d = e.sum(axis=-1, keepdims=True)
    return np.divide(e, d, out=np.zeros_like(e), where=d > 0)


def attention(q, k, v, mask=None, bias=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `bias [..., n_q, n_k]` added to the scaled scores."""
    return _probs(q, k, mask, bias, 1.0 / math.sqrt(q.shape[-1])) @ v


def attention_bwd(q, k, v, d_out, mask=None, bias=None):
    """(dq, dk, dv, d_bias)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    p = _probs(q, k, mask, bias, scale)
    dv = np.swapaxes(p, -1, -2) @ d_out
    dp = d_out @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    d_bias = None
    if bias is not None:  # reduce over the axes the bias was broadcast along
        d_bias = ds.sum(axis=tuple(range(ds.ndim - bias.ndim)))
        d_bias = d_bias.sum(axis=tuple(i for i, n in enumerate(bias.shape) if n == 1), keepdims=True)
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv, d_bias
