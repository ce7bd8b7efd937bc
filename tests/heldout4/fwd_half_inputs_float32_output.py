"""An attention that upcasts half-precision scores for its softmax and never casts the result back.

Source: https://github.com/tinygrad/tinygrad/pull/5100 ("fix attention to always return in the same dtype as input":
the mid cast to the default float did not work as intended when the default is float32 and q, k, v are half).
Bug: for float16 / bfloat16 inputs the softmax runs in float32 (right) and ``weights @ v.float()`` returns float32.
Shows on: float16 and bfloat16 inputs; float32 and float64 come back in their own dtype.
"""

import math

import torch

SOURCE = "https://github.com/tinygrad/tinygrad/pull/5100"
KIND = "forward"
EXPECTED = "dtype"
ALSO_OK = ()
CHECK = {"mask_convention": "allow"}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k] (True = may attend)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if scores.dtype in (torch.float16, torch.bfloat16):
        scores = scores.float()
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v.to(weights.dtype)  # should end with ``.to(q.dtype)``
