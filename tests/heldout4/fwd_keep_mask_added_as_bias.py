"""A BERT self-attention fed the tokenizer's 0/1 ``attention_mask`` directly as its additive mask.

Source: https://github.com/huggingface/transformers/issues/205 ("What is the meaning of Attention Mask": read as
"add 1 to the scores of real tokens and 0 outside the sequence"; BERT expects the mask precomputed as
``(1 - mask) * -10000``).
Bug: ``scores + attention_mask`` with the keep mask (1 = token, 0 = padding): padded keys are only 1 below the real
ones instead of blocked.
Shows on: any mask with a 0; right when nothing is masked (adding 1 everywhere shifts nothing).
"""

import math

import torch

SOURCE = "https://github.com/huggingface/transformers/issues/205"
KIND = "forward"
EXPECTED = "finite-fill"
ALSO_OK = ("padding-leak",)
CHECK = {"mask_convention": "keep"}
TARGET = "attention"


def attention(q, k, v, attention_mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], attention_mask int [..., n_q, n_k] (1 = keep)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if attention_mask is not None:
        scores = scores + attention_mask.to(scores.dtype)
    return torch.softmax(scores, dim=-1) @ v
