"""A decode kernel that keeps its V cache in bfloat16 and casts the float32 softmax weights to bfloat16 before the
product with V, whatever the input precision. Source: https://github.com/vllm-project/vllm/pull/2368 ("Before this
PR: Cast logits from FP32 to BF16/FP16, then compute dot(logits, V). After this PR: Cast V from BF16/FP16 to FP32").
Bug: float32 and float64 inputs come out with bfloat16-sized errors (about 1e-2 relative); bfloat16 inputs are right."""

import torch

SOURCE = "https://github.com/vllm-project/vllm/pull/2368"
KIND = "forward"
EXPECTED = "precision"
ALSO_OK = ()
CHECK = {}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `mask` bool, True = attend."""
    scores = (q.float() @ k.float().transpose(-2, -1)) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    logits = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    v_cache = v.to(torch.bfloat16)  # the cache's storage dtype
    out = logits.to(torch.bfloat16) @ v_cache
    return out.to(q.dtype)
