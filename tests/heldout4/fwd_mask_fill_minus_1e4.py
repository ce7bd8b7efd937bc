"""The seq2seq tutorial's scaled dot-product attention with the fp16-safe fill ``-1e4`` a user settled on.

Source: https://github.com/bentrevett/pytorch-seq2seq/issues/191 (``energy.masked_fill(mask == 0, -1e10)`` cannot be
converted to half; ``-inf`` gave NaN losses, "the safe way to go about this is to use -1e4").
Bug: blocked scores are set to the finite value -1e4, which only blocks while every allowed score is far above it.
Shows on: masks with allowed scores below about -1e4 (large logits); right on ordinary inputs.
"""

import math

import torch

SOURCE = "https://github.com/bentrevett/pytorch-seq2seq/issues/191"
KIND = "forward"
EXPECTED = "finite-fill"
ALSO_OK = ()
CHECK = {"mask_convention": "keep"}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask int [..., n_q, n_k] (1 = keep, 0 = masked)."""
    energy = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        energy = energy.masked_fill(mask == 0, -1e4)
    return torch.softmax(energy, dim=-1) @ v
