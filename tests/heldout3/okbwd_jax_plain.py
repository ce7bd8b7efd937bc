"""Correct: a JAX attention with a hand-written backward `bwd(q, k, v, d_out, mask=None)` (the analytic formulas in
jnp, no autodiff). Source: https://github.com/marin-community/levanter/pull/449 (levanter's JAX flash attention
writes dV = P^T dO and dK = dS^T Q by hand). Why correct: dV = P^T dO, dS = P (dP - rowsum(dP P)), dQ = dS K s,
dK = dS^T Q s, with P zero on masked keys and on rows with no key."""

import jax.numpy as jnp

SOURCE = "https://github.com/marin-community/levanter/pull/449"
KIND = "backward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"backward": "attention_bwd", "framework": "jax", "dtypes": ("float32", "float16", "bfloat16")}
TARGET = "attention"


def _probs(q, k, mask):
    s = jnp.einsum("...qd,...kd->...qk", q, k) * (q.shape[-1] ** -0.5)
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    e = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0))
    total = jnp.sum(e, axis=-1, keepdims=True)
    return jnp.where(total > 0, e / jnp.where(total > 0, total, 1), 0)


def attention(q, k, v, mask=None):
    """q `[..., n_q, d]`, k/v `[..., n_k, d]`; `mask` bool, True = attend."""
    return jnp.einsum("...qk,...kd->...qd", _probs(q, k, mask), v)


def attention_bwd(q, k, v, d_out, mask=None):
    """(dq, dk, dv)."""
    scale = q.shape[-1] ** -0.5
    p = _probs(q, k, mask)
    dv = jnp.einsum("...qk,...qd->...kd", p, d_out)
    dp = jnp.einsum("...qd,...kd->...qk", d_out, v)
    ds = p * (dp - jnp.sum(dp * p, axis=-1, keepdims=True))
    return jnp.einsum("...qk,...kd->...qd", ds, k) * scale, jnp.einsum("...qk,...qd->...kd", ds, q) * scale, dv
