"""A TransformerLens-style causal self-attention that fills future scores with IGNORE = -1e5. Source:
https://github.com/TransformerLensOrg/TransformerLens/issues/318 ("Sometimes attention score on real text is < -1e5 ...
this makes the model attend outside the mask"; fixed by setting IGNORE to -inf in #319). Bug: once the allowed
scores fall below -1e5, future keys outscore them and leak in; ordinary scores are right (and in float16 -1e5 is
-inf, so float16 is right)."""

import math

import torch

SOURCE = "https://github.com/TransformerLensOrg/TransformerLens/issues/318"
KIND = "forward"
EXPECTED = "finite-fill"
ALSO_OK = ("causal-leak",)
CHECK = {"causal_only": True, "unsupported": ("cross",)}
TARGET = "attention"


class CausalSelfAttention:
    """The attention-pattern step of a causal self-attention block over `[B, h, n, d]`."""

    def __init__(self):
        self.IGNORE = torch.tensor(-1e5)  # a registered buffer in TransformerLens

    def __call__(self, q, k, v):
        """q, k, v `[..., n, d]` (self-attention: n_q == n_k) -> `[..., n, d_v]`."""
        n_q, n_k = q.shape[-2], k.shape[-2]
        if n_q != n_k:
            raise NotImplementedError(f"causal self-attention: n_q={n_q} must equal n_k={n_k}")
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        mask = torch.ones(n_q, n_k, dtype=torch.bool).tril()
        scores = torch.where(mask, scores, self.IGNORE)  # a 0-dim float32 tensor: the scores keep their dtype
        return torch.softmax(scores, dim=-1) @ v


attention = CausalSelfAttention()
