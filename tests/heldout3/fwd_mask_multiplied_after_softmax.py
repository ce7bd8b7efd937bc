"""An einsum attention that multiplies the softmax weights by the mask (no renormalisation). Source:
https://github.com/lucidrains/memory-compressed-attention/issues/2 ("I'm wondering if we need to do softmax operation
after masking?"; fixed in a41fd4d). Bug: blocked weights are zeroed after the softmax, so the allowed weights of a
row sum to less than 1; right when nothing is masked."""

import torch

SOURCE = "https://github.com/lucidrains/memory-compressed-attention/issues/2"
KIND = "forward"
EXPECTED = "mask-after-softmax"
ALSO_OK = ()
CHECK = {"ranks": (4,)}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q `[b, h, i, d]`, k/v `[b, h, j, d]`; `mask` bool `[b, h, i, j]`, True = attend."""
    dots = torch.einsum("bhid,bhjd->bhij", q, k) * q.shape[-1] ** -0.5
    attn = dots.softmax(dim=-1)
    if mask is not None:
        attn = attn * mask
    return torch.einsum("bhij,bhjd->bhid", attn, v)
