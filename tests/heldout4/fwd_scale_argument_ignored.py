"""An SDPA-style core attention whose configured softmax scale never reaches the computation.

Source: https://github.com/NVIDIA/Megatron-LM/pull/3698 ("Fix `config.softmax_scale` not being considered":
``softmax_scale`` was sometimes ignored and the default used unconditionally).
Bug: the ``scale=`` argument is accepted and dropped; the scores are always multiplied by ``1/sqrt(d_k)``.
Shows on: a ``scale`` other than the default; right with ``scale=None`` (or the default value passed).
"""

import math

import torch

SOURCE = "https://github.com/NVIDIA/Megatron-LM/pull/3698"
KIND = "forward"
EXPECTED = "scale-wrong"
ALSO_OK = ()
CHECK = {"mask_convention": "allow"}
TARGET = "attention"


def attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], attn_mask bool [..., n_q, n_k]; is_causal top-left."""
    softmax_scale = 1 / math.sqrt(q.shape[-1])  # ``scale`` is never read
    scores = q @ k.transpose(-2, -1) * softmax_scale
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    if is_causal:
        future = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v
