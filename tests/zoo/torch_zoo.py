"""PyTorch attention implementations: correct ones (SDPA, nn.MultiheadAttention internals) and broken ones."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import Entry


def _manual(q, k, v, allowed=None, scale=None):
    s = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    d = e.sum(dim=-1, keepdim=True)
    return torch.where(d > 0, e / d.clamp_min(torch.finfo(e.dtype).tiny), torch.zeros_like(e)) @ v


def correct(q, k, v, mask=None):
    """Correct manual PyTorch attention."""
    return _manual(q, k, v, mask)


class MHAWrapper:
    """Attention through nn.MultiheadAttention with identity projections: q, k, v [B, h, n, d] ->
    [B, n, h·d], the module splits heads itself. Masks are True = blocked ([B·h, n_q, n_k]); returns
    (out, per-head weights)."""

    __name__ = "mha_wrapper"

    def __call__(self, q, k, v, mask=None):
        if q.ndim != 4 or q.shape[-1] != v.shape[-1]:
            raise ValueError("mha_wrapper: expects [B, h, n, d] with d_v == d_k")
        b, h, n_q, d = q.shape
        e = h * d
        mha = torch.nn.MultiheadAttention(e, h, bias=False, batch_first=True, dtype=q.dtype)
        with torch.no_grad():
            mha.in_proj_weight.copy_(torch.eye(e, dtype=q.dtype).repeat(3, 1))
            mha.out_proj.weight.copy_(torch.eye(e, dtype=q.dtype))
        mha.eval()

        def merge(x):
            return x.transpose(1, 2).reshape(b, x.shape[2], e)  # [B, n, h·d]

        attn_mask = None if mask is None else mask.reshape(b * h, *mask.shape[-2:])
        with torch.no_grad():
            out, w = mha(
                merge(q), merge(k), merge(v), attn_mask=attn_mask, need_weights=True, average_attn_weights=False
            )
        return out.reshape(b, n_q, h, d).transpose(1, 2), w


def sdpa_math(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """PyTorch SDPA forced onto its math backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )


def sdpa_inverted(q, k, v, attn_mask=None, is_causal=False):
    """Passes a True = may attend mask to SDPA after 'converting' it as if it were True = blocked."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=None if attn_mask is None else ~attn_mask, is_causal=is_causal
    )


def view_not_transpose(q, k, v, mask=None):
    """Subtle: [B, n, h, d] -> [B, h, n, d] with .reshape instead of .transpose; right with one head."""
    b, _, h, _ = q.shape
    qq, kk, vv = (x.reshape(b, h, x.shape[1], x.shape[-1]) for x in (q, k, v))
    out = _manual(qq, kk, vv, mask)
    return out.transpose(1, 2)


def unstable(q, k, v, mask=None):
    """Subtle: torch.exp without subtracting the max."""
    e = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))
    if mask is not None:
        e = e * mask
    return e / e.sum(dim=-1, keepdim=True) @ v


def returns_float32(q, k, v, mask=None):
    """Subtle: computes half precision in float32 (good) but forgets to cast back for float16 / bfloat16 inputs."""
    if q.dtype in (torch.float16, torch.bfloat16):
        q, k, v = q.float(), k.float(), v.float()
    return _manual(q, k, v, mask)


def mul_in_place(q, k, v, mask=None):
    """Subtle: right output, but q.mul_(scale) writes into the caller's tensor."""
    q.mul_(1 / math.sqrt(q.shape[-1]))
    return _manual(q, k, v, mask, scale=1.0)


def triu_diagonal(q, k, v, mask=None, is_causal=False):
    """Causal mask built with triu(diagonal=2) instead of diagonal=1: one future token leaks."""
    allowed = mask
    if is_causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        future = torch.triu(torch.ones(n_q, n_k, dtype=torch.bool), diagonal=2)
        allowed = ~future if allowed is None else allowed & ~future
    return _manual(q, k, v, allowed)


def dropout_left_on(q, k, v, mask=None):
    """Dropout on the weights with training=True left on at inference."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=-1)
    w = torch.nan_to_num(w)
    return F.dropout(w, p=0.1, training=True) @ v


def returns_numpy(q, k, v, mask=None):
    """Subtle: right values, but hands back a NumPy array (.numpy()) where the caller expects a tensor."""
    return _manual(q, k, v, mask).numpy()


def softmax_nan(q, k, v, mask=None):
    """masked_fill(-inf) + torch.softmax: a fully masked row is NaN."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


ENTRIES = [
    Entry("torch-correct", correct),
    Entry("torch-sdpa", F.scaled_dot_product_attention, options={"gqa": True}),
    Entry("torch-sdpa-math", sdpa_math, options={"gqa": True}),
    Entry("torch-mask-inverted", sdpa_inverted, ("mask-inverted",)),
    Entry(
        "torch-view-not-transpose",
        view_not_transpose,
        ("batch-leak",),
        options={"layout": "bnhd"},
        also=("causal-leak", "padding-leak"),
        subtle=True,
    ),
    Entry("torch-unstable", unstable, ("unstable-softmax",), also=("padding-leak", "masked-row-nan"), subtle=True),
    Entry("torch-returns-float32", returns_float32, ("dtype",), subtle=True),
    Entry("torch-mul-in-place", mul_in_place, ("mutates-input",), subtle=True),
    # also reference-mismatch: on the rectangular causal case triu(diagonal=2) matches neither alignment
    Entry("torch-triu-diagonal", triu_diagonal, ("causal-leak",), also=("reference-mismatch",), subtle=True),
    Entry("torch-returns-numpy", returns_numpy, ("output-type",), subtle=True),
    Entry("torch-dropout", dropout_left_on, ("nondeterministic",), also=("not-normalized",)),
    Entry("torch-softmax-nan", softmax_nan, ("masked-row-nan",)),
]
