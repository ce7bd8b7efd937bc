"""A tiled online-softmax attention whose running maximum is reset to each key block's own maximum.

Source: https://github.com/tile-ai/TileOPs/pull/239 (review of the shared ``online_softmax`` macro: ``scores_max`` is
refilled with -inf before each block's reduce, so the rescale factor is computed from the current block only).
Bug: the reference point of the exponentials moves to every block's maximum instead of the running maximum. That is
exact in exact arithmetic, but the rescale factor ``exp(m_prev - m_block)`` overflows to inf once an earlier block's
maximum exceeds a later block's by more than about 709, and inf/inf is NaN.
Shows on: logits of about ±1000 over more than one key block (BLOCK_K = 4); right on ordinary inputs.
"""

import math

import numpy as np

SOURCE = "https://github.com/tile-ai/TileOPs/pull/239"
KIND = "forward"
EXPECTED = "unstable-softmax"
ALSO_OK = ()
CHECK = {"mask_convention": "allow"}
TARGET = "attention"

BLOCK_K = 4


def attention(q, k, v, mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k] (True = may attend)."""
    s_all = q @ np.swapaxes(k, -1, -2) * (1 / math.sqrt(q.shape[-1]))  # [..., n_q, n_k]
    if mask is not None:
        s_all = np.where(mask, s_all, -np.inf)
    m_i = np.full(s_all.shape[:-1], -np.inf, dtype=s_all.dtype)
    l_i = np.zeros(s_all.shape[:-1], dtype=s_all.dtype)
    acc = np.zeros((*s_all.shape[:-1], v.shape[-1]), dtype=s_all.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, s_all.shape[-1], BLOCK_K):
            s = s_all[..., start : start + BLOCK_K]
            m_block = s.max(axis=-1)  # should be np.maximum(m_i, s.max(axis=-1))
            m_new = np.where(np.isfinite(m_block), m_block, 0)
            alpha = np.exp(m_i - m_new)
            p = np.exp(s - m_new[..., None])
            l_i = l_i * alpha + p.sum(axis=-1)
            acc = acc * alpha[..., None] + p @ v[..., start : start + BLOCK_K, :]
            m_i = m_new
        return np.divide(acc, l_i[..., None], out=np.zeros_like(acc), where=l_i[..., None] != 0)
