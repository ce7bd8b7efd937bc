"""A fused decoder attention that asks for the "causal" mask mode only when the query block is as long as the keys.

Source: https://github.com/mlx-node/mlx-node/pull/24 (review: "Causal masking is incorrect for cached multi-token
chunks": ``if (use_causal && seq_len > 1 && seq_len == kv_len) mask_mode = "causal"``).
Bug: with a KV cache and a multi-token chunk (1 < n_q != n_k) no causal mask is applied at all, so the tokens of the
chunk see each other's future.
Shows on: causal with n_q > 1 and n_q != n_k; right for square inputs and single-token decode.
"""

import math

import torch

SOURCE = "https://github.com/mlx-node/mlx-node/pull/24"
KIND = "forward"
EXPECTED = "causal-leak"
ALSO_OK = ()
CHECK = {"causal_align": "bottom_right", "mask_convention": "allow"}
TARGET = "attention"


def attention(q, k, v, mask=None, causal=False):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k]; causal bottom-right (MLX)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if causal and n_q > 1 and n_q == n_k:
        future = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v
