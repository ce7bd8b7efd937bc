"""A BERT attention with an additive per-batch mask filled with the dtype's smallest value.

Source: https://github.com/pytorch/benchmark/pull/794 ("attention issue fix for fp16 inference": the fill overflowed in
fp16, so the mask uses the fp16 minimum, -65504).
Correct: ``scores + mask`` with mask ``[B, 1, n_q, n_k]`` of 0 / ``finfo.min`` (Hugging Face's 4-D form), the softmax
in float32 for half inputs and cast back; a fully masked row is the uniform average (documented for additive masks).
"""

import math

import torch

SOURCE = "https://github.com/pytorch/benchmark/pull/794"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"mask_convention": "additive", "mask_form": "batch"}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q [B, h, n_q, d], k [B, h, n_k, d], v [B, h, n_k, d_v], mask float [B, 1, n_q, n_k] (0 or finfo.min)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores + mask
    if scores.dtype in (torch.float16, torch.bfloat16):
        weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    else:
        weights = torch.softmax(scores, dim=-1)
    return weights @ v
