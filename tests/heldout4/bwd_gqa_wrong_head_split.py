"""A varlen flash-attention backward whose dK/dV reduction splits the query head index the other way round.

Source: https://github.com/XunhaoLai/native-sparse-attention-triton/issues/27 ("flash_attention_varlen backward: wrong
head-count division under gqa_interleave": ``backward_dkdv`` splits the flat query-head index with
``% NUM_SHARE_Q_HEADS`` / ``// NUM_SHARE_Q_HEADS`` while the forward and ``backward_dq`` use ``NUM_KV_HEADS``).
Bug: the forward maps query head i to K/V head ``i // group``; the backward sums dK/dV of K/V head j over the query
heads ``i % h_kv == j``.
Shows on: GQA with h_kv > 1 and a group size > 1; right with one K/V head or h_kv == h.
"""

import math

import numpy as np

SOURCE = "https://github.com/XunhaoLai/native-sparse-attention-triton/issues/27"
KIND = "backward"
EXPECTED = "grad-gqa-sum"
ALSO_OK = ()
CHECK = {"gqa": True, "mask_convention": "allow", "backward": "attention_bwd"}
TARGET = "attention"


def _probs(q, k, mask, scale):
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    z = e.sum(axis=-1, keepdims=True)
    return np.divide(e, z, out=np.zeros_like(e), where=z > 0)


def attention(q, k, v, mask=None):
    """q [..., h, n_q, d], k [..., h_kv, n_k, d], v [..., h_kv, n_k, d_v]: query head i reads K/V head i // group."""
    group = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    return _probs(q, k, mask, 1 / math.sqrt(q.shape[-1])) @ v


def attention_bwd(q, k, v, d_out, mask=None):
    """d_out [..., h, n_q, d_v] -> (dq [..., h, n_q, d], dk [..., h_kv, n_k, d], dv [..., h_kv, n_k, d_v])."""
    h, h_kv = q.shape[-3], k.shape[-3]
    group = h // h_kv
    scale = 1 / math.sqrt(q.shape[-1])
    kr, vr = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    p = _probs(q, kr, mask, scale)
    dv_h = np.swapaxes(p, -1, -2) @ d_out  # per query head
    dp = d_out @ np.swapaxes(vr, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dq = ds @ kr * scale
    dk_h = np.swapaxes(ds, -1, -2) @ q * scale
    heads = np.arange(h)
    dk = np.stack([dk_h[..., heads % h_kv == j, :, :].sum(axis=-3) for j in range(h_kv)], axis=-3)
    dv = np.stack([dv_h[..., heads % h_kv == j, :, :].sum(axis=-3) for j in range(h_kv)], axis=-3)
    return dq, dk, dv
