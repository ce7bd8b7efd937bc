"""The GPT lecture's attention head with its scale taken from the channel count of the whole embedding.

Source: https://github.com/karpathy/ng-video-lecture/pull/6 ("We should scale attention by head size": it scaled by
the number of channels in the input).
Bug: ``wei = q @ k.T * C**-0.5`` with ``C = h * d_head`` (the embedding width) instead of ``d_head**-0.5``.
Shows on: more than one head; right with h == 1.
"""

import torch

SOURCE = "https://github.com/karpathy/ng-video-lecture/pull/6"
KIND = "forward"
EXPECTED = "scale-wrong"
ALSO_OK = ()
CHECK = {"mask_convention": "allow", "ranks": (4,)}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q [B, h, n_q, d_head], k [B, h, n_k, d_head], v [B, h, n_k, d_v], mask bool [B, h, n_q, n_k]."""
    channels = q.shape[1] * q.shape[-1]  # C, the embedding width
    wei = q @ k.transpose(-2, -1) * channels**-0.5
    if mask is not None:
        wei = wei.masked_fill(~mask, float("-inf"))
    return torch.softmax(wei, dim=-1).nan_to_num(0.0) @ v
