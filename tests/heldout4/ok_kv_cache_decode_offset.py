"""A decode kernel over a KV cache whose causal bound is offset by each sequence's cached length.

Source: https://github.com/hyprstream/hyprstream/pull/1521 ("offset causal mask by cached KV length in multi-token
forwards": ``tril(0)`` on ``[q_len, kv_len]`` masked out the history; the fix offsets by ``kv_len - q_len``).
Correct: sequence b holds ``cache_seqlens[b]`` keys; its n_q new queries are the last positions and query i sees keys
``j <= cache_seqlens[b] - n_q + i`` when causal, every cached key otherwise, never the slots past the length.
"""

import math

import torch

SOURCE = "https://github.com/hyprstream/hyprstream/pull/1521"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"layout": "bnhd", "causal_align": "bottom_right", "ranks": (4,)}
TARGET = "attention"


def attention(q, k_cache, v_cache, cache_seqlens=None, causal=False, softmax_scale=None):
    """q [B, n_q, h, d], k_cache [B, n_k, h, d], v_cache [B, n_k, h, d_v], cache_seqlens int [B] -> [B, n_q, h, d_v]."""
    scale = softmax_scale if softmax_scale is not None else 1 / math.sqrt(q.shape[-1])
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k_cache, v_cache))  # [B, h, n, d]
    b, n_q, n_k = q.shape[0], q.shape[1], k_cache.shape[1]
    lengths = torch.full((b,), n_k) if cache_seqlens is None else cache_seqlens.to(torch.int64).cpu()
    j = torch.arange(n_k)[None, None, :]  # [1, 1, n_k]
    allowed = j < lengths[:, None, None]  # [B, 1, n_k]
    if causal:
        i = torch.arange(n_q)[None, :, None]  # [1, n_q, 1]
        allowed = allowed & (j <= lengths[:, None, None] - n_q + i)  # [B, n_q, n_k]
    scores = (qh @ kh.transpose(-2, -1) * scale).masked_fill(~allowed[:, None].to(q.device), float("-inf"))
    out = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ vh
    return out.transpose(1, 2)
