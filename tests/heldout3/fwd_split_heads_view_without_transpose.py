"""A `[B, n, h, d]` attention that splits heads with `reshape(B, h, n, d)` instead of a transpose. Source:
https://github.com/reczoo/FuxiCTR/issues/30 ("The code of splitting heads is buggy, without transpose the shape";
`query.view(batch_size * num_heads, -1, attention_dim)` fixed to `view(...).transpose(1, 2)`). Bug: positions and
heads are scrambled, so one head's output depends on another head's tokens; right with a single head."""

import math

import torch

SOURCE = "https://github.com/reczoo/FuxiCTR/issues/30"
KIND = "forward"
EXPECTED = "batch-leak"
ALSO_OK = ()
CHECK = {"layout": "bnhd", "ranks": (4,)}
TARGET = "attention"


def attention(q, k, v):
    """q `[B, n_q, h, d]`, k/v `[B, n_k, h, d]` -> `[B, n_q, h, d_v]`."""
    B, n_q, h, d = q.shape
    n_k, d_v = k.shape[1], v.shape[-1]
    qh = q.reshape(B, h, n_q, d)  # should be q.transpose(1, 2)
    kh = k.reshape(B, h, n_k, d)
    vh = v.reshape(B, h, n_k, d_v)
    weights = torch.softmax(qh @ kh.transpose(-2, -1) / math.sqrt(d), dim=-1)
    return (weights @ vh).reshape(B, n_q, h, d_v)
