"""Grouped-query attention that expands K/V heads by tiling (`cat([k] * g)`) where Llama's `repeat_kv`
(repeat_interleave) is meant. Source: https://github.com/ekzhang/jax-js/pull/180 ("there was a bug in which KV heads
were applied to each Q head (should be repeat instead of tile)"). Bug: query head i reads K/V head i % h_kv instead
of i // (h / h_kv); right without GQA."""

import torch

SOURCE = "https://github.com/ekzhang/jax-js/pull/180"
KIND = "forward"
EXPECTED = "gqa-mapping"
ALSO_OK = ()
CHECK = {"gqa": True}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q `[..., h, n_q, d]`, k/v `[..., h_kv, n_k, d]`; `mask` bool `[..., h, n_q, n_k]`, True = attend."""
    n_rep = q.shape[-3] // k.shape[-3]
    if n_rep > 1:
        k = torch.cat([k] * n_rep, dim=-3)  # tile: [k0, k1, k0, k1]
        v = torch.cat([v] * n_rep, dim=-3)
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v
