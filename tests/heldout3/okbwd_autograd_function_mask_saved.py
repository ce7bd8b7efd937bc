"""Correct: a custom `torch.autograd.Function` whose forward saves the mask to ctx and whose hand-written backward
recomputes P with it. Source: https://github.com/Dao-AILab/flash-attention/issues/2424 (what the FA4 wrappers
lacked: the mask must be saved to ctx and passed to the backward). Why correct: the backward uses exactly the
forward's masked P, delta = rowsum(dO * O), and returns no gradient for the mask."""

import torch

SOURCE = "https://github.com/Dao-AILab/flash-attention/issues/2424"
KIND = "backward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"backward": True}
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
        ctx.save_for_backward(q, k, v, out, mask if mask is not None else torch.empty(0, dtype=torch.bool))
        ctx.has_mask = mask is not None
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, mask = ctx.saved_tensors
        s = q @ k.transpose(-2, -1) * ctx.scale
        if ctx.has_mask:
            s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        dv = p.transpose(-2, -1) @ d_out
        ds = p * (d_out @ v.transpose(-2, -1) - (d_out * out).sum(dim=-1, keepdim=True))
        return ds @ k * ctx.scale, ds.transpose(-2, -1) @ q * ctx.scale, dv, None


def attention(q, k, v, mask=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `mask` bool, True = attend."""
    return _Attention.apply(q, k, v, mask)
