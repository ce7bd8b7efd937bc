"""A blockwise (ring/chunked) attention that merges block results through `log(exp(lse) + exp(block_lse))`. Source:
https://github.com/zhuzilin/ring-flash-attention/pull/30 ("fix exp overflow when updating lse": the merge
`lse + log(1 + exp(block_lse - lse))` replaced by a log-sigmoid form). Bug: the merge exponentiates the raw lse, which
overflows to inf once logits reach about +710 (and underflows to log(0) = -inf around -745), so outputs become 0 or
NaN; every block is itself computed stably, so ordinary inputs are right."""

import math

import numpy as np

SOURCE = "https://github.com/zhuzilin/ring-flash-attention/pull/30"
KIND = "forward"
EXPECTED = "unstable-softmax"
ALSO_OK = ()
CHECK = {}
TARGET = "attention"

BLOCK_K = 32


def attention(q, k, v, mask=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `mask` bool `[..., n_q, n_k]`, True = attend."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    n_k = k.shape[-2]
    out = np.zeros((*np.broadcast_shapes(q.shape[:-2], v.shape[:-2]), q.shape[-2], v.shape[-1]), dtype=q.dtype)
    lse = np.full((*out.shape[:-1], 1), -np.inf, dtype=q.dtype)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        for start in range(0, n_k, BLOCK_K):
            kb, vb = k[..., start : start + BLOCK_K, :], v[..., start : start + BLOCK_K, :]
            s = q @ np.swapaxes(kb, -1, -2) * scale
            if mask is not None:
                s = np.where(mask[..., start : start + BLOCK_K], s, -np.inf)
            m = s.max(axis=-1, keepdims=True)
            m = np.where(np.isfinite(m), m, 0)
            e = np.exp(s - m)
            l_blk = e.sum(axis=-1, keepdims=True)
            block_lse = np.where(l_blk > 0, m + np.log(l_blk), -np.inf)
            block_out = np.divide(e, l_blk, out=np.zeros_like(e), where=l_blk > 0) @ vb
            new_lse = np.log(np.exp(lse) + np.exp(block_lse))  # the unstable merge
            alive = new_lse > -np.inf  # something seen in this row so far
            w_old = np.where(alive, np.exp(lse - new_lse), 0)
            w_new = np.where(alive, np.exp(block_lse - new_lse), 0)
            out = (w_old * out + w_new * block_out).astype(q.dtype)
            lse = new_lse
    return out
