"""A Triton-tutorial-style tiled forward (exp2 online softmax over blocks of 16 keys) that multiplies `qk_scale` by
log2(e) inside the block loop, so the factor compounds from block to block. Source:
https://github.com/flagos-ai/FlagGems/pull/424 ("fix attention blowup. qk_scale mistakenly got scaled up every
iteration": `qk_scale *= 1.44269504` in `_attn_fwd_inner`). Bug: the scores of key block j are scaled by
sm_scale * log2(e)**j; every call with n_k <= 16 is right."""

import math

import numpy as np

SOURCE = "https://github.com/flagos-ai/FlagGems/pull/424"
KIND = "forward"
EXPECTED = "reference-mismatch"
ALSO_OK = ("scale-wrong",)
CHECK = {}
TARGET = "attention"

BLOCK_N = 16
LOG2E = 1.44269504


def attention(q, k, v, mask=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `mask` bool, True = attend; rows with no key are 0."""
    qk_scale = 1.0 / math.sqrt(q.shape[-1])
    shape = (*np.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2])
    m_i = np.full((*shape, 1), -np.inf, dtype=q.dtype)
    l_i = np.zeros((*shape, 1), dtype=q.dtype)
    acc = np.zeros((*shape, v.shape[-1]), dtype=q.dtype)
    for start in range(0, k.shape[-2], BLOCK_N):
        qk_scale *= LOG2E  # should be computed once, before the loop
        qk = q @ np.swapaxes(k[..., start : start + BLOCK_N, :], -1, -2) * qk_scale
        if mask is not None:
            qk = np.where(mask[..., start : start + BLOCK_N], qk, -np.inf)
        m_ij = np.maximum(m_i, qk.max(axis=-1, keepdims=True))
        m_safe = np.where(np.isfinite(m_ij), m_ij, 0)
        p = np.exp2(qk - m_safe)
        alpha = np.exp2(m_i - m_safe)
        l_i = l_i * alpha + p.sum(axis=-1, keepdims=True)
        acc = acc * alpha + p @ v[..., start : start + BLOCK_N, :]
        m_i = m_ij
    return np.divide(acc, l_i, out=np.zeros_like(acc), where=l_i > 0)
