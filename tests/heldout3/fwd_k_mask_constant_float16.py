"""A JAX attention that fills blocked logits with the constant K_MASK = -2.3819763e38 (Gemma / Pi0 code). Source:
https://github.com/huggingface/lerobot/pull/710 (the Pi0 eager attention's `big_neg = -2.3819763e38` overflows in
half precision). Bug: in float16 the constant is -inf, so a query with no allowed key is exp(-inf - -inf) = NaN;
in float32 and bfloat16 the constant is finite and such a row is a uniform average (a documented behaviour)."""

import jax
import jax.numpy as jnp

SOURCE = "https://github.com/huggingface/lerobot/pull/710"
KIND = "forward"
EXPECTED = "masked-row-nan"
ALSO_OK = ()
CHECK = {"framework": "jax", "dtypes": ("float32", "float16", "bfloat16")}
TARGET = "attention"

K_MASK = -2.3819763e38


def attention(q, k, v, mask=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `mask` bool `[..., n_q, n_k]`, True = attend."""
    logits = jnp.einsum("...qd,...kd->...qk", q, k) * (q.shape[-1] ** -0.5)
    if mask is not None:
        logits = jnp.where(mask, logits, K_MASK)
    probs = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("...qk,...kd->...qd", probs, v)
