"""A self-attention padding mask `[B, n]` broadcast as `[B, 1, n, 1]`, so it masks query rows instead of key
columns. Source: https://github.com/lsdefine/attention-is-all-you-need-keras/issues/16 (the `(-1e10)*(1-mask)` term
"will broadcast mmask to the shape of attn, which will mask some rows"; a padded query row becomes 1/3, 1/3, 1/3).
Bug: real queries still attend to padded keys; only the padded queries' own rows change."""

import math

import torch

SOURCE = "https://github.com/lsdefine/attention-is-all-you-need-keras/issues/16"
KIND = "forward"
EXPECTED = "padding-leak"
ALSO_OK = ()
CHECK = {"mask_form": "key_padding", "mask_convention": "allow", "unsupported": ("cross",)}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """Self-attention over `[B, h, n, d]`; `mask [B, n]`, True = a real token."""
    if q.shape[-2] != k.shape[-2]:
        raise NotImplementedError(f"self-attention only: n_q={q.shape[-2]} must equal n_k={k.shape[-2]}")
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = torch.where(mask[:, None, :, None], scores, torch.finfo(scores.dtype).min)  # rows, not columns
    return torch.softmax(scores, dim=-1) @ v
