"""A phi-style attention whose causal mask is built ``(seq, seq)`` from the query length alone.

Source: https://github.com/huggingface/candle/pull/3743 ("phi — mask ignores the cached prefix": the causal mask is
built as ``(seq, seq)`` with no knowledge of the KV cache, so ``masked_fill`` fails against ``(b, h, seq, kv)``
weights).
Bug: the causal mask has the shape ``[n_q, n_q]``, which does not broadcast against ``[..., n_q, n_k]`` scores.
Shows on: causal with n_q != n_k (a RuntimeError inside the function); right for square causal inputs.
"""

import math

import torch

SOURCE = "https://github.com/huggingface/candle/pull/3743"
KIND = "forward"
EXPECTED = "crash"
ALSO_OK = ()
CHECK = {"causal_align": "bottom_right"}
TARGET = "attention"


def attention(q, k, v, causal=False):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v]; causal: the queries are the last n_q positions."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)  # [n_q, n_q]: ignores the cache
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
