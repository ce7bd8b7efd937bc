"""A custom ``torch.autograd.Function`` whose forward zeroes fully masked rows and whose backward recomputes
``P = exp(S - lse)`` for them anyway.

Source: https://github.com/pytorch/pytorch/pull/196170 ("Fix NaN gradients in multi_head_attention_forward for
fully-masked rows": the all ``-inf`` row becomes NaN under plain softmax and autograd backprops ``0 * nan = nan`` into
every gradient of the batch).
Bug: the backward rebuilds the weights from the saved lse; on a row with no allowed key ``lse = -inf`` and
``exp(-inf - -inf)`` is NaN, which spreads into dQ, dK and dV.
Shows on: a mask that blocks every key of some query; right whenever each query keeps a key.
"""

import math

import torch

SOURCE = "https://github.com/pytorch/pytorch/pull/196170"
KIND = "backward"
EXPECTED = "grad-masked-row"
ALSO_OK = ()
CHECK = {"mask_convention": "allow", "backward": True}
TARGET = "attention"


def _scores(q, k, mask, scale):
    s = q @ k.transpose(-2, -1) * scale
    return s if mask is None else s.masked_fill(~mask, float("-inf"))


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask):
        scale = 1 / math.sqrt(q.shape[-1])
        s = _scores(q, k, mask, scale)
        lse = torch.logsumexp(s, dim=-1, keepdim=True)  # -inf on an empty row
        p = torch.exp(s - lse).nan_to_num(0.0)  # the forward is safe: zeros
        ctx.save_for_backward(q, k, v, lse)
        ctx.mask, ctx.scale = mask, scale
        return p @ v

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, lse = ctx.saved_tensors
        p = torch.exp(_scores(q, k, ctx.mask, ctx.scale) - lse)  # NaN on an empty row
        dv = p.transpose(-2, -1) @ d_out
        dp = d_out @ v.transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
        return ds @ k * ctx.scale, ds.transpose(-2, -1) @ q * ctx.scale, dv, None


def attention(q, k, v, mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k] (True = may attend)."""
    return _Attention.apply(q, k, v, mask)
