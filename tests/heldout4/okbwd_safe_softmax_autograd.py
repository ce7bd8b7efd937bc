"""An attention in plain torch ops with a "safe softmax" (zeros on empty rows), differentiated by autograd.

Source: https://github.com/pytorch/pytorch/pull/131060 ("Add a private _safe_softmax": fully masked rows become zeros
instead of NaN, in the forward and in what autograd sends back).
Correct: ``where(row has an allowed key, softmax(s), 0)`` with the masked scores replaced by a finite value before the
exponential, so autograd never meets ``exp(-inf - -inf)``.
"""

import math

import torch

SOURCE = "https://github.com/pytorch/pytorch/pull/131060"
KIND = "backward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"mask_convention": "allow", "backward": True}
TARGET = "attention"


def safe_softmax(s, allowed):
    """Softmax over the last axis of ``s`` restricted to ``allowed``; all-zero rows where nothing is allowed."""
    s = s.masked_fill(~allowed, torch.finfo(s.dtype).min)
    m = s.amax(dim=-1, keepdim=True).detach()
    e = torch.exp(s - m) * allowed
    z = e.sum(dim=-1, keepdim=True)
    return e / torch.where(z > 0, z, torch.ones_like(z))


def attention(q, k, v, mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k] (True = may attend)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    allowed = torch.ones_like(s, dtype=torch.bool) if mask is None else mask.expand_as(s)
    return safe_softmax(s, allowed) @ v
