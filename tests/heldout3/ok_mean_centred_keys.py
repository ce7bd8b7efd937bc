"""Correct: attention over mean-centred keys, computed in float32 or better. Source:
https://github.com/Dao-AILab/flash-attention/issues/99 (tridao: any per-row constant may be subtracted before the
exponent; the max is only the usual choice). Why correct: q . (k_j - c) = q . k_j - q . c shifts every score of a
query's row by the same constant, which the softmax cancels, masked or not."""

import math

import numpy as np

SOURCE = "https://github.com/Dao-AILab/flash-attention/issues/99"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `mask` bool `[..., n_q, n_k]`, True = attend; masked rows are 0."""
    acc = np.promote_types(q.dtype, np.float32)
    qa, ka, va = q.astype(acc), k.astype(acc), v.astype(acc)
    kc = ka - ka.mean(axis=-2, keepdims=True)  # centre the keys
    s = qa @ np.swapaxes(kc, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    d = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, d, out=np.zeros_like(e), where=d > 0)
    return (p @ va).astype(q.dtype)
