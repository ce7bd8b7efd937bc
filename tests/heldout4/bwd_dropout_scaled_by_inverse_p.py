"""An attention backward whose dropout rescales kept weights by ``1/p`` instead of ``1/(1-p)``.

Source: https://github.com/rasbt/LLMs-from-scratch/issues/431 ("Incorrect explanation of the scaling of the
non-dropped values": described as ``1/dropout``; the actual factor is ``1/(1 - dropout)``; both are 2 at 50%).
Bug: the forward scales kept weights by ``1/(1-p)``; the backward by ``1/p``.
Shows on: dropout with p != 0.5; right for p = 0.5 and without dropout.
"""

import math

import torch

SOURCE = "https://github.com/rasbt/LLMs-from-scratch/issues/431"
KIND = "backward"
EXPECTED = "grad-dropout"
ALSO_OK = ()
CHECK = {"mask_convention": "allow", "backward": "attention_bwd"}
TARGET = "attention"


def _probs(q, k, mask, scale):
    s = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0)


def attention(q, k, v, mask=None, dropout_mask=None, dropout_p=0.0):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v]; dropout_mask bool [..., n_q, n_k] (True = kept)."""
    p = _probs(q, k, mask, 1 / math.sqrt(q.shape[-1]))
    if dropout_mask is not None:
        p = p * dropout_mask / (1 - dropout_p)
    return p @ v


def attention_bwd(q, k, v, d_out, mask=None, dropout_mask=None, dropout_p=0.0):
    """d_out [..., n_q, d_v] -> (dq, dk, dv)."""
    scale = 1 / math.sqrt(q.shape[-1])
    p = _probs(q, k, mask, scale)
    keep = (
        torch.ones_like(p) if dropout_mask is None else dropout_mask.to(p.dtype) / dropout_p
    )  # should be / (1 - dropout_p)
    dv = (p * keep).transpose(-2, -1) @ d_out
    dp = (d_out @ v.transpose(-2, -1)) * keep
    ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv
