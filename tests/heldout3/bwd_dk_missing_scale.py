"""A torch attention backward that applies the softmax scale to dQ but not to dK. Source:
https://github.com/triton-lang/triton/issues/919 (the Triton fused-attention backward folds `sm_scale` into
`ds = p * dp * sm_scale`, which feeds both `dk += ds^T q` and `dq += ds k`; rebuilt as a port that moved the scale
out of ds and re-applied it to dq only). Bug: dK is 1/scale = sqrt(d_k) times too large; dQ and dV are right."""

import torch

SOURCE = "https://github.com/triton-lang/triton/issues/919"
KIND = "backward"
EXPECTED = "grad-scale"
ALSO_OK = ()
CHECK = {"backward": "attention_bwd"}
TARGET = "attention"


def _probs(q, k, mask, scale):
    s = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    return p.nan_to_num(0.0)


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
    ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
    dq = ds @ k * scale
    dk = ds.transpose(-2, -1) @ q  # sm_scale lost here
    return dq, dk, dv
