"""A MultiheadAttention-style core given a "True = valid token" mask as its ``key_padding_mask``.

Source: https://github.com/pytorch/pytorch/issues/27968 ("MultiheadAttention incorrectly handles mask": the mask from
``seq_len_to_mask`` is True on real tokens, while ``key_padding_mask`` marks the padding with True; the printed weights
sit on the padded keys).
Bug: the function documents ``key_padding_mask`` as True = a real key but fills the True entries with -inf, as
``nn.MultiheadAttention`` does.
Shows on: any mask with a padded key.
"""

import math

import torch

SOURCE = "https://github.com/pytorch/pytorch/issues/27968"
KIND = "forward"
EXPECTED = "mask-inverted"
ALSO_OK = ()
CHECK = {"mask_form": "key_padding", "mask_convention": "allow", "ranks": (4,)}
TARGET = "attention"


def attention(q, k, v, key_padding_mask=None):
    """q [B, h, n_q, d], k [B, h, n_k, d], v [B, h, n_k, d_v], key_padding_mask bool [B, n_k] (True = real key)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))  # MHA's True = padding
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v
