"""An MLX-style causal flag (bottom-right: the last query aligns with the last key) in a `[B, n, h, d]` NumPy kernel,
used by code that relies on PyTorch's top-left `is_causal`. Source: https://github.com/ml-explore/mlx/pull/2836
(`mask="causal"` was bottom-right where a port expected PyTorch's top-left; "significant numerical differences" when
S_Q != S_KV). Bug against the declared top-left alignment: with n_k > n_q query i sees n_k - n_q future keys."""

import math

import numpy as np

SOURCE = "https://github.com/ml-explore/mlx/pull/2836"
KIND = "forward"
EXPECTED = "causal-alignment"
ALSO_OK = ()
CHECK = {"layout": "bnhd", "causal_align": "top_left"}
TARGET = "attention"


def attention(q, k, v, causal=False, scale=None):
    """q `[B, n_q, h, d]`, k/v `[B, n_k, h, d]` -> `[B, n_q, h, d_v]`."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    qh, kh, vh = (np.swapaxes(x, -3, -2) for x in (q, k, v))  # [B, h, n, d]
    s = qh @ np.swapaxes(kh, -1, -2) * scale  # [B, h, n_q, n_k]
    if causal:
        n_q, n_k = s.shape[-2:]
        offset = n_k - n_q  # lower-right alignment
        keep = np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + offset
        s = np.where(keep, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    d = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, d, out=np.zeros_like(e), where=d > 0)
    return np.swapaxes(p @ vh, -3, -2)
