"""A FlashAttention-style forward that returns ``lse = log(sum(exp(s)))`` without the max shift.

Source: https://github.com/lzx1413/PytorchSSD/issues/22 ("why use the x_max in function log_sum_exp()? If we remove
x_max the output is just the same": it is there for overflow).
Bug: the output is computed with a max-shifted softmax, but the lse handed to the backward is ``log(sum(exp(s)))``,
which overflows to inf (or underflows to -inf) at large logits; ``P = exp(s - lse)`` in the backward is then 0 (or
inf) and the gradients are wrong.
Shows on: logits of about ±1000; right on ordinary inputs.
"""

import math

import numpy as np

SOURCE = "https://github.com/lzx1413/PytorchSSD/issues/22"
KIND = "backward"
EXPECTED = "grad-lse"
ALSO_OK = ()
CHECK = {"mask_convention": "allow", "backward": "attention_bwd"}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """-> (out [..., n_q, d_v], lse [..., n_q])."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    z = e.sum(axis=-1, keepdims=True)
    out = np.divide(e, z, out=np.zeros_like(e), where=z > 0) @ v
    with np.errstate(over="ignore", divide="ignore"):
        lse = np.log(np.exp(s).sum(axis=-1))  # no max: overflows at large logits
    return out, lse


def attention_bwd(q, k, v, out, lse, d_out, mask=None):
    """FlashAttention-2's backward: (dq, dk, dv) from the forward's out and lse."""
    scale = 1 / math.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) * scale
    with np.errstate(over="ignore", invalid="ignore"):
        p = np.exp(s - lse[..., None])
    if mask is not None:
        p = np.where(mask, p, 0)
    dv = np.swapaxes(p, -1, -2) @ d_out
    dp = d_out @ np.swapaxes(v, -1, -2)
    delta = (d_out * out).sum(axis=-1, keepdims=True)
    ds = p * (dp - delta)
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv
