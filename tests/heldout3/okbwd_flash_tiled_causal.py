"""Correct: a tiled FlashAttention-2-style NumPy pair (forward over key blocks with m_i, l_i, acc; backward over key
blocks with dQ accumulated and dK/dV per block), bottom-right causal flag, lse in nats (+inf on empty rows).
Source: https://github.com/triton-lang/triton/pull/2020 (the fused-attention tutorial's backward: delta from
`_bwd_preprocess`, dQ accumulated across blocks). Why correct: every block recomputes P = exp(s - lse) exactly and
each block's contribution is added once."""

import math

import numpy as np

SOURCE = "https://github.com/triton-lang/triton/pull/2020"
KIND = "backward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"backward": "attention_bwd", "causal_align": "bottom_right"}
TARGET = "attention"

BLOCK_N = 16


def _block_scores(q, k, mask, causal, start, scale):
    n_q, n_k = q.shape[-2], k.shape[-2]
    kb = k[..., start : start + BLOCK_N, :]
    s = q @ np.swapaxes(kb, -1, -2) * scale
    cols = np.arange(start, start + kb.shape[-2])[None, :]
    keep = np.ones((n_q, kb.shape[-2]), dtype=bool)
    if causal:
        keep = cols <= np.arange(n_q)[:, None] + (n_k - n_q)
    if mask is not None:
        keep = keep & mask[..., start : start + BLOCK_N]
    return np.where(keep, s, -np.inf)


def attention(q, k, v, mask=None, causal=False):
    """-> (out `[..., n_q, d_v]`, lse `[..., n_q]` in nats)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    shape = (*np.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2])
    m_i = np.full((*shape, 1), -np.inf, dtype=q.dtype)
    l_i = np.zeros((*shape, 1), dtype=q.dtype)
    acc = np.zeros((*shape, v.shape[-1]), dtype=q.dtype)
    for start in range(0, k.shape[-2], BLOCK_N):
        s = _block_scores(q, k, mask, causal, start, scale)
        m_new = np.maximum(m_i, s.max(axis=-1, keepdims=True))
        m_safe = np.where(np.isfinite(m_new), m_new, 0)
        p = np.exp(s - m_safe)
        alpha = np.exp(m_i - m_safe)
        l_i = alpha * l_i + p.sum(axis=-1, keepdims=True)
        acc = alpha * acc + p @ v[..., start : start + BLOCK_N, :]
        m_i = m_new
    seen = l_i > 0
    out = np.divide(acc, l_i, out=np.zeros_like(acc), where=seen)
    with np.errstate(divide="ignore"):
        lse = np.where(seen, m_i + np.log(np.where(seen, l_i, 1)), np.inf)
    return out, lse[..., 0]


def attention_bwd(q, k, v, out, lse, d_out, mask=None, causal=False):
    """(dq, dk, dv)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    delta = (d_out * out).sum(axis=-1, keepdims=True)
    finite = np.isfinite(lse)[..., None]
    lse0 = np.where(finite, lse[..., None], 0)
    dq = np.zeros_like(q)
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    for start in range(0, k.shape[-2], BLOCK_N):
        blk = slice(start, start + BLOCK_N)
        s = _block_scores(q, k, mask, causal, start, scale)
        p = np.where(finite, np.exp(s - lse0), 0)
        dv[..., blk, :] = np.swapaxes(p, -1, -2) @ d_out
        ds = p * (d_out @ np.swapaxes(v[..., blk, :], -1, -2) - delta)
        dk[..., blk, :] = np.swapaxes(ds, -1, -2) @ q * scale
        dq += ds @ k[..., blk, :] * scale
    return dq, dk, dv
