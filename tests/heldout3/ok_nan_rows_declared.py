"""Correct under its declared policy: a NumPy attention that fills -inf and returns NaN for a query with no allowed
key, as `nn.MultiheadAttention` does. Source: https://github.com/pytorch/pytorch/issues/41508 (MultiheadAttention
returns NaN when a row is fully masked; kept as documented behaviour). Why correct: every row with an allowed key is
the exact softmax; the NaN rows are the promise declared with masked_rows="nan"."""

import math

import numpy as np

SOURCE = "https://github.com/pytorch/pytorch/issues/41508"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"masked_rows": "nan"}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `mask` bool, True = attend; rows with no key are NaN."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True) @ v
