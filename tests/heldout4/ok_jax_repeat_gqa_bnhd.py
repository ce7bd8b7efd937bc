"""A JAX grouped-query attention in ``[B, n, h, d]`` layout that repeats each K/V head for its group.

Source: https://github.com/apple/axlearn/pull/842 ("Fix the changed GQA behavior": ``jnp.repeat(key, 2,
axis=head_axis)`` gives heads ``0 0 1 1``, the mapping the original implementation kept).
Correct: ``jnp.repeat`` along the head axis (query head i reads K/V head ``i // group``), masked scores at -inf and
zeros for a query with no allowed key.
"""

import math

import jax.numpy as jnp

SOURCE = "https://github.com/apple/axlearn/pull/842"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"framework": "jax", "layout": "bnhd", "gqa": True, "mask_convention": "allow", "ranks": (4,),
         "dtypes": ("float32", "bfloat16")}  # fmt: skip
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q [B, n_q, h, d], k [B, n_k, h_kv, d], v [B, n_k, h_kv, d_v], mask bool [B, h, n_q, n_k] -> [B, n_q, h, d_v]."""
    group = q.shape[2] // k.shape[2]
    k = jnp.repeat(k, group, axis=2)
    v = jnp.repeat(v, group, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)
    m = s.max(axis=-1, keepdims=True)
    e = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0))
    z = e.sum(axis=-1, keepdims=True)
    w = jnp.where(z > 0, e / jnp.where(z > 0, z, 1), 0)
    return jnp.einsum("bhqk,bkhd->bqhd", w, v).astype(q.dtype)
