"""A decode-step attention whose causal flag is built top-left (PyTorch's `is_causal`), used where the KV-cache step
needs bottom-right. Source: https://github.com/pytorch/executorch/issues/22426 (one query against 16 cached keys
attends to the first key only; the same class as onnxruntime#29020). Bug: `tril` of a `[L, S]` ones matrix anchors
the causal mask at the top-left corner, so with n_q < n_k the new queries miss keys they must see; right whenever
n_q == n_k."""

import math

import torch

SOURCE = "https://github.com/pytorch/executorch/issues/22426"
KIND = "forward"
EXPECTED = "causal-alignment"
ALSO_OK = ()
CHECK = {"causal_align": "bottom_right"}
TARGET = "attention"


def attention(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """SDPA-shaped attention over `[B, h, n, d]`; `attn_mask` bool, True = take part."""
    n_q, n_k = query.size(-2), key.size(-2)
    scale_factor = 1 / math.sqrt(query.size(-1)) if scale is None else scale
    allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=query.device)
    if is_causal:
        allowed = allowed.tril(diagonal=0)  # top-left: query i sees keys 0..i
    if attn_mask is not None:
        allowed = allowed & attn_mask
    scores = query @ key.transpose(-2, -1) * scale_factor
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    weights = torch.where(allowed.any(dim=-1, keepdim=True), weights, torch.zeros_like(weights))
    return weights @ value
