"""An attention backward that uses the log-softmax gradient rule for the softmax: delta from the incoming gradient.

Source: https://github.com/apache/tvm/pull/1201 ("[NNVM] Fix softmax gradient": the gradient graph summed the
incoming gradient over the axis; softmax needs ``sum(grad * output)``, log-softmax ``sum(grad)``).
Bug: ``delta = rowsum(dP)`` instead of ``rowsum(dP * P)`` (= ``rowsum(dO * O)``): dV is right, dQ and dK are not.
Shows on: every input with more than one allowed key in a row.
"""

import math

import numpy as np

SOURCE = "https://github.com/apache/tvm/pull/1201"
KIND = "backward"
EXPECTED = "grad-delta"
ALSO_OK = ()
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


def attention(q, k, v, mask=None, scale=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k] (True = may attend)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _probs(q, k, mask, scale) @ v


def attention_bwd(q, k, v, d_out, mask=None, scale=None):
    """d_out [..., n_q, d_v] -> (dq, dk, dv)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    p = _probs(q, k, mask, scale)
    dv = np.swapaxes(p, -1, -2) @ d_out
    dp = d_out @ np.swapaxes(v, -1, -2)
    delta = dp.sum(axis=-1, keepdims=True)  # should be (dp * p).sum(...)
    ds = p * (dp - delta)
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv
