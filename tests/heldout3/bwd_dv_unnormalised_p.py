"""A flash-style backward that recomputes P as exp(s - m) with the row max only, the form the early Triton tutorial
used because its dO had been pre-divided by l. Source: https://github.com/triton-lang/triton/issues/1934 (the
tutorial's `_bwd_preprocess` does `do = do / denom` and the kernel notes "`do` is pre-divided by `l`; no
normalization here"); rebuilt as a port that feeds the raw dO. Bug: dV = exp(s - m)^T dO is l times too large per
query row; dQ and dK use the normalised P and are right."""

import math

import numpy as np

SOURCE = "https://github.com/triton-lang/triton/issues/1934"
KIND = "backward"
EXPECTED = "grad-mismatch"
ALSO_OK = ("grad-lse",)  # more specific, added when the checker learnt it: the P of dV from a wrong lse, fitted
CHECK = {"backward": "attention_bwd"}
TARGET = "attention"


def attention(q, k, v, mask=None):
    """-> (out, lse `[..., n_q]` nats; +inf for rows with no key)."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m0 = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m0)
    den = e.sum(axis=-1, keepdims=True)
    out = np.divide(e, den, out=np.zeros_like(e), where=den > 0) @ v
    with np.errstate(divide="ignore"):
        lse = np.where(den > 0, m0 + np.log(np.where(den > 0, den, 1)), np.inf)
    return out, lse[..., 0]


def attention_bwd(q, k, v, out, lse, d_out, mask=None):
    """(dq, dk, dv)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p_unnorm = np.exp(s - np.where(np.isfinite(m), m, 0))  # "no normalization here"
    p = np.exp(s - lse[..., None])
    dv = np.swapaxes(p_unnorm, -1, -2) @ d_out  # needs dO / l
    dp = d_out @ np.swapaxes(v, -1, -2)
    delta = (d_out * out).sum(axis=-1, keepdims=True)
    ds = p * (dp - delta)
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv
