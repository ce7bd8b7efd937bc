"""A backend's fallback attention with the textbook max-subtracted softmax and no guard for empty rows.

Source: https://github.com/tracel-ai/burn/issues/4694 ("attention_fallback produces NaN for fully-masked rows":
``max = -inf``, ``-inf - (-inf) = NaN``).
Bug: a query whose keys are all masked gets ``exp(-inf - -inf) = NaN`` and a NaN output row.
Shows on: a mask that blocks every key of some query; right whenever each query keeps a key.
"""

import math

import numpy as np

SOURCE = "https://github.com/tracel-ai/burn/issues/4694"
KIND = "forward"
EXPECTED = "masked-row-nan"
ALSO_OK = ()
CHECK = {"mask_convention": "allow"}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k] (True = may attend)."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True) @ v
