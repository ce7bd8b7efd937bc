"""An attention wrapper that folds the softmax scale into the query with an in-place multiply.

Source: https://github.com/flashinfer-ai/flashinfer/pull/2084 (review: "Avoid in-place scaling of caller tensors":
``bmm1_scale *= log2e`` mutates the caller's tensor, so a reused buffer drifts on every call).
Bug: ``q *= scale`` writes into the caller's query; the output of the first call is right, the caller's ``q`` is not,
and a second call with the same tensor is scaled twice.
Shows on: every call (the caller's q changes); the output is wrong from the second call with the same tensors.
"""

import math

import torch

SOURCE = "https://github.com/flashinfer-ai/flashinfer/pull/2084"
KIND = "forward"
EXPECTED = "mutates-input"
ALSO_OK = ("nondeterministic",)
CHECK = {"mask_convention": "allow"}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k] (True = may attend)."""
    q *= 1 / math.sqrt(q.shape[-1])  # in place: should be ``q = q * scale``
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v
