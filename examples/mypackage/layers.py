"""An SDPA-style attention in NumPy, called as PyTorch's ``scaled_dot_product_attention`` is: check it with
``cd examples && attnlab check mypackage.layers:attend --signature sdpa --gqa --json``."""

import math

import numpy as np


def attend(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``query [..., h, n_q, d_k]``, ``key [..., h_kv, n_k, d_k]``, ``value [..., h_kv, n_k, d_v]``; ``attn_mask``
    boolean (True = may attend) or additive; ``is_causal`` top-left; ``enable_gqa``: query head i reads kv head
    ``i // (h / h_kv)``. A row with no key to attend to gives zeros."""
    if dropout_p:
        raise ValueError("dropout_p: this example has no dropout")
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        group = query.shape[-3] // key.shape[-3]
        key, value = np.repeat(key, group, axis=-3), np.repeat(value, group, axis=-3)
    s = query @ np.swapaxes(key, -1, -2) * (1 / math.sqrt(query.shape[-1]) if scale is None else scale)
    n_q, n_k = s.shape[-2:]
    if is_causal:
        s = np.where(np.tril(np.ones((n_q, n_k), dtype=bool)), s, -np.inf)
    if attn_mask is not None:
        s = np.where(attn_mask, s, -np.inf) if attn_mask.dtype == bool else s + attn_mask
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    d = e.sum(axis=-1, keepdims=True)
    return np.divide(e, d, out=np.zeros_like(e), where=d > 0) @ value
