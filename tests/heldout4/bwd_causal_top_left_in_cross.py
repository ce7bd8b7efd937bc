"""A Triton-style attention whose forward aligns causal bottom-right and whose backward aligns it top-left.

Source: https://github.com/xlite-dev/ffpa-attn/pull/300 ("Fix causal cross-attention alignment in Triton backward":
the forward uses ``q + seqlen_k - seqlen_q >= k``, the backward ``q >= k``).
Bug: for causal calls with n_q != n_k the backward recomputes P with the top-left mask, so the gradients belong to
another attention than the forward's.
Shows on: causal with n_q != n_k; right for square causal inputs and without causal.
"""

import math

import numpy as np

SOURCE = "https://github.com/xlite-dev/ffpa-attn/pull/300"
KIND = "backward"
EXPECTED = "grad-causal"
ALSO_OK = ()
CHECK = {"causal_align": "bottom_right", "backward": "attention_bwd"}
TARGET = "attention"


def _probs(q, k, causal, offset, scale):
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        s = np.where(np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool), offset), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    z = e.sum(axis=-1, keepdims=True)
    return np.divide(e, z, out=np.zeros_like(e), where=z > 0)


def attention(q, k, v, causal=False):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v]; causal bottom-right."""
    return _probs(q, k, causal, k.shape[-2] - q.shape[-2], 1 / math.sqrt(q.shape[-1])) @ v


def attention_bwd(q, k, v, d_out, causal=False):
    """d_out [..., n_q, d_v] -> (dq, dk, dv)."""
    scale = 1 / math.sqrt(q.shape[-1])
    p = _probs(q, k, causal, 0, scale)  # top-left: should be offset n_k - n_q as in the forward
    dv = np.swapaxes(p, -1, -2) @ d_out
    dp = d_out @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv
