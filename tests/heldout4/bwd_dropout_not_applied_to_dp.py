"""A flash-attention backward sample whose dropout path reuses the dropped weights and leaves dP undropped.

Source: https://github.com/aws-neuron/nki-samples/pull/81 ("Fix attention backward dropout": the kernel used the
post-dropout softmax to compute the local softmax gradient, and did not apply dropout to the incoming softmax
gradient before computing dq and dk).
Bug: with a keep mask, ``dS = P_drop * (dP - delta)`` with ``dP = dO Vᵀ`` undropped, where it must be
``P * (dP * keep / (1 - p) - delta)``. dV (from the dropped weights) is right.
Shows on: dropout (a keep mask with dropped entries, p > 0); right without dropout.
"""

import math

import torch

SOURCE = "https://github.com/aws-neuron/nki-samples/pull/81"
KIND = "backward"
EXPECTED = "grad-dropout"
ALSO_OK = ()
CHECK = {"mask_convention": "allow", "backward": "attention_bwd"}
TARGET = "attention"


def _probs(q, k, mask, scale):
    s = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0)


def attention(q, k, v, mask=None, dropout_mask=None, dropout_p=0.0):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v]; dropout_mask bool [..., n_q, n_k] (True = kept)."""
    p = _probs(q, k, mask, 1 / math.sqrt(q.shape[-1]))
    if dropout_mask is not None:
        p = p * dropout_mask / (1 - dropout_p)
    return p @ v


def attention_bwd(q, k, v, d_out, mask=None, dropout_mask=None, dropout_p=0.0):
    """d_out [..., n_q, d_v] -> (dq, dk, dv)."""
    scale = 1 / math.sqrt(q.shape[-1])
    p = _probs(q, k, mask, scale)
    p_drop = p if dropout_mask is None else p * dropout_mask / (1 - dropout_p)
    dv = p_drop.transpose(-2, -1) @ d_out
    dp = d_out @ v.transpose(-2, -1)  # the dropout mask is never applied here
    delta = (d_out * (p_drop @ v)).sum(dim=-1, keepdim=True)
    ds = p_drop * (dp - delta)  # the dropped weights stand in for P
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv
