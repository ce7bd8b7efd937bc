"""A torch attention backward with a dropout keep mask that applies the mask and 1/(1-p) in dV but not in dP.
Source: https://github.com/Dao-AILab/flash-attention/issues/93 (where the 1/(1-p) of the forward's dropout goes:
"instead of scaling P by 1/(1-p) before multiplying P with V, we multiply P with V first ... then scale"; the same
must happen in the backward for dV and dP). Bug: dP = dO V^T misses keep / (1 - p), so dQ and dK are wrong with
dropout; dV is right, and without dropout everything is right."""

import torch

SOURCE = "https://github.com/Dao-AILab/flash-attention/issues/93"
KIND = "backward"
EXPECTED = "grad-dropout"
ALSO_OK = ()
CHECK = {"backward": "attention_bwd"}
TARGET = "attention"


def _probs(q, k, mask, scale):
    s = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0)


def attention(q, k, v, mask=None, scale=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `mask` bool, True = attend (inference: no dropout)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _probs(q, k, mask, scale) @ v


def attention_bwd(q, k, v, d_out, mask=None, scale=None, dropout_mask=None, dropout_p=0.0):
    """(dq, dk, dv) of `dropout(softmax(q k^T * scale)) @ v`; `dropout_mask` True = kept."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    p = _probs(q, k, mask, scale)
    drop = torch.ones_like(p) if dropout_mask is None else dropout_mask.to(p.dtype) / (1.0 - dropout_p)
    dv = (p * drop).transpose(-2, -1) @ d_out
    dp = d_out @ v.transpose(-2, -1)  # missing: * drop
    ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv
