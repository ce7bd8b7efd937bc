"""Correct: a FlashAttention-2-style tiled forward in torch (blocks of 16 keys, running max m_i, running sum l_i,
rescaled accumulator), bottom-right causal flag, returning (out, lse). Source:
https://github.com/tile-ai/tilelang/pull/1148 (keep the max of all blocks seen, m_new = max(m_old, m_block)). Why
correct: acc and l_i are rescaled by exp(m_old - m_new) at every block, so the result is the exact softmax."""

import math

import torch

SOURCE = "https://github.com/tile-ai/tilelang/pull/1148"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"causal_align": "bottom_right", "mask_arg": "mask", "causal_arg": "causal"}
TARGET = "attention"

BLOCK_K = 16


def attention(q, k, v, mask=None, causal=False, softmax_scale=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]` -> (out `[..., n_q, d_v]`, lse `[..., n_q]`)."""
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    qa, ka, va = q.to(acc_dtype), k.to(acc_dtype), v.to(acc_dtype)
    n_q, n_k = q.shape[-2], k.shape[-2]
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    m_i = torch.full((*batch, n_q, 1), float("-inf"), dtype=acc_dtype)
    l_i = torch.zeros((*batch, n_q, 1), dtype=acc_dtype)
    acc = torch.zeros((*batch, n_q, v.shape[-1]), dtype=acc_dtype)
    rows = torch.arange(n_q)[:, None]
    for start in range(0, n_k, BLOCK_K):
        cols = torch.arange(start, min(start + BLOCK_K, n_k))[None, :]
        s = qa @ ka[..., start : start + BLOCK_K, :].transpose(-2, -1) * scale
        keep = torch.ones(n_q, cols.shape[1], dtype=torch.bool)
        if causal:
            keep = cols <= rows + (n_k - n_q)
        if mask is not None:
            keep = keep & mask[..., start : start + BLOCK_K]
        s = s.masked_fill(~keep, float("-inf"))
        m_new = torch.maximum(m_i, s.amax(dim=-1, keepdim=True))
        m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        p = torch.exp(s - m_safe)
        alpha = torch.exp(m_i - m_safe)
        l_i = alpha * l_i + p.sum(dim=-1, keepdim=True)
        acc = alpha * acc + p @ va[..., start : start + BLOCK_K, :]
        m_i = m_new
    out = torch.where(l_i > 0, acc / torch.where(l_i > 0, l_i, torch.ones_like(l_i)), torch.zeros_like(acc))
    lse = torch.where(l_i > 0, m_i + torch.log(torch.where(l_i > 0, l_i, torch.ones_like(l_i))), m_i)
    return out.to(q.dtype), lse.squeeze(-1)
