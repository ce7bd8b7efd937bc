"""A flash pair whose forward aligns its causal mask bottom-right (FlashAttention >= 2.1) while its backward still
builds it top-left (FlashAttention < 2.1, PyTorch). Source: https://github.com/Dao-AILab/flash-attention/issues/1778
(tridao: "we define the causal mask to be aligned to the bottom right"; a kernel ported from the old top-left
definition has to change forward and backward together). Bug: with n_q != n_k the backward's P differs from the
forward's; square causal calls and non-causal calls are right."""

import math

import torch

SOURCE = "https://github.com/Dao-AILab/flash-attention/issues/1778"
KIND = "backward"
EXPECTED = "grad-causal"
ALSO_OK = ()
CHECK = {"backward": "attention_bwd", "causal_align": "bottom_right"}
TARGET = "attention"


def _scores(q, k, mask, causal, offset, scale):
    n_q, n_k = q.shape[-2], k.shape[-2]
    allowed = torch.ones(n_q, n_k, dtype=torch.bool)
    if causal:
        allowed = torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None] + offset
    if mask is not None:
        allowed = allowed & mask
    return (q @ k.transpose(-2, -1) * scale).masked_fill(~allowed, float("-inf"))


def attention(q, k, v, mask=None, causal=False, scale=None):
    """-> (out, lse `[..., n_q]` nats; +inf for rows with no key); causal bottom-right."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = _scores(q, k, mask, causal, k.shape[-2] - q.shape[-2], scale)
    lse = torch.logsumexp(s, dim=-1)
    lse = torch.where(torch.isfinite(lse), lse, torch.full_like(lse, float("inf")))
    return torch.exp(s - lse[..., None]) @ v, lse


def attention_bwd(q, k, v, out, lse, d_out, mask=None, causal=False, scale=None):
    """(dq, dk, dv); recomputes P with the old top-left causal mask."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = _scores(q, k, mask, causal, 0, scale)  # offset 0: top-left
    p = torch.exp(s - lse[..., None])
    dv = p.transpose(-2, -1) @ d_out
    ds = p * (d_out @ v.transpose(-2, -1) - (d_out * out).sum(dim=-1, keepdim=True))
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv
