"""A PyTorch attention to run on a GPU: ``attnlab check examples/my_kernel.py:attention --device cuda`` creates every
probe's inputs on that device (the golden stays float64 on the CPU)."""

import math

import torch


def attention(q, k, v, mask=None):
    """``softmax(q kᵀ / sqrt(d_k)) v`` on ``q``'s device; ``mask`` True = may attend; GQA when k and v have fewer
    heads than q (query head i reads kv head ``i // (h / h_kv)``). A row with no key to attend to gives zeros."""
    if k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    d = e.sum(dim=-1, keepdim=True)
    return torch.where(d > 0, e / torch.where(d > 0, d, torch.ones_like(d)), torch.zeros_like(e)) @ v
