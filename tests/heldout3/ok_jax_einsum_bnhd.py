"""Correct: a JAX attention in the `[B, n, h, d]` layout of `jax.nn.dot_product_attention`, with einsum, a boolean
mask, a top-left `is_causal` flag and zeros for queries with no allowed key. Source:
https://github.com/google/flax/issues/982 (attention in float16 produced NaNs from a -1e10 bias; a boolean select
with -inf and an explicit empty-row guard has no such value). Why correct: blocked logits are -inf, the row max is
guarded, and an empty row is set to 0 before the product with V."""

import jax.numpy as jnp

SOURCE = "https://github.com/google/flax/issues/982"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"framework": "jax", "layout": "bnhd", "dtypes": ("float32", "float16", "bfloat16"), "ranks": (4,)}
TARGET = "attention"


def attention(query, key, value, mask=None, is_causal=False, scale=None):
    """query `[B, n_q, h, d]`, key/value `[B, n_k, h, d]`; `mask [B, h, n_q, n_k]` bool, True = attend."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    logits = jnp.einsum("bqhd,bkhd->bhqk", query, key) * scale
    n_q, n_k = logits.shape[-2:]
    allowed = jnp.ones((n_q, n_k), dtype=bool)
    if is_causal:
        allowed = jnp.tril(allowed)
    if mask is not None:
        allowed = allowed & mask
    logits = jnp.where(allowed, logits, -jnp.inf)
    m = jnp.max(logits, axis=-1, keepdims=True)
    e = jnp.exp(logits - jnp.where(jnp.isfinite(m), m, 0))
    total = jnp.sum(e, axis=-1, keepdims=True)
    probs = jnp.where(total > 0, e / jnp.where(total > 0, total, 1), 0)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, value)
