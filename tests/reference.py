"""An independent float64 reference for tests: row by row, in plain Python loops over NumPy rows.

It shares no code with attnlab: the mask is applied by selecting the allowed keys, never by a fill value.
"""

from __future__ import annotations

import math

import numpy as np


def reference_attention(q, k, v, allowed=None, bias=None, scale=None, temperature=1.0):
    """Float64 attention ``[..., n_q, d_v]`` and weights ``[..., n_q, n_k]``; rows with no allowed key are NaN."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    n_q, d_k = q.shape[-2:]
    n_k, d_v = v.shape[-2:]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    full = (*batch, n_q, n_k)
    allowed = np.ones(full, bool) if allowed is None else np.broadcast_to(allowed, full)
    bias = np.zeros(full) if bias is None else np.broadcast_to(np.asarray(bias, dtype=np.float64), full)
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    qb, kb, vb = (np.broadcast_to(x, (*batch, *x.shape[-2:])) for x in (q, k, v))
    out = np.empty((*batch, n_q, d_v))
    weights = np.zeros(full)
    for idx in np.ndindex(*batch):
        for i in range(n_q):
            cols = np.flatnonzero(allowed[idx][i])
            if cols.size == 0:
                out[idx][i] = np.nan
                weights[idx][i] = np.nan
                continue
            s = np.array([(qb[idx][i] @ kb[idx][j]) * scale + bias[idx][i, j] for j in cols]) / temperature
            e = np.exp(s - s.max())
            w = e / e.sum()
            weights[idx][i, cols] = w
            out[idx][i] = w @ vb[idx][cols]
    return out, weights
