"""Correct: a torch GQA attention backward that reduces dK/dV over each K/V head's group of query heads. Source:
https://github.com/marin-community/levanter/pull/449 ("the gradient should simply be a summation over this axis").
Why correct: K/V head j is read by query heads j*g .. j*g+g-1 (repeat_interleave), so its gradient is their sum."""

import torch

SOURCE = "https://github.com/marin-community/levanter/pull/449"
KIND = "backward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"backward": "attention_bwd", "gqa": True}
TARGET = "attention"


def _probs(q, k, mask, scale):
    s = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0)


def attention(q, k, v, mask=None, scale=None):
    """q `[B, h, n_q, d]`, k/v `[B, h_kv, n_k, d]`."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    g = q.shape[-3] // k.shape[-3]
    return _probs(q, k.repeat_interleave(g, dim=-3), mask, scale) @ v.repeat_interleave(g, dim=-3)


def attention_bwd(q, k, v, d_out, mask=None, scale=None):
    """(dq, dk `[B, h_kv, n_k, d]`, dv `[B, h_kv, n_k, d_v]`)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    g = q.shape[-3] // k.shape[-3]
    ke, ve = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
    p = _probs(q, ke, mask, scale)
    dv = p.transpose(-2, -1) @ d_out
    dp = d_out @ ve.transpose(-2, -1)
    ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
    dq = ds @ ke * scale
    dk = ds.transpose(-2, -1) @ q * scale
    h_kv = k.shape[-3]
    dk = dk.unflatten(-3, (h_kv, g)).sum(dim=-3)
    dv = dv.unflatten(-3, (h_kv, g)).sum(dim=-3)
    return dq, dk, dv
