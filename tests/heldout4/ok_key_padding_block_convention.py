"""A MultiheadAttention-style core whose ``key_padding_mask`` is True on padding, used as documented.

Source: https://github.com/pytorch/pytorch/issues/27968 (the report's fix: ``key_padding_mask`` marks padded keys with
True; the user's mask had to be inverted before the call).
Correct: True entries of the ``[B, n_k]`` mask are filled with -inf before the softmax (``mask_convention="block"``);
a sequence with every key padded gets zeros.
"""

import math

import torch

SOURCE = "https://github.com/pytorch/pytorch/issues/27968"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"mask_form": "key_padding", "mask_convention": "block", "ranks": (4,)}
TARGET = "attention"


def attention(q, k, v, key_padding_mask=None):
    """q [B, h, n_q, d], k [B, h, n_k, d], v [B, h, n_k, d_v], key_padding_mask bool [B, n_k] (True = padding)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.where(torch.isnan(weights), 0.0, weights).to(v.dtype) @ v
