"""An attention backward with dropout given as a keep mask, in the FlashAttention paper's form.

Source: https://github.com/Dao-AILab/flash-attention/pull/2657 (attention dropout forward and backward for the CuTe
kernels: the backward regenerates the forward's keep pattern and scales by ``1/(1-p)``).
Correct: ``P_drop = P * keep / (1 - p)``; ``dV = P_dropᵀ dO``; ``dP = (dO Vᵀ) * keep / (1 - p)``;
``dS = P (dP - rowsum(dO O))``.
"""

import math

import torch

SOURCE = "https://github.com/Dao-AILab/flash-attention/pull/2657"
KIND = "backward"
EXPECTED = None
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
    keep = torch.ones_like(p) if dropout_mask is None else dropout_mask.to(p.dtype) / (1 - dropout_p)
    out = (p * keep) @ v
    dv = (p * keep).transpose(-2, -1) @ d_out
    dp = (d_out @ v.transpose(-2, -1)) * keep
    ds = p * (dp - (d_out * out).sum(dim=-1, keepdim=True))
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv
