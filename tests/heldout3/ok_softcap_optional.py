"""Correct: a Gemma-2-style attention with optional logit soft-capping (`softcap * tanh(s / softcap)` before the
mask), off by default. Source: https://github.com/ReaLLMASIC/ReaLLM-Forge/pull/461 ("Attention logit softcapping does
softcapping right before the masking", as in google/gemma_pytorch). Why correct: with `softcap=None` it is plain
scaled dot-product attention; the cap, when given, is applied to the scaled scores before masking."""

import torch

SOURCE = "https://github.com/ReaLLMASIC/ReaLLM-Forge/pull/461"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"mask_arg": "attn_mask", "scale_arg": "scale"}
TARGET = "attention"


def attention(q, k, v, attn_mask=None, scale=None, softcap=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `attn_mask` bool, True = attend."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
        has_key = attn_mask.any(dim=-1, keepdim=True)
    weights = torch.softmax(scores, dim=-1)
    if attn_mask is not None:
        weights = torch.where(has_key, weights, torch.zeros_like(weights))
    return weights @ v
