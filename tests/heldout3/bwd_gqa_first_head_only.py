"""A torch GQA backward that writes each K/V head's gradient from the first query head of its group instead of
summing over the group. Source: https://github.com/marin-community/levanter/pull/449 ("K,V are broadcasted over Q's
axis during forward pass but the un-broadcast cannot be automatically done by the FA backward kernel ... the gradient
should simply be a summation over this axis"). Bug: dK/dV keep 1 of the h / h_kv contributions; right without GQA."""

import torch

SOURCE = "https://github.com/marin-community/levanter/pull/449"
KIND = "backward"
EXPECTED = "grad-gqa-sum"
ALSO_OK = ()
CHECK = {"backward": "attention_bwd", "gqa": True}
TARGET = "attention"


def _expand(x, n_rep):
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=-3)


def _probs(q, k, mask, scale):
    s = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0)


def attention(q, k, v, mask=None, scale=None):
    """q `[B, h, n_q, d]`, k/v `[B, h_kv, n_k, d]` (query head i reads K/V head i // (h / h_kv))."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    n_rep = q.shape[-3] // k.shape[-3]
    return _probs(q, _expand(k, n_rep), mask, scale) @ _expand(v, n_rep)


def attention_bwd(q, k, v, d_out, mask=None, scale=None):
    """(dq `[B, h, n_q, d]`, dk `[B, h_kv, n_k, d]`, dv `[B, h_kv, n_k, d_v]`)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    n_rep = q.shape[-3] // k.shape[-3]
    ke, ve = _expand(k, n_rep), _expand(v, n_rep)
    p = _probs(q, ke, mask, scale)
    dv = p.transpose(-2, -1) @ d_out
    dp = d_out @ ve.transpose(-2, -1)
    ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
    dq = ds @ ke * scale
    dk = ds.transpose(-2, -1) @ q * scale
    # un-broadcast: take the group's first query head (should be a sum over the group)
    dk = dk[..., ::n_rep, :, :]
    dv = dv[..., ::n_rep, :, :]
    return dq, dk, dv
