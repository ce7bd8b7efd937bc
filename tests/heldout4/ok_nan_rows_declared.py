"""A plain ``masked_fill(-inf)`` + softmax attention whose NaN rows are its declared policy.

Source: https://github.com/pytorch/pytorch/pull/131060 ("Add a private _safe_softmax": before it, SDPA's stance for
fully masked rows was option 2, "attention between no queries and no keys is meaningless: output NaN").
Correct: softmax(QKᵀ/sqrt(d_k) with -inf where blocked) V; a query with no allowed key is NaN, as declared with
``masked_rows="nan"``.
"""

import math

import torch

SOURCE = "https://github.com/pytorch/pytorch/pull/131060"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"mask_convention": "allow", "masked_rows": "nan"}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k]; empty rows are NaN."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
