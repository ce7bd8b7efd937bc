"""The book's causal attention shortened to one step: ``torch.tril`` on the softmax weights.

Source: https://github.com/rasbt/LLMs-from-scratch/issues/279 ("Applying mask to attention in one operation":
``torch.tril(attn_weights)`` replaces building a ``tril`` mask and multiplying; the book's renormalisation step that
follows the multiply is what this one-step version leaves out).
Bug: the weights are masked after the softmax and not renormalised, so a row's weights sum to less than 1.
Shows on: every causal input with more than one key in a row; right only for a single query and a single key.
"""

import math

import torch

SOURCE = "https://github.com/rasbt/LLMs-from-scratch/issues/279"
KIND = "forward"
EXPECTED = "mask-after-softmax"
ALSO_OK = ("not-normalized",)
CHECK = {"causal_only": True, "causal_align": "top_left"}
TARGET = "attention"


def attention(q, k, v):
    """Causal (top-left) attention: q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v]."""
    attn_weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return torch.tril(attn_weights) @ v
