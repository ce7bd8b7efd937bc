"""An OPT-style attention that scales the query (`q_proj(hidden) * self.scaling`) and then calls SDPA, which applies
its default 1/sqrt(d_k) again. Source: https://github.com/huggingface/transformers/pull/38290 ("[OPT] Fix attention
scaling. Scaling has been applied twice to OPT"; fixed by passing scale=1.0). Bug: the scores are divided by d_k
instead of sqrt(d_k)."""

import torch.nn.functional as F

SOURCE = "https://github.com/huggingface/transformers/pull/38290"
KIND = "forward"
EXPECTED = "scale-wrong"
ALSO_OK = ()
CHECK = {}
TARGET = "attention"


def attention(query, key, value, attn_mask=None, is_causal=False):
    """query `[B, h, n_q, d]`, key/value `[B, h, n_k, d]`; `attn_mask` bool, True = attend."""
    scaling = query.size(-1) ** -0.5
    query = query * scaling  # what q_proj(hidden_states) * self.scaling did
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal)
