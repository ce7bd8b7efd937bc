"""Attention whose mask means "blocked" (True = may NOT attend, as nn.MultiheadAttention's attn_mask): check it with
``attnlab check examples/blocked_mask_attention.py:attention --mask-convention block``."""

import math

import numpy as np


def attention(q, k, v, mask=None):
    """``softmax(q kᵀ / sqrt(d_k)) v`` with ``mask [..., n_q, n_k]`` True where a key is blocked; a row with every
    key blocked gives zeros."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, -np.inf, s)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    d = e.sum(axis=-1, keepdims=True)
    return np.divide(e, d, out=np.zeros_like(e), where=d > 0) @ v
