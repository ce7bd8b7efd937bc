"""A JAX attention forward and hand-written backward that zero the rows whose bias is -inf everywhere.

Source: https://github.com/ROCm/TransformerEngine/pull/556 ("add the bias all row -inf support for jax unfused-attn":
detect query rows where all values are -inf and zero their logits, as the softmax output of those rows is zeroed).
Correct: masked scores at -inf, ``P`` zero on rows with no allowed key (forward and backward), the standard
``dS = P (dP - rowsum(dP P))``.
"""

import math

import jax.numpy as jnp

SOURCE = "https://github.com/ROCm/TransformerEngine/pull/556"
KIND = "backward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"framework": "jax", "mask_convention": "allow", "dtypes": ("float32",), "backward": "attention_bwd"}
TARGET = "attention"


def _probs(q, k, mask, scale):
    s = q @ jnp.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)
    empty = jnp.all(s == -jnp.inf, axis=-1, keepdims=True)
    s = jnp.where(empty, 0.0, s)
    e = jnp.exp(s - s.max(axis=-1, keepdims=True))
    return jnp.where(empty, 0.0, e / e.sum(axis=-1, keepdims=True))


def attention(q, k, v, mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k] (True = may attend)."""
    return (_probs(q, k, mask, 1 / math.sqrt(q.shape[-1])) @ v).astype(q.dtype)


def attention_bwd(q, k, v, d_out, mask=None):
    """d_out [..., n_q, d_v] -> (dq, dk, dv)."""
    scale = 1 / math.sqrt(q.shape[-1])
    p = _probs(q, k, mask, scale)
    dv = jnp.swapaxes(p, -1, -2) @ d_out
    dp = d_out @ jnp.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return ds @ k * scale, jnp.swapaxes(ds, -1, -2) @ q * scale, dv
