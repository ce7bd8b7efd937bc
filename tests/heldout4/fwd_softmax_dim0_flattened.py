"""A dot-product attention module over ``[B*h, n_q, n_k]`` scores with ``nn.Softmax(dim=0)``.

Source: https://github.com/PetrochukM/PyTorch-NLP/issues/2 ("Attention's softmax dimension is wrong?": the weights are
always 1 with batch size 1, because the softmax runs over the first, flattened batch axis).
Bug: the softmax normalises over the flattened batch-and-head axis instead of the keys.
Shows on: every input with B*h > 1 (with B*h == 1 every weight is 1).
"""

import math

from torch import nn

SOURCE = "https://github.com/PetrochukM/PyTorch-NLP/issues/2"
KIND = "forward"
EXPECTED = "softmax-axis"
ALSO_OK = ("not-normalized",)
CHECK = {"mask_convention": "allow", "ranks": (4,)}
TARGET = "attention"

softmax = nn.Softmax(dim=0)


def attention(q, k, v, mask=None):
    """q [B, h, n_q, d], k [B, h, n_k, d], v [B, h, n_k, d_v], mask bool [B, h, n_q, n_k]."""
    b, h, n_q, d = q.shape
    scores = (q @ k.transpose(-2, -1) / math.sqrt(d)).reshape(b * h, n_q, k.shape[-2])
    if mask is not None:
        scores = scores.masked_fill(~mask.expand(b, h, n_q, k.shape[-2]).reshape(b * h, n_q, -1), float("-inf"))
    weights = softmax(scores).nan_to_num(0.0)
    return (weights @ v.reshape(b * h, v.shape[-2], v.shape[-1])).reshape(b, h, n_q, v.shape[-1])
