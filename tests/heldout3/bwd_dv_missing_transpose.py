"""A NumPy attention backward that computes dV = P dO instead of P^T dO. Source:
https://github.com/triton-lang/triton/issues/919 (the Triton fused-attention backward computes
`dv += tl.dot(p.to(tl.float16), do, trans_a=True)`); rebuilt as a port that drops `trans_a`. Bug: dV is P dO, which
only has the right shape when n_q == n_k (and then the wrong values); rectangular calls fail on the shapes."""

import math

import numpy as np

SOURCE = "https://github.com/triton-lang/triton/issues/919"
KIND = "backward"
EXPECTED = "grad-transposed"
ALSO_OK = ("crash",)
CHECK = {"backward": "attention_bwd"}
TARGET = "attention"


def _probs(q, k, mask, scale):
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    d = e.sum(axis=-1, keepdims=True)
    return np.divide(e, d, out=np.zeros_like(e), where=d > 0)


def attention(q, k, v, mask=None, scale=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `mask` bool, True = attend."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _probs(q, k, mask, scale) @ v


def attention_bwd(q, k, v, d_out, mask=None, scale=None):
    """(dq, dk, dv)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    p = _probs(q, k, mask, scale)
    dv = p @ d_out  # trans_a dropped: should be P^T dO
    dp = d_out @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv
