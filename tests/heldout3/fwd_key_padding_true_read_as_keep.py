"""A hand-written multi-head attention that takes `nn.MultiheadAttention`'s `key_padding_mask` (True = padding) but
fills where the mask is False. Source: https://github.com/mlwithme/TransformerTranslation/issues/2 (should it be
`masked_fill(key_padding_mask, -inf)` or `masked_fill(key_padding_mask == False, -inf)`? The answer depends on how
the mask was built). Bug: the padding convention is read the other way round, so only the padded keys are attended."""

import torch

SOURCE = "https://github.com/mlwithme/TransformerTranslation/issues/2"
KIND = "forward"
EXPECTED = "mask-inverted"
ALSO_OK = ()
CHECK = {"mask_form": "key_padding", "mask_convention": "block"}
TARGET = "attention"


def attention(q, k, v, key_padding_mask=None):
    """q `[B, h, n_q, d]`, k/v `[B, h, n_k, d]`; `key_padding_mask [B, n_k]` bool, True = padding."""
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if key_padding_mask is not None:
        scores = scores.masked_fill(~key_padding_mask[:, None, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v
