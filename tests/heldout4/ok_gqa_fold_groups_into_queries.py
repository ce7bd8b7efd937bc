"""Grouped-query attention without repeating K/V: each group's query heads are folded into the query axis.

Source: https://github.com/AI-Hypercomputer/jetstream-pytorch/pull/171 ("Replace repeat kv with proper GQA handling":
the query's head dimension is reshaped into the token dimension, ``q kᵀ = [h_kv, rep * seq_len, seq_len]``).
Correct: q ``[B, h, n_q, d]`` viewed as ``[B, h_kv, g * n_q, d]`` (query head ``kv * g + j``, the interleave
mapping), the mask folded the same way, one product per K/V head, and the result unfolded.
"""

import math

import torch

SOURCE = "https://github.com/AI-Hypercomputer/jetstream-pytorch/pull/171"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"gqa": True, "mask_convention": "allow", "ranks": (4,)}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q [B, h, n_q, d], k [B, h_kv, n_k, d], v [B, h_kv, n_k, d_v], mask bool [B, h, n_q, n_k]."""
    b, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    qg = q.reshape(b, h_kv, (h // h_kv) * n_q, d)  # [B, h_kv, g*n_q, d]
    scores = qg @ k.transpose(-2, -1) / math.sqrt(d)  # [B, h_kv, g*n_q, n_k]
    if mask is not None:
        full = mask.expand(b, h, n_q, n_k).reshape(b, h_kv, (h // h_kv) * n_q, n_k)
        scores = scores.masked_fill(~full, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (weights @ v).reshape(b, h, n_q, v.shape[-1])
