"""A per-(batch, head) attention backward whose dQ loads K without the batch offset.

Source: https://github.com/fla-org/flash-linear-attention/issues/1115 ("gk loads miss head/bos offset in bwd
pre-process (wrong grads on non-last ranks)": a load indexed from the start of the buffer instead of the sequence's
own offset).
Bug: ``dq[b, h] = dS[b, h] @ k[0, h]``: every batch element's dQ is computed with the first sequence's keys.
Shows on: B > 1; right with a single batch element (and for 3-D ``[h, n, d]`` inputs).
"""

import math

import numpy as np

SOURCE = "https://github.com/fla-org/flash-linear-attention/issues/1115"
KIND = "backward"
EXPECTED = "grad-batch-leak"
ALSO_OK = ("grad-mismatch",)
CHECK = {"mask_convention": "allow", "ranks": (4,), "backward": "attention_bwd"}
TARGET = "attention"


def _probs(q, k, mask, scale):
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    z = e.sum(axis=-1, keepdims=True)
    return np.divide(e, z, out=np.zeros_like(e), where=z > 0)


def attention(q, k, v, mask=None):
    """q [B, h, n_q, d], k [B, h, n_k, d], v [B, h, n_k, d_v], mask bool [B, h, n_q, n_k]."""
    return _probs(q, k, mask, 1 / math.sqrt(q.shape[-1])) @ v


def attention_bwd(q, k, v, d_out, mask=None):
    """d_out [B, h, n_q, d_v] -> (dq, dk, dv)."""
    scale = 1 / math.sqrt(q.shape[-1])
    p = _probs(q, k, mask, scale)
    dv = np.swapaxes(p, -1, -2) @ d_out
    dp = d_out @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dq = np.empty_like(q)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            dq[b, h] = ds[b, h] @ k[0, h] * scale  # should be k[b, h]
    return dq, np.swapaxes(ds, -1, -2) @ q * scale, dv
