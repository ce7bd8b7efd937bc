"""A hand-written attention backward with dropout on the weights whose kept gradients are scaled by p instead of
1/(1-p). Source: https://github.com/NVIDIA/apex/pull/816 ("fix dropout scaling from p to 1/(1-p) in multihead
attention": the backward pass of apex's fused multihead attention). Bug: dV and dP use keep * p instead of
keep / (1 - p), wrong for every p > 0 (0.5 instead of 2 at p = 0.5); without dropout the gradients are right."""

import math

import numpy as np

SOURCE = "https://github.com/NVIDIA/apex/pull/816"
KIND = "backward"
EXPECTED = "grad-dropout"
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
    """(dq, dk, dv) of `dropout(softmax(q k^T * scale)) @ v`; `dropout_mask` bool `[..., n_q, n_k]`, True = kept."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    p = _probs(q, k, mask, scale)
    if dropout_mask is not None and dropout_p > 0:
        drop = dropout_mask.astype(p.dtype) * dropout_p  # apex before #816: should be dropout_mask / (1 - dropout_p)
    else:
        drop = np.ones_like(p)
    dv = np.swapaxes(p * drop, -1, -2) @ d_out
    dp = (d_out @ np.swapaxes(v, -1, -2)) * drop
    delta = (dp * p).sum(axis=-1, keepdims=True)
    ds = p * (dp - delta)
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv
