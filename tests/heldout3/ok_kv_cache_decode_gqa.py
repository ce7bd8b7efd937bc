"""Correct: a `flash_attn_with_kvcache`-shaped decode step in torch: per-sequence `cache_seqlens`, the new queries at
each sequence's last positions, causal bottom-right per sequence, GQA by repeat_interleave. Source:
https://github.com/Dao-AILab/flash-attention (README, flash_attn_with_kvcache: "cache_seqlens ... causal mask aligned
to the bottom right"). Why correct: key j is allowed for query i of sequence b iff j < L_b and j <= L_b - n_q + i."""

import torch

SOURCE = "https://github.com/Dao-AILab/flash-attention"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"layout": "bnhd", "mask_form": "kv_cache", "causal_align": "bottom_right", "gqa": True, "ranks": (4,)}
TARGET = "attention"


def attention(q, k_cache, v_cache, cache_seqlens=None, causal=False, softmax_scale=None):
    """q `[B, n_q, h, d]`, k/v cache `[B, n_k, h_kv, d]`, `cache_seqlens [B]` int -> `[B, n_q, h, d_v]`."""
    B, n_q, h, d = q.shape
    n_k, h_kv = k_cache.shape[1], k_cache.shape[2]
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    lens = torch.full((B,), n_k, dtype=torch.long) if cache_seqlens is None else cache_seqlens.to(torch.long)
    qh = q.transpose(1, 2)
    kh = k_cache.transpose(1, 2).repeat_interleave(h // h_kv, dim=1)
    vh = v_cache.transpose(1, 2).repeat_interleave(h // h_kv, dim=1)
    scores = qh @ kh.transpose(-2, -1) * scale
    j = torch.arange(n_k)[None, None, None, :]
    i = torch.arange(n_q)[None, None, :, None]
    L = lens[:, None, None, None]
    allowed = j < L
    if causal:
        allowed = allowed & (j <= L - n_q + i)
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    weights = torch.where(allowed.any(dim=-1, keepdim=True), weights, torch.zeros_like(weights))
    return (weights @ vh).transpose(1, 2)
