"""A `flash_attn_with_kvcache`-shaped decode kernel that reads `cache_seqlens` as if the cache were left-padded (real
tokens in the last L slots). Source: https://github.com/NVIDIA-NeMo/Automodel/pull/3704 (padding located from the
wrong end: with left padding "there is no trailing pad run ... every real token attends the entire pad run").
Bug: with a right-filled cache (flash-attn's convention: keys 0..L-1) it attends the unused tail slots and drops the
first real keys; right whenever every sequence fills the whole cache."""

import torch

SOURCE = "https://github.com/NVIDIA-NeMo/Automodel/pull/3704"
KIND = "forward"
EXPECTED = "padding-leak"
ALSO_OK = ()
CHECK = {"layout": "bnhd", "mask_form": "kv_cache", "causal_align": "bottom_right", "gqa": True, "ranks": (4,)}
TARGET = "attention"


def attention(q, k_cache, v_cache, cache_seqlens=None, causal=False, softmax_scale=None):
    """q `[B, n_q, h, d]`, k/v cache `[B, n_k, h_kv, d]`, `cache_seqlens [B]` int -> `[B, n_q, h, d_v]`."""
    B, n_q, h, d = q.shape
    n_k, h_kv = k_cache.shape[1], k_cache.shape[2]
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    qh = q.transpose(1, 2)
    kh = k_cache.transpose(1, 2).repeat_interleave(h // h_kv, dim=1)
    vh = v_cache.transpose(1, 2).repeat_interleave(h // h_kv, dim=1)
    scores = qh @ kh.transpose(-2, -1) * scale  # [B, h, n_q, n_k]
    j = torch.arange(n_k, device=q.device)
    i = torch.arange(n_q, device=q.device)
    allowed = torch.ones(B, 1, n_q, n_k, dtype=torch.bool, device=q.device)
    if cache_seqlens is not None:
        first = n_k - cache_seqlens.to(torch.long)  # left padding: the real tokens end the buffer
        allowed = allowed & (j[None, None, None, :] >= first[:, None, None, None])
    if causal:
        allowed = allowed & (j[None, :] <= i[:, None] + (n_k - n_q))
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (weights @ vh).transpose(1, 2)
