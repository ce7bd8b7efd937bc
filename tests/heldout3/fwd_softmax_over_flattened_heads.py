"""A DETR-style multi-head attention map whose softmax runs over the flattened heads and keys. Source:
https://github.com/facebookresearch/detr/issues/247 (`F.softmax(weights.flatten(2), dim=-1)` on `[b, q, n, h, w]`
weights: "isn't the softmax supposed to be applied over each head separately? ... it should be weights.flatten(3)";
confirmed by the maintainers). Bug: one softmax over h * n_k values per query, so every head's row sums to less than
1 and depends on the other heads; right with one head."""

import torch
import torch.nn.functional as F

SOURCE = "https://github.com/facebookresearch/detr/issues/247"
KIND = "forward"
EXPECTED = "softmax-axis"
ALSO_OK = ()
CHECK = {"ranks": (4,)}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q `[B, h, n_q, d]`, k/v `[B, h, n_k, d]`; `mask` bool `[B, h, n_q, n_k]`, True = attend."""
    weights = torch.einsum("bhqd,bhkd->bqhk", q * q.shape[-1] ** -0.5, k)  # [B, n_q, h, n_k]
    if mask is not None:
        weights = weights.masked_fill(~mask.transpose(1, 2), float("-inf"))
    weights = F.softmax(weights.flatten(2), dim=-1).view(weights.size())  # should be over the last axis only
    return torch.einsum("bqhk,bhkd->bhqd", weights, v)
