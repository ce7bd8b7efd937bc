"""Correct: a NumPy `flash_attn_varlen_func` over packed sequences with GQA and a bottom-right causal mask per
sequence. Source: https://github.com/Dao-AILab/flash-attention/issues/282 (the alignment asked for there, adopted in
flash-attn 2.1). Why correct: each sequence is attended on its own, query i seeing keys j <= i + L_k - L_q."""

import math

import numpy as np

SOURCE = "https://github.com/Dao-AILab/flash-attention/issues/282"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"mask_form": "varlen", "causal_align": "bottom_right", "gqa": True}
TARGET = "attention"


def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, softmax_scale=None):
    """q `[total_q, h, d]`, k/v `[total_k, h_kv, d]`, `cu_seqlens_q/k [B + 1]` -> `[total_q, h, d_v]`."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    h, h_kv = q.shape[1], k.shape[1]
    out = np.zeros((q.shape[0], h, v.shape[-1]), dtype=q.dtype)
    for b in range(len(cu_seqlens_q) - 1):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        k0, k1 = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        if q1 == q0 or k1 == k0:
            continue
        qs = np.swapaxes(q[q0:q1], 0, 1)
        ks = np.repeat(np.swapaxes(k[k0:k1], 0, 1), h // h_kv, axis=0)
        vs = np.repeat(np.swapaxes(v[k0:k1], 0, 1), h // h_kv, axis=0)
        s = qs @ np.swapaxes(ks, -1, -2) * scale
        if causal:
            keep = np.arange(k1 - k0)[None, :] <= np.arange(q1 - q0)[:, None] + ((k1 - k0) - (q1 - q0))
            s = np.where(keep, s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isfinite(m), m, 0))
        den = e.sum(axis=-1, keepdims=True)
        p = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
        out[q0:q1] = np.swapaxes(p @ vs, 0, 1)
    return out
