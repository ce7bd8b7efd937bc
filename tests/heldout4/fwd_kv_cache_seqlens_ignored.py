"""A ``flash_attn_with_kvcache``-style decode kernel that attends over the whole cache buffer.

Source: https://github.com/huggingface/optimum-neuron/pull/264 ("Use attention masks for TGI generation": the masks
were simply ignored during generation, leading to gibberish when some slots were padded).
Bug: ``cache_seqlens`` is accepted and never read: every query attends to all ``n_k`` slots of the cache, including
the stale entries past each sequence's length, and the causal bound is aligned to the buffer's end.
Shows on: cache lengths shorter than the buffer; right when every sequence fills the cache.
"""

import math

import torch

SOURCE = "https://github.com/huggingface/optimum-neuron/pull/264"
KIND = "forward"
EXPECTED = "padding-leak"
ALSO_OK = ()
CHECK = {"layout": "bnhd", "causal_align": "bottom_right", "ranks": (4,)}
TARGET = "attention"


def attention(q, k_cache, v_cache, cache_seqlens=None, causal=False, softmax_scale=None):
    """q [B, n_q, h, d], k_cache [B, n_k, h, d], v_cache [B, n_k, h, d_v], cache_seqlens int [B] -> [B, n_q, h, d_v]."""
    scale = softmax_scale if softmax_scale is not None else 1 / math.sqrt(q.shape[-1])
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k_cache, v_cache))  # [B, h, n, d]
    scores = qh @ kh.transpose(-2, -1) * scale
    n_q, n_k = qh.shape[-2], kh.shape[-2]
    if causal:
        i = torch.arange(n_q, device=q.device)[:, None]
        j = torch.arange(n_k, device=q.device)[None, :]
        scores = scores.masked_fill(j > i + n_k - n_q, float("-inf"))
    out = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ vh
    return out.transpose(1, 2)
