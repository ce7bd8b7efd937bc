"""A quantised-model attention that applies the attention mask only while the query block is longer than one token.

Source: https://github.com/casper-hansen/AutoAWQ/pull/96 ("Only apply attention mask if seqlen is greater than 1").
Bug: the mask is skipped when ``n_q == 1`` on the grounds that a single decoding query is causal by construction;
but a batch with (left) padding still needs its key-padding part, so the padded keys leak into every decode step.
Shows on: ``n_q == 1`` with a mask that blocks some keys; right whenever ``n_q > 1`` or nothing is masked.
"""

import math

import torch

SOURCE = "https://github.com/casper-hansen/AutoAWQ/pull/96"
KIND = "forward"
EXPECTED = "padding-leak"
ALSO_OK = ()
CHECK = {"mask_convention": "allow"}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q [..., n_q, d_k], k [..., n_k, d_k], v [..., n_k, d_v], mask bool [..., n_q, n_k] (True = may attend)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [..., n_q, n_k]
    if mask is not None and q.shape[-2] > 1:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a fully masked row comes back as zeros
    return weights @ v
