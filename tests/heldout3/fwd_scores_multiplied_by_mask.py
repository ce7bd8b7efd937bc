"""Masked attention pooling that multiplies the scores by the binary mask before the softmax. Source:
https://github.com/georg-wolflein/good-features/pull/1 ("the multiplication by it effectively sets the masked
elements to zero. However, softmax will still treat zeros as full-fledged elements"). Bug: a blocked key gets the
score 0 (a finite fill of 0) instead of -inf, so it keeps weight exp(0 - max)."""

import math

import numpy as np

SOURCE = "https://github.com/georg-wolflein/good-features/pull/1"
KIND = "forward"
EXPECTED = "finite-fill"
ALSO_OK = ()
CHECK = {}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `mask` bool `[..., n_q, n_k]`, True = keep."""
    a = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        a = a * mask  # masked scores become 0, not -inf
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True) @ v
