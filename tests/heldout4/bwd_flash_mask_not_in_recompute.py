"""A FlashAttention-style ``(out, lse)`` forward with a backward that recomputes P without the key mask.

Source: https://github.com/ROCm/aiter/issues/3551 ("Apply `mask_mn` in FlashAttention backward non-causal Triton
kernel": the forward masks the out-of-range keys, the non-causal backward does not).
Bug: ``P = exp(S - lse)`` in the backward is computed on every key, so masked keys get dK/dV and pull on dQ.
Shows on: any mask with a blocked key; right without a mask.
"""

import math

import numpy as np

SOURCE = "https://github.com/ROCm/aiter/issues/3551"
KIND = "backward"
EXPECTED = "grad-masked-leak"
ALSO_OK = ()
CHECK = {"mask_convention": "allow", "backward": "attention_bwd"}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """-> (out [..., n_q, d_v], lse [..., n_q]); lse is +inf on a row with no allowed key."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    z = np.exp(s - m).sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = np.where(z > 0, m + np.log(z), np.inf)
    p = np.exp(s - lse)
    return p @ v, lse[..., 0]


def attention_bwd(q, k, v, out, lse, d_out, mask=None):
    """FlashAttention-2's backward: (dq, dk, dv) from the forward's out and lse."""
    scale = 1 / math.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) * scale
    p = np.exp(s - lse[..., None])  # the mask is never applied here
    dv = np.swapaxes(p, -1, -2) @ d_out
    dp = d_out @ np.swapaxes(v, -1, -2)
    delta = (d_out * out).sum(axis=-1, keepdims=True)
    ds = p * (dp - delta)
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv
