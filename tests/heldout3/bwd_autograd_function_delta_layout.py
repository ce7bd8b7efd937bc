"""A custom `torch.autograd.Function` whose hand-written backward computes delta = rowsum(dO * O) by flattening O and
dO as if both were contiguous `[B, h, n, d]`, while dO arrives `[B, n, h, d]`-ordered. Source:
https://github.com/flagos-ai/FlagAttention/pull/1 ("Previous implementation assumes do, o to be of shape (B, H, T, D)
and C-contiguous ... The kernel cannot make such assumption"; fixed by passing each tensor's strides). Bug: each
query row's delta is built from another head's (and position's) O, so gradients mix heads; the forward is right."""

import torch

SOURCE = "https://github.com/flagos-ai/FlagAttention/pull/1"
KIND = "backward"
EXPECTED = "grad-batch-leak"
ALSO_OK = ()
CHECK = {"backward": True, "ranks": (4,)}
TARGET = "attention"


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask):
        scale = q.shape[-1] ** -0.5
        s = q @ k.transpose(-2, -1) * scale
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out = p @ v
        ctx.save_for_backward(q, k, v, out, p)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, p = ctx.saved_tensors
        B, h, n_q, d_v = out.shape
        do_bnhd = d_out.transpose(1, 2).contiguous()  # the layout the caller's grad arrives in
        # _bwd_preprocess: both read as contiguous [B*h*n_q, d_v] rows
        delta = (out.reshape(-1, d_v) * do_bnhd.reshape(-1, d_v)).sum(-1).reshape(B, h, n_q, 1)
        dv = p.transpose(-2, -1) @ d_out
        dp = d_out @ v.transpose(-2, -1)
        ds = p * (dp - delta)
        return ds @ k * ctx.scale, ds.transpose(-2, -1) @ q * ctx.scale, dv, None


def attention(q, k, v, mask=None):
    """q `[B, h, n_q, d]`, k/v `[B, h, n_k, d]`; `mask` bool, True = attend."""
    return _Attention.apply(q, k, v, mask)
