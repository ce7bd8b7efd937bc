"""Batched generation whose attention drops the padding mask on the single-token decode step. Source:
https://github.com/ml-explore/mlx-lm/issues/1906 (`create_attention_mask` returns `None` on the `N == 1` path, so a
left-padded batch member attends to its pads on every decode step). Bug: with n_q == 1 the key-padding mask is
ignored and padded keys leak into the output; every prefill call (n_q > 1) is right."""

import torch

SOURCE = "https://github.com/ml-explore/mlx-lm/issues/1906"
KIND = "forward"
EXPECTED = "padding-leak"
ALSO_OK = ()
CHECK = {"mask_form": "key_padding", "mask_convention": "allow"}
TARGET = "attention"


def attention(q, k, v, key_padding_mask=None):
    """q `[B, h, n_q, d]`, k/v `[B, h, n_k, d]`; `key_padding_mask [B, n_k]`, True = a real token."""
    if q.shape[-2] == 1:
        key_padding_mask = None  # "one new token needs no mask" (the N == 1 early return)
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if key_padding_mask is not None:
        scores = scores.masked_fill(~key_padding_mask[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # an all-padding sequence gives 0
    return weights @ v
