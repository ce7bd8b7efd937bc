"""A from-scratch ViT notebook's attention, with the softmax taken along the query axis.

Source: https://github.com/nerminnuraydogan/vision-transformer/issues/1 ("softmax along wrong dimension in the jupyter
notebook": it should be ``dim=-1``).
Bug: ``softmax(scores, axis=-2)`` normalises each key's column over the queries instead of each query's row over the
keys.
Shows on: every input with n_k > 1 (even a single query: each column then has one entry and every weight is 1);
right only for one query and one key (n_q == n_k == 1), where both axes give the weight 1.
"""

import math

import numpy as np

SOURCE = "https://github.com/nerminnuraydogan/vision-transformer/issues/1"
KIND = "forward"
EXPECTED = "softmax-axis"
ALSO_OK = ("not-normalized",)
CHECK = {"mask_convention": "allow"}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k] (True = may attend)."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-2, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    z = e.sum(axis=-2, keepdims=True)  # over the queries: should be axis=-1
    return np.divide(e, z, out=np.zeros_like(e), where=z > 0) @ v
