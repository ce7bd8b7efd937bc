"""A custom ``torch.autograd.Function`` for attention that saves its weights and writes the backward by hand.

Source: https://github.com/pytorch/pytorch/pull/86901 (the autograd onboarding lab's ``AttentionFunction``, reviewed:
save what the backward needs, such as the weights ``a``, instead of recomputing the expensive matmuls).
Correct: the forward saves P (zeros on a row with no allowed key); the backward is ``dV = Pᵀ dO``,
``dS = P (dP - rowsum(dP P))``, ``dQ = dS K scale``, ``dK = dSᵀ Q scale``.
"""

import math

import torch

SOURCE = "https://github.com/pytorch/pytorch/pull/86901"
KIND = "backward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"mask_convention": "allow", "backward": True}
TARGET = "attention"


class AttentionFunction(torch.autograd.Function):
    """softmax(Q Kᵀ scale + mask) V with a hand-written backward."""

    @staticmethod
    def forward(ctx, q, k, v, mask):
        scale = 1 / math.sqrt(q.shape[-1])
        s = q @ k.transpose(-2, -1) * scale
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        ctx.save_for_backward(q, k, v, p)
        ctx.scale = scale
        return p @ v

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, p = ctx.saved_tensors
        dv = p.transpose(-2, -1) @ d_out
        dp = d_out @ v.transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
        return ds @ k * ctx.scale, ds.transpose(-2, -1) @ q * ctx.scale, dv, None


def attention(q, k, v, mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k] (True = may attend)."""
    return AttentionFunction.apply(q, k, v, mask)
