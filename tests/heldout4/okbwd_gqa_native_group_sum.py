"""A grouped-query attention backward that keeps K/V compact and sums each K/V head's gradient over its group.

Source: https://github.com/xlite-dev/ffpa-attn/pull/301 ("Add native GQA backward without KV-head expansion": map each
query head to its KV head directly in dQ, dK and dV and accumulate compact dK/dV across query groups).
Correct: query head i reads K/V head ``i // group``; dK/dV of K/V head j is the sum over query heads
``j * group .. (j + 1) * group - 1``.
"""

import math

import numpy as np

SOURCE = "https://github.com/xlite-dev/ffpa-attn/pull/301"
KIND = "backward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"gqa": True, "mask_convention": "allow", "backward": "attention_bwd"}
TARGET = "attention"


def _grouped(x, h_kv):
    """[..., h, n, d] -> [..., h_kv, group, n, d]."""
    return x.reshape((*x.shape[:-3], h_kv, x.shape[-3] // h_kv, *x.shape[-2:]))


def _probs(q, k, mask):
    """q [..., h_kv, g, n_q, d], k [..., h_kv, 1, n_k, d] -> P [..., h_kv, g, n_q, n_k]."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    z = e.sum(axis=-1, keepdims=True)
    return np.divide(e, z, out=np.zeros_like(e), where=z > 0)


def _mask(mask, q_shape, h_kv):
    if mask is None:
        return None
    full = np.broadcast_to(mask, np.broadcast_shapes(mask.shape, (*q_shape[:-1], mask.shape[-1])))
    return _grouped(full, h_kv)


def attention(q, k, v, mask=None):
    """q [..., h, n_q, d], k [..., h_kv, n_k, d], v [..., h_kv, n_k, d_v], mask bool [..., h, n_q, n_k]."""
    h_kv = k.shape[-3]
    p = _probs(_grouped(q, h_kv), k[..., :, None, :, :], _mask(mask, q.shape, h_kv))
    out = p @ v[..., :, None, :, :]
    return out.reshape((*out.shape[:-4], q.shape[-3], *out.shape[-2:]))


def attention_bwd(q, k, v, d_out, mask=None):
    """d_out [..., h, n_q, d_v] -> (dq [..., h, n_q, d], dk [..., h_kv, n_k, d], dv [..., h_kv, n_k, d_v])."""
    h_kv = k.shape[-3]
    scale = 1 / math.sqrt(q.shape[-1])
    qg, dog = _grouped(q, h_kv), _grouped(d_out, h_kv)
    kg, vg = k[..., :, None, :, :], v[..., :, None, :, :]
    p = _probs(qg, kg, _mask(mask, q.shape, h_kv))
    dp = dog @ np.swapaxes(vg, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dq = (ds @ kg * scale).reshape(q.shape[:-3] + q.shape[-3:])
    dk = (np.swapaxes(ds, -1, -2) @ qg * scale).sum(axis=-3)
    dv = (np.swapaxes(p, -1, -2) @ dog).sum(axis=-3)
    return dq, dk, dv
