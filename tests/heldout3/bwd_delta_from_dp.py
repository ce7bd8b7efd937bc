"""A torch attention backward that takes delta as rowsum(dP) instead of rowsum(dO * O). Source:
https://github.com/Dao-AILab/flash-attention/pull/2481 (a wrong `dpsum = sum(O * dO)` "silently corrupts dS = P * (dP -
dpsum), and consequently dQ and dK (but not dV, which doesn't depend on dpsum)"). Rebuilt as the wrong-quantity form
of that bug: delta = dP.sum(-1). Bug: dQ and dK are wrong, dV is right."""

import torch

SOURCE = "https://github.com/Dao-AILab/flash-attention/pull/2481"
KIND = "backward"
EXPECTED = "grad-delta"
ALSO_OK = ()
CHECK = {"backward": "attention_bwd"}
TARGET = "attention"


def _probs(q, k, mask, scale):
    s = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0)


def attention(q, k, v, mask=None, scale=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `mask` bool, True = attend."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _probs(q, k, mask, scale) @ v


def attention_bwd(q, k, v, d_out, mask=None, scale=None):
    """(dq, dk, dv)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    p = _probs(q, k, mask, scale)
    dv = p.transpose(-2, -1) @ d_out
    dp = d_out @ v.transpose(-2, -1)
    delta = dp.sum(dim=-1, keepdim=True)  # should be (d_out * out).sum(-1) = (dp * p).sum(-1)
    ds = p * (dp - delta)
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv
