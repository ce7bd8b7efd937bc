"""A tiled online-softmax attention with the running maximum kept across key blocks (the fixed macro).

Source: https://github.com/tile-ai/TileOPs/pull/239 (the review's fix: keep ``scores_max`` as the running maximum over
all blocks seen so far, so ``exp(m_prev - m_new) <= 1``).
Correct: ``m_i``, ``l_i``, ``acc`` updated per key block of 4 with ``m_new = maximum(m_i, rowmax(block))``; a query
with no allowed key ends with ``l_i = 0`` and gets zeros.
"""

import math

import numpy as np

SOURCE = "https://github.com/tile-ai/TileOPs/pull/239"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"mask_convention": "allow"}
TARGET = "attention"

BLOCK_K = 4


def attention(q, k, v, mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k] (True = may attend)."""
    s_all = q @ np.swapaxes(k, -1, -2) * (1 / math.sqrt(q.shape[-1]))
    if mask is not None:
        s_all = np.where(mask, s_all, -np.inf)
    m_i = np.full(s_all.shape[:-1], -np.inf, dtype=s_all.dtype)
    l_i = np.zeros(s_all.shape[:-1], dtype=s_all.dtype)
    acc = np.zeros((*s_all.shape[:-1], v.shape[-1]), dtype=s_all.dtype)
    for start in range(0, s_all.shape[-1], BLOCK_K):
        s = s_all[..., start : start + BLOCK_K]
        m_new = np.maximum(m_i, s.max(axis=-1))
        m_safe = np.where(np.isfinite(m_new), m_new, 0)
        alpha = np.exp(m_i - m_safe)
        p = np.exp(s - m_safe[..., None])
        l_i = l_i * alpha + p.sum(axis=-1)
        acc = acc * alpha[..., None] + p @ v[..., start : start + BLOCK_K, :]
        m_i = m_new
    return np.divide(acc, l_i[..., None], out=np.zeros_like(acc), where=l_i[..., None] > 0)
