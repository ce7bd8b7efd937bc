"""A minimal FlashAttention-2 forward and backward in NumPy, tiled over queries and keys.

Source: https://github.com/leloykun/flash-attention-minimal/pull/1 ("Implement backward pass" of a minimal flash
attention: per-tile recomputation of P from the saved lse, dK/dV accumulated over query tiles, dQ over key tiles).
Correct: the forward returns ``(out, lse)`` from an online softmax over key tiles of 16 (lse +inf on a row with no
allowed key, so its P is 0); the backward recomputes ``P = exp(S - lse)`` per tile with the mask, uses
``delta = rowsum(dO O)`` and accumulates every tile.
"""

import math

import numpy as np

SOURCE = "https://github.com/leloykun/flash-attention-minimal/pull/1"
KIND = "backward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"mask_convention": "allow", "backward": "flash_bwd"}
TARGET = "flash_fwd"

B_Q = 16
B_K = 16


def _full_mask(mask, q, k):
    """The mask broadcast to ``[..., n_q, n_k]`` with q's batch shape (it may come as ``[n_k]``, ``[B, 1, 1, n_k]``)."""
    return None if mask is None else np.broadcast_to(mask, (*q.shape[:-2], q.shape[-2], k.shape[-2]))


def _scores(q, k, mask, rows, cols, scale):
    s = q[..., rows, :] @ np.swapaxes(k[..., cols, :], -1, -2) * scale
    return s if mask is None else np.where(mask[..., rows, cols], s, -np.inf)


def flash_fwd(q, k, v, mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k] -> (out, lse [..., n_q])."""
    scale = 1 / math.sqrt(q.shape[-1])
    n_q, n_k = q.shape[-2], k.shape[-2]
    mask = _full_mask(mask, q, k)
    batch = q.shape[:-2]
    out = np.zeros((*batch, n_q, v.shape[-1]), dtype=q.dtype)
    lse = np.zeros((*batch, n_q), dtype=q.dtype)
    for i in range(0, n_q, B_Q):
        rows = slice(i, i + B_Q)
        nr = len(range(n_q)[rows])
        m_i = np.full((*batch, nr), -np.inf, dtype=q.dtype)
        l_i = np.zeros((*batch, nr), dtype=q.dtype)
        acc = np.zeros((*batch, nr, v.shape[-1]), dtype=q.dtype)
        for j in range(0, n_k, B_K):
            cols = slice(j, j + B_K)
            s = _scores(q, k, mask, rows, cols, scale)
            m_new = np.maximum(m_i, s.max(axis=-1))
            m_safe = np.where(np.isfinite(m_new), m_new, 0)
            alpha = np.exp(m_i - m_safe)
            p = np.exp(s - m_safe[..., None])
            l_i = l_i * alpha + p.sum(axis=-1)
            acc = acc * alpha[..., None] + p @ v[..., cols, :]
            m_i = m_new
        out[..., rows, :] = np.divide(acc, l_i[..., None], out=np.zeros_like(acc), where=l_i[..., None] > 0)
        with np.errstate(divide="ignore"):
            lse[..., rows] = np.where(l_i > 0, m_i + np.log(l_i), np.inf)
    return out, lse


def flash_bwd(q, k, v, out, lse, d_out, mask=None):
    """FlashAttention-2's backward: (dq, dk, dv) from the forward's out and lse, tile by tile."""
    scale = 1 / math.sqrt(q.shape[-1])
    n_q, n_k = q.shape[-2], k.shape[-2]
    delta = (d_out * out).sum(axis=-1)  # [..., n_q]
    mask = _full_mask(mask, q, k)
    dq = np.zeros(q.shape, dtype=q.dtype)
    dk = np.zeros(dq.shape[:-2] + k.shape[-2:], dtype=q.dtype)
    dv = np.zeros(dq.shape[:-2] + v.shape[-2:], dtype=q.dtype)
    for j in range(0, n_k, B_K):
        cols = slice(j, j + B_K)
        for i in range(0, n_q, B_Q):
            rows = slice(i, i + B_Q)
            p = np.exp(_scores(q, k, mask, rows, cols, scale) - lse[..., rows, None])
            do = d_out[..., rows, :]
            dv[..., cols, :] += np.swapaxes(p, -1, -2) @ do
            ds = p * (do @ np.swapaxes(v[..., cols, :], -1, -2) - delta[..., rows, None])
            dk[..., cols, :] += np.swapaxes(ds, -1, -2) @ q[..., rows, :] * scale
            dq[..., rows, :] += ds @ k[..., cols, :] * scale
    return dq, dk, dv
