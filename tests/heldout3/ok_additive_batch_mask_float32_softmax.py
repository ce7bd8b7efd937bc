"""Correct: a Hugging Face eager-style attention taking a 4-D additive mask `[B, 1, n_q, n_k]` (0 or a large negative
value), with scores, mask and softmax in float32 or better. Source: https://github.com/huggingface/transformers/pull/17306
("Fix -1e4 as attn mask": finfo(dtype).min, and in fp16 finfo.min + (-16) = -inf, hence the softmax in float32). Why
correct: adding the mask after the upcast never overflows; a fully masked row is a documented (non-NaN) average."""

import torch

SOURCE = "https://github.com/huggingface/transformers/pull/17306"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"mask_form": "batch", "mask_convention": "additive", "ranks": (4,)}
TARGET = "attention"


def attention(query, key, value, attention_mask=None, scaling=None):
    """query `[B, h, n_q, d]`, key/value `[B, h, n_k, d]`; `attention_mask [B, 1, n_q, n_k]` additive."""
    acc = torch.promote_types(query.dtype, torch.float32)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    attn_weights = torch.matmul(query.to(acc), key.to(acc).transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask.to(acc)
    attn_weights = torch.softmax(attn_weights, dim=-1)
    return torch.matmul(attn_weights, value.to(acc)).to(query.dtype)
