"""A FlashAttention-2-style pair `fwd -> (out, lse)`, `bwd(q, k, v, out, lse, d_out)` whose backward never receives
the mask the forward used. Source: https://github.com/Dao-AILab/flash-attention/issues/2424 ("Autograd wrappers don't
pass mask_mod ... to backward — silent wrong gradients"). Bug: the backward recomputes P = exp(s - lse) on every key,
so masked keys get gradient and the others' gradients are wrong; unmasked calls are right."""

import math

import numpy as np

SOURCE = "https://github.com/Dao-AILab/flash-attention/issues/2424"
KIND = "backward"
EXPECTED = "grad-masked-leak"
ALSO_OK = ()
CHECK = {"backward": "attention_bwd"}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """-> (out `[..., n_q, d_v]`, lse `[..., n_q]` in nats; +inf for a row with no key, as flash-attn)."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m0 = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m0)
    den = e.sum(axis=-1, keepdims=True)
    out = np.divide(e, den, out=np.zeros_like(e), where=den > 0) @ v
    with np.errstate(divide="ignore"):
        lse = np.where(den > 0, m0 + np.log(np.where(den > 0, den, 1)), np.inf)
    return out, lse[..., 0]


def attention_bwd(q, k, v, out, lse, d_out, mask=None):
    """(dq, dk, dv) from the forward's out and lse (the mask argument is accepted but not passed down)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) * scale  # mask_mod dropped here
    p = np.exp(s - lse[..., None])
    dv = np.swapaxes(p, -1, -2) @ d_out
    dp = d_out @ np.swapaxes(v, -1, -2)
    delta = (d_out * out).sum(axis=-1, keepdims=True)
    ds = p * (dp - delta)
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv
