"""A hand-written attention backward whose softmax derivative keeps only the Jacobian's diagonal.

Source: https://github.com/deeplearning4j/libnd4j/issues/440 ("Softmax derivative implementation incorrect": only
``output * (1 - output)`` for the diagonal is implemented, the sum and ``i != j`` terms are missing).
Bug: ``dS = P (1 - P) dP`` instead of ``P (dP - rowsum(P dP))``: dV is right, dQ and dK are not.
Shows on: every input with more than one allowed key in a row.
"""

import math

import numpy as np

SOURCE = "https://github.com/deeplearning4j/libnd4j/issues/440"
KIND = "backward"
EXPECTED = "grad-jacobian"
ALSO_OK = ("grad-mismatch",)
CHECK = {"mask_convention": "allow", "backward": "attention_bwd"}
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
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k] (True = may attend)."""
    return _probs(q, k, mask, 1 / math.sqrt(q.shape[-1])) @ v


def attention_bwd(q, k, v, d_out, mask=None):
    """d_out [..., n_q, d_v] -> (dq, dk, dv)."""
    scale = 1 / math.sqrt(q.shape[-1])
    p = _probs(q, k, mask, scale)
    dv = np.swapaxes(p, -1, -2) @ d_out
    dp = d_out @ np.swapaxes(v, -1, -2)
    ds = p * (1 - p) * dp  # the diagonal of the softmax Jacobian only
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv
