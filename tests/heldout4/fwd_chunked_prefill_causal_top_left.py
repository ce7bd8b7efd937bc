"""A prefill kernel's causal bound written for co-aligned query and key sequences, transcribed to NumPy.

Source: https://github.com/gittensor-ai-lab/sparkinfer/issues/3 ("flash_prefill causal mask misaligns query/key
positions when seqlen_q != seqlen_kv": ``kv_end = min(seqlen_kv, qpos + 1)``).
Bug: the kernel's API takes separate ``n_q`` and ``n_k`` for chunked prefill (the queries are the tail of a longer KV
sequence, causal bottom-right), but the bound caps query ``qpos`` at key ``qpos``: top-left, so every query misses the
last ``n_k - n_q`` cached keys it may see.
Shows on: causal with n_q != n_k; right when n_q == n_k or without causal.
"""

import math

import numpy as np

SOURCE = "https://github.com/gittensor-ai-lab/sparkinfer/issues/3"
KIND = "forward"
EXPECTED = "causal-alignment"
ALSO_OK = ()
CHECK = {"causal_align": "bottom_right"}
TARGET = "attention"


def attention(q, k, v, causal=False):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v]; causal: the queries are the last n_q positions."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        qpos = np.arange(n_q)[:, None]
        kv_end = np.minimum(n_k, qpos + 1)  # should be qpos + 1 + (n_k - n_q)
        s = np.where(np.arange(n_k)[None, :] < kv_end, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    z = e.sum(axis=-1, keepdims=True)
    return np.divide(e, z, out=np.zeros_like(e), where=z > 0) @ v
