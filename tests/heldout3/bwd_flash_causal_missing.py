"""A torch flash-style pair whose forward applies a bottom-right causal mask and whose backward forgets it. Source:
https://github.com/ssiu/flash-attention-turing/pull/5 ("added causal mask for bwd pass": the kernel's forward was
causal, its backward was not yet). Bug: the backward recomputes P without the causal part (the user mask is kept),
so future keys get gradient; non-causal calls are right."""

import math

import torch

SOURCE = "https://github.com/ssiu/flash-attention-turing/pull/5"
KIND = "backward"
EXPECTED = "grad-causal"
ALSO_OK = ()
CHECK = {"backward": "attention_bwd", "causal_align": "bottom_right"}
TARGET = "attention"


def _allowed(n_q, n_k, mask, causal, device):
    allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    if causal:
        allowed = torch.arange(n_k, device=device)[None, :] <= torch.arange(n_q, device=device)[:, None] + (n_k - n_q)
    return allowed if mask is None else allowed & mask


def attention(q, k, v, mask=None, causal=False):
    """-> (out, lse `[..., n_q]` nats; +inf for rows with no key)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    allowed = _allowed(q.shape[-2], k.shape[-2], mask, causal, q.device)
    s = (q @ k.transpose(-2, -1) * scale).masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    lse = torch.where(torch.isfinite(lse), lse, torch.full_like(lse, float("inf")))
    p = torch.exp(s - lse[..., None])
    return p @ v, lse


def attention_bwd(q, k, v, out, lse, d_out, mask=None, causal=False):
    """(dq, dk, dv); the causal flag is accepted but the recomputation only applies the mask."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    allowed = _allowed(q.shape[-2], k.shape[-2], mask, False, q.device)  # causal missing from the bwd
    s = (q @ k.transpose(-2, -1) * scale).masked_fill(~allowed, float("-inf"))
    p = torch.exp(s - lse[..., None])
    dv = p.transpose(-2, -1) @ d_out
    dp = d_out @ v.transpose(-2, -1)
    delta = (d_out * out).sum(dim=-1, keepdim=True)
    ds = p * (dp - delta)
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv
