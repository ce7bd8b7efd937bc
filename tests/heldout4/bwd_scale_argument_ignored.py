"""A custom-mask FlashAttention-2 port whose backward rescales dQ and dK by ``1/sqrt(d)`` whatever ``scale`` it gets.

Source: https://github.com/alexzhang13/flashattention2-custom-mask/issues/3 ("Significant Errors": the kernel takes
the pre-softmax factor as ``sm_scale``; the reference passed ``1/sqrt(d_k)``, the kernel call 0.5).
Bug: P is recomputed with the given ``scale`` (dV is right) but dQ and dK are multiplied by ``1/sqrt(d_k)`` instead of
``scale``.
Shows on: a ``scale`` other than ``1/sqrt(d_k)``; right with the default.
"""

import math

import numpy as np

SOURCE = "https://github.com/alexzhang13/flashattention2-custom-mask/issues/3"
KIND = "backward"
EXPECTED = "grad-scale"
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
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k]; scale default 1/sqrt(d)."""
    return _probs(q, k, mask, 1 / math.sqrt(q.shape[-1]) if scale is None else scale) @ v


def attention_bwd(q, k, v, d_out, mask=None, scale=None):
    """d_out [..., n_q, d_v] -> (dq, dk, dv)."""
    sm_scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    p = _probs(q, k, mask, sm_scale)
    dv = np.swapaxes(p, -1, -2) @ d_out
    dp = d_out @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    default = 1 / math.sqrt(q.shape[-1])  # should be sm_scale
    return ds @ k * default, np.swapaxes(ds, -1, -2) @ q * default, dv
