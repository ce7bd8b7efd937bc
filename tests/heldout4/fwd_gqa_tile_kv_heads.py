"""The ONNX Attention function body's grouped-query expansion, transcribed to NumPy.

Source: https://github.com/onnx/onnx/pull/7274 ("Update attention gqa to use repeat interleave within repeat kv").
Bug: K and V heads are expanded with ``Tile`` (``np.tile``: heads ``[0, 1, 0, 1]``) where PyTorch's and Hugging Face's
GQA repeat each K/V head for its group (``[0, 0, 1, 1]``), so query head i reads K/V head ``i % h_kv``.
Shows on: GQA with h_kv > 1 and a group size > 1; right with one K/V head (multi-query) or h_kv == h.
"""

import math

import numpy as np

SOURCE = "https://github.com/onnx/onnx/pull/7274"
KIND = "forward"
EXPECTED = "gqa-mapping"
ALSO_OK = ()
CHECK = {"gqa": True, "mask_convention": "allow"}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q [..., h, n_q, d], k [..., h_kv, n_k, d], v [..., h_kv, n_k, d_v], mask bool [..., h, n_q, n_k]."""
    group = q.shape[-3] // k.shape[-3]
    reps = [1] * k.ndim
    reps[-3] = group
    k = np.tile(k, reps)  # [..., h, n_k, d]: heads 0, 1, ..., 0, 1, ...
    v = np.tile(v, reps)
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    z = e.sum(axis=-1, keepdims=True)
    return np.divide(e, z, out=np.zeros_like(e), where=z > 0) @ v
