"""Correct: an attention taking a Hugging Face-style integer mask (1 = keep, 0 = masked) and filling masked scores with
`finfo(scores.dtype).min`. Source: https://github.com/google/flax/pull/1527 ("updated attention mask value based on
dtype": `finfo(dtype).min` instead of -1e10, which is -inf in float16). Why correct: the fill is the most negative
finite value of the computation's dtype, so blocked keys get weight 0 and a fully masked row is exactly uniform."""

import torch

SOURCE = "https://github.com/google/flax/pull/1527"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"mask_convention": "keep", "masked_rows": "uniform"}
TARGET = "attention"


def attention(q, k, v, attention_mask=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `attention_mask` int `[..., n_q, n_k]`, 1 = keep."""
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if attention_mask is not None:
        scores = scores.masked_fill(attention_mask == 0, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1) @ v
