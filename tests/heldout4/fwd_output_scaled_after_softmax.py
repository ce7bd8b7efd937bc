"""A power-attention reference path that scales the attention output instead of the scores.

Source: https://github.com/m-a-n-i-f-e-s-t/power-attention/pull/21 ("Don't scale pure attention output").
Bug: ``softmax(Q Kᵀ) V / sqrt(d_k)``: the scores go into the softmax unscaled and the output is divided afterwards,
so a row's weights sum to ``1/sqrt(d_k)``.
Shows on: d_k > 1; right with d_k == 1.
"""

import math

import torch

SOURCE = "https://github.com/m-a-n-i-f-e-s-t/power-attention/pull/21"
KIND = "forward"
EXPECTED = "scale-after-softmax"
ALSO_OK = ()
CHECK = {"mask_convention": "allow"}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k] (True = may attend)."""
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v
    return out / math.sqrt(q.shape[-1])
