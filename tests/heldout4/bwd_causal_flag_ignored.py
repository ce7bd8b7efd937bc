"""The fused-attention tutorial's backward, which applies the causal mask whatever the forward was asked for.

Source: https://github.com/triton-lang/triton/issues/4541 ("Fused-attention bwd tutorial incorrect for
causal=True"... "The backward kernel is ignoring the ctx.causal argument entirely": the non-causal test fails).
Bug: the backward always recomputes P with the causal (top-left) mask; the forward honours ``causal``.
Shows on: ``causal=False`` (every non-causal input with n_q > 1); right for causal calls.
"""

import math

import numpy as np

SOURCE = "https://github.com/triton-lang/triton/issues/4541"
KIND = "backward"
EXPECTED = "grad-causal"
ALSO_OK = ()
CHECK = {"backward": "attention_bwd"}
TARGET = "attention"


def _probs(q, k, causal, scale):
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        s = np.where(np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool)), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    z = e.sum(axis=-1, keepdims=True)
    return np.divide(e, z, out=np.zeros_like(e), where=z > 0)


def attention(q, k, v, causal=False):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v]; causal top-left."""
    return _probs(q, k, causal, 1 / math.sqrt(q.shape[-1])) @ v


def attention_bwd(q, k, v, d_out, causal=False):
    """d_out [..., n_q, d_v] -> (dq, dk, dv)."""
    scale = 1 / math.sqrt(q.shape[-1])
    p = _probs(q, k, True, scale)  # ``causal`` is never read
    dv = np.swapaxes(p, -1, -2) @ d_out
    dp = d_out @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv
