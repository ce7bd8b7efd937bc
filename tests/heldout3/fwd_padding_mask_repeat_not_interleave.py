"""An `nn.MultiheadAttention`-style kernel (batch and heads flattened batch-major to `[B*h, n, d]`) that expands its
key-padding mask with `.repeat(h, 1, 1)`. Source: https://github.com/line/lighthouse/pull/77 ("The mask is built with
`.repeat(nhead, 1, 1)`, which tiles instead: [M0, M1, M0, M1] rather than the expected [M0, M0, M1, M1]"). Bug: head
slot b*h + i gets batch element (b*h + i) % B's padding; right with B == 1 or h == 1."""

import torch

SOURCE = "https://github.com/line/lighthouse/pull/77"
KIND = "forward"
EXPECTED = "mask-wrong-heads"
ALSO_OK = ()
CHECK = {"mask_form": "key_padding", "mask_convention": "block", "ranks": (4,)}
TARGET = "attention"


def attention(q, k, v, key_padding_mask=None):
    """q `[B, h, n_q, d]`, k/v `[B, h, n_k, d]`; `key_padding_mask [B, n_k]`, True = padding (ignored key)."""
    B, h, n_q, d = q.shape
    n_k = k.shape[-2]
    qf, kf, vf = q.reshape(B * h, n_q, d), k.reshape(B * h, n_k, d), v.reshape(B * h, n_k, v.shape[-1])
    scores = torch.bmm(qf, kf.transpose(1, 2)) * d**-0.5  # [B*h, n_q, n_k]
    if key_padding_mask is not None:
        m = key_padding_mask[:, None, :].expand(B, n_q, n_k)
        m = m.repeat(h, 1, 1)  # should be repeat_interleave(h, dim=0)
        scores = scores.masked_fill(m, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.bmm(weights, vf).reshape(B, h, n_q, -1)
