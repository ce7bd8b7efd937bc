"""A timm-style attention whose boolean mask is filled into the weights after the softmax. Source:
https://github.com/huggingface/pytorch-image-models/pull/2236 ("eva.py: fixed bug in applying attention mask. The mask
should be applied before the softmax."). Rebuilt as that class of bug: `masked_fill(~mask, -inf)` on the softmax
output, so every row with a blocked key sums to -inf (inf/NaN outputs); right when nothing is masked."""

import torch

SOURCE = "https://github.com/huggingface/pytorch-image-models/pull/2236"
KIND = "forward"
EXPECTED = "fill-after-softmax"
ALSO_OK = ()
CHECK = {"mask_arg": "attn_mask"}
TARGET = "attention"


def attention(q, k, v, attn_mask=None):
    """q `[B, h, n_q, d]`, k/v `[B, h, n_k, d]`; `attn_mask` bool `[B, h, n_q, n_k]`, True = attend (timm)."""
    q = q * q.shape[-1] ** -0.5
    attn = torch.matmul(q, k.transpose(-2, -1))
    attn = attn.softmax(dim=-1)
    if attn_mask is not None:
        attn = attn.masked_fill(~attn_mask, float("-inf"))
    return attn @ v
