"""Correct: softmax written as exp(s - logsumexp(s)) with a max-shifted logsumexp, zeros for rows with no key.
Source: https://github.com/Dao-AILab/flash-attention/issues/404 (softmax_lse is log sum exp(s); P = exp(s - lse)).
Why correct: lse = m + log(sum exp(s - m)) never overflows, and exp(s - lse) is exactly the softmax."""

import math

import numpy as np

SOURCE = "https://github.com/Dao-AILab/flash-attention/issues/404"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"masked_rows": "zeros"}
TARGET = "attention"


def attention(q, k, v, mask=None, scale=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `mask` bool, True = attend -> `[..., n_q, d_v]`."""
    acc = np.promote_types(q.dtype, np.float32)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    s = q.astype(acc) @ np.swapaxes(k.astype(acc), -1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    finite = np.isfinite(m)
    m0 = np.where(finite, m, 0)
    total = np.exp(s - m0).sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = np.where(finite, m0 + np.log(np.where(finite, total, 1)), -np.inf)
    p = np.where(finite, np.exp(s - np.where(finite, lse, 0)), 0)
    return (p @ v.astype(acc)).astype(q.dtype)
