"""A Perceiver IO attention that divides by a scale defined as ``d ** -0.5``.

Source: https://github.com/esceptico/perceiver-io/issues/9 ("Bug in MultiHeadAttention": ``self.scale`` should be
multiplied instead of divided, since it is defined as ``qk_head_dim ** -0.5``).
Bug: ``q @ k.T / scale`` with ``scale = d ** -0.5`` multiplies the scores by ``sqrt(d)``.
Shows on: d_k > 1; right with d_k == 1.
"""

import numpy as np

SOURCE = "https://github.com/esceptico/perceiver-io/issues/9"
KIND = "forward"
EXPECTED = "scale-wrong"
ALSO_OK = ()
CHECK = {"mask_convention": "allow"}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k] (True = may attend)."""
    scale = q.shape[-1] ** -0.5
    s = q @ np.swapaxes(k, -1, -2) / scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    z = e.sum(axis=-1, keepdims=True)
    return (np.divide(e, z, out=np.zeros_like(e), where=z > 0) @ v).astype(q.dtype)
