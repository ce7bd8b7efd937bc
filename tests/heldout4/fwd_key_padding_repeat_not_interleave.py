"""A cross-modal encoder that flattens batch and heads, and tiles its key-padding mask over the flattened slots.

Source: https://github.com/ArrowLuo/CLIP4Clip/issues/22 ("wrong masking for multi-head attention": the mask must be
``repeat_interleave(n_head, dim=0)``).
Bug: q, k, v are flattened batch-major to ``[B*h, n, d]`` (slot ``b*h + head``) but the ``[B, n_k]`` mask is expanded
with ``.repeat(h, 1, 1)``, which gives slot ``b*h + head`` the mask of sequence ``(b*h + head) % B``.
Shows on: B > 1 and h > 1 with different padding per sequence; right with B == 1 or h == 1.
"""

import math

import torch

SOURCE = "https://github.com/ArrowLuo/CLIP4Clip/issues/22"
KIND = "forward"
EXPECTED = "mask-wrong-heads"
ALSO_OK = ()
CHECK = {"mask_form": "key_padding", "mask_convention": "allow", "ranks": (4,)}
TARGET = "attention"


def attention(q, k, v, key_padding_mask=None):
    """q [B, h, n_q, d], k [B, h, n_k, d], v [B, h, n_k, d_v], key_padding_mask bool [B, n_k] (True = a real key)."""
    b, h, n_q, d = q.shape
    qf = q.reshape(b * h, n_q, d)
    kf = k.reshape(b * h, k.shape[-2], d)
    vf = v.reshape(b * h, v.shape[-2], v.shape[-1])
    scores = qf @ kf.transpose(1, 2) / math.sqrt(d)  # [B*h, n_q, n_k]
    if key_padding_mask is not None:
        m = key_padding_mask[:, None, :].repeat(h, 1, 1)  # [B*h, 1, n_k], tiled: should be repeat_interleave
        scores = scores.masked_fill(~m, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (weights @ vf).reshape(b, h, n_q, v.shape[-1])
