"""A tiled attention backward that stores each key block's dQ contribution instead of adding it.

Source: https://github.com/Dao-AILab/flash-attention/issues/1496 ("About Triton version of FA": dQ can be stored in
the inner loop, but then different key blocks write the same dQ and give a bad result; it must be accumulated, by
atomic adds or separate copies that are summed).
Bug: the loop over key blocks of 16 writes ``dq = dS_blk K_blk`` for each block, so only the last block's contribution
survives. dK and dV are right.
Shows on: n_k > 16 (more than one key block); right with n_k <= 16.
"""

import math

import numpy as np

SOURCE = "https://github.com/Dao-AILab/flash-attention/issues/1496"
KIND = "backward"
EXPECTED = "grad-accumulate"
ALSO_OK = ()
CHECK = {"mask_convention": "allow", "backward": "attention_bwd"}
TARGET = "attention"

BLOCK_N = 16


def _probs(q, k, mask, scale):
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    z = e.sum(axis=-1, keepdims=True)
    return np.divide(e, z, out=np.zeros_like(e), where=z > 0)


def attention(q, k, v, mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k] (True = may attend)."""
    return _probs(q, k, mask, 1 / math.sqrt(q.shape[-1])) @ v


def attention_bwd(q, k, v, d_out, mask=None):
    """d_out [..., n_q, d_v] -> (dq, dk, dv), one key block of BLOCK_N at a time."""
    scale = 1 / math.sqrt(q.shape[-1])
    p = _probs(q, k, mask, scale)
    out = p @ v
    delta = (d_out * out).sum(axis=-1, keepdims=True)
    dq = np.zeros_like(q)
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    for start in range(0, k.shape[-2], BLOCK_N):
        blk = slice(start, start + BLOCK_N)
        p_blk = p[..., blk]
        dv[..., blk, :] = np.swapaxes(p_blk, -1, -2) @ d_out
        ds = p_blk * (d_out @ np.swapaxes(v[..., blk, :], -1, -2) - delta)
        dk[..., blk, :] = np.swapaxes(ds, -1, -2) @ q * scale
        dq = ds @ k[..., blk, :] * scale  # should be dq += ...
    return dq, dk, dv
