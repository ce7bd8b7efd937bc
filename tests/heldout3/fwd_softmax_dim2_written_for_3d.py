"""A ScaledDotProductAttention written for 3-D `[h*b, n_q, n_k]` scores (softmax over dim 2), fed 4-D inputs. Source:
https://github.com/jadore801120/attention-is-all-you-need-pytorch/issues/52 ("softmax's dim ... I think dim=2 is
right"; the answer: set the dimension explicitly). Bug: `F.softmax(attn, dim=2)` is the key axis for 3-D inputs but
the query axis for `[B, h, n_q, n_k]` ones; right for every 3-D `[h, n, d]` call."""

import torch
import torch.nn.functional as F

SOURCE = "https://github.com/jadore801120/attention-is-all-you-need-pytorch/issues/52"
KIND = "forward"
EXPECTED = "softmax-axis"
ALSO_OK = ()
CHECK = {}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]` (3-D `[h, n, d]` or 4-D); `mask` bool, True = attend."""
    temperature = q.shape[-1] ** 0.5
    attn = torch.matmul(q / temperature, k.transpose(-2, -1))
    if mask is not None:
        attn = attn.masked_fill(~mask, float("-inf"))
    attn = F.softmax(attn, dim=2)
    return torch.matmul(attn, v)
