"""An attention layer with a KV cache that is appended to on every call and never cleared between sequences.
Source: https://github.com/Lightning-AI/litgpt/pull/1596 ("the kv-cache was cleared incompletely", giving weird
generations from the Python API until the cache was rebuilt per prompt). Bug: a call whose batch/head/width match
the previous call's also attends to the previous calls' keys and values; the first call is right."""

import torch

SOURCE = "https://github.com/Lightning-AI/litgpt/pull/1596"
KIND = "forward"
EXPECTED = "nondeterministic"
ALSO_OK = ("reference-mismatch",)
CHECK = {}
TARGET = "attention"


class CachedAttention:
    """`attention(q, k, v, mask=None)` over `[B, h, n, d]` that keeps its K/V for the next step."""

    def __init__(self):
        self.k_cache = None
        self.v_cache = None

    def _compatible(self, k, v):
        c = self.k_cache
        return (
            c is not None
            and c.shape[:-2] == k.shape[:-2]
            and c.shape[-1] == k.shape[-1]
            and self.v_cache.shape[-1] == v.shape[-1]
            and c.dtype == k.dtype
        )

    def __call__(self, q, k, v, mask=None):
        """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `mask` bool `[..., n_q, n_k]`, True = attend."""
        if self._compatible(k, v):
            n_old = self.k_cache.shape[-2]
            k = torch.cat([self.k_cache, k], dim=-2)
            v = torch.cat([self.v_cache, v], dim=-2)
            if mask is not None:
                old = torch.ones((*mask.shape[:-1], n_old), dtype=torch.bool, device=mask.device)
                mask = torch.cat([old, mask], dim=-1)
        self.k_cache, self.v_cache = k, v
        scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v


attention = CachedAttention()
