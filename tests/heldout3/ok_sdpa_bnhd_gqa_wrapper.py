"""Correct: a `[B, n, h, d]` wrapper over PyTorch SDPA with `enable_gqa=True` (the layout FlashAttention and JAX use).
Source: https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html (enable_gqa
maps query head i to K/V head i // (h / h_kv); `is_causal` is top-left). Why correct: it only transposes at the
edges and passes every argument through."""

import torch.nn.functional as F

SOURCE = "https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"layout": "bnhd", "gqa": True, "ranks": (4,)}
TARGET = "attention"


def attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """q `[B, n_q, h, d]`, k/v `[B, n_k, h_kv, d]`; `attn_mask [B, h, n_q, n_k]` bool, True = attend."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=attn_mask,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(1, 2)
