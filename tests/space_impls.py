"""Hand-written NumPy attention functions with bugs only the case-space probes see (mask-space, decode,
call-order); today's grid of full-size masks and fresh single calls reports each one clean."""

from __future__ import annotations

import math

import numpy as np

from attnlab.checker.cases import softmax


def _softmax(x, allowed=None):
    """softmax over the keys, blocked scores -inf, fully masked rows 0 (the checker's own helper)."""
    return softmax(x if allowed is None else np.where(allowed, x, -np.inf)).astype(x.dtype)


def _scores(q, k):
    return (q @ np.swapaxes(k, -1, -2)) / q.dtype.type(math.sqrt(q.shape[-1]))


def sink_key0(q, k, v, mask=None):
    """An "attention sink": key 0 is visible to every query that sees any key, whatever the mask says about key 0
    (StreamingLLM-style BOS token); a fully masked row stays fully masked (zeros)."""
    if mask is not None:
        mask = np.array(np.broadcast_to(mask, (*q.shape[:-1], k.shape[-2])))
        mask[..., 0] |= mask.any(axis=-1)
    return _softmax(_scores(q, k), mask) @ v


def decode_fast_path(q, k, v, mask=None, is_causal=False):
    """A decode fast path for one query that forgets the mask (causal is bottom-right, so one query sees all)."""
    s = _scores(q, k)
    if q.shape[-2] == 1:
        return _softmax(s) @ v
    n_q, n_k = s.shape[-2:]
    allowed = np.ones(s.shape, bool) if mask is None else np.broadcast_to(mask, s.shape)
    if is_causal:
        allowed = allowed & (np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + n_k - n_q)
    return _softmax(s, allowed) @ v


def tail_tile_unmasked(q, k, v, mask=None, is_causal=False):
    """Tiled over keys in blocks of 16 (online softmax, causal bottom-right from its own index test); the ragged
    last tile of a multi-tile row forgets the user's mask (with one tile the whole row is masked correctly)."""
    bk = 16
    s = _scores(q, k)
    n_q, n_k = s.shape[-2:]
    causal = np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + n_k - n_q
    if is_causal:
        s = np.where(causal, s, -np.inf)
    allowed = np.ones(s.shape, bool) if mask is None else np.broadcast_to(mask, s.shape)
    if n_k <= bk:
        return _softmax(s, allowed) @ v
    m = np.full((*s.shape[:-1], 1), -np.inf)
    den = np.zeros_like(m)
    acc = np.zeros((*s.shape[:-1], v.shape[-1]))
    for j0 in range(0, n_k, bk):
        j1 = min(j0 + bk, n_k)
        t = s[..., j0:j1]
        if j1 - j0 == bk:
            t = np.where(allowed[..., j0:j1], t, -np.inf)
        m_new = np.maximum(m, t.max(axis=-1, keepdims=True))
        safe = np.where(np.isfinite(m_new), m_new, 0)
        p = np.exp(t - safe)
        c = np.exp(np.where(np.isfinite(m), m - safe, -np.inf))
        den = den * c + p.sum(axis=-1, keepdims=True)
        acc = acc * c + p @ v[..., j0:j1, :]
        m = m_new
    return (np.divide(acc, den, out=np.zeros_like(acc), where=den > 0)).astype(q.dtype)


def mask_tile_not_interleave(q, k, v, mask=None):
    """Flattens batch and heads for a 3-D kernel; a mask without a head axis is tiled over heads (torch's
    mask.repeat(h, 1, 1)) where it should be repeated per batch element (repeat_interleave)."""
    if q.ndim != 4:
        return _softmax(_scores(q, k), mask) @ v
    b, h, n_q, _ = q.shape
    n_k = k.shape[-2]
    s = _scores(q, k).reshape(b * h, n_q, n_k)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.ndim == 4 and mask.shape[1] == 1 and h > 1:
            mask = np.tile(mask.reshape(b, mask.shape[2], n_k), (h, 1, 1))
        mask = np.broadcast_to(mask, (b, h, n_q, n_k) if mask.ndim != 3 else (b * h, n_q, n_k))
        mask = mask.reshape(b * h, n_q, n_k)
    w = _softmax(s, mask)
    return (w @ v.reshape(b * h, n_k, -1)).reshape(b, h, n_q, -1)


_MEMO: dict = {}


def memo_by_shape(q, k, v, mask=None):
    """Memoises the projected keys of a decode step by shape (a cache keyed by shape, not by the values)."""
    if q.shape[-2] == 1:
        key = (k.shape, k.dtype.str, None if mask is None else np.shape(mask))
        k, v = _MEMO.setdefault(key, (k, v))
    return _softmax(_scores(q, k), mask) @ v


_CACHE: dict = {}


def reset() -> None:
    """Empty the memo and the cache (a check in this process starts from a fresh module, as a worker would)."""
    _MEMO.clear()
    _CACHE.clear()


def kv_cache_never_reset(q, k, v, mask=None):
    """A decode step (one query) appends its K/V to a cache kept per shape and attends over the whole cache; the
    cache is never reset between sequences."""
    if q.shape[-2] != 1:
        return _softmax(_scores(q, k), mask) @ v
    lead = (q.shape, k.shape, v.shape)
    pk, pv = _CACHE.get(lead, (k[..., :0, :], v[..., :0, :]))
    k, v = np.concatenate([pk, k], axis=-2), np.concatenate([pv, v], axis=-2)
    _CACHE[lead] = (k, v)
    if mask is not None:
        mask = np.broadcast_to(mask, (*q.shape[:-1], mask.shape[-1]))
        mask = np.concatenate([np.ones((*q.shape[:-1], k.shape[-2] - mask.shape[-1]), bool), mask], axis=-1)
    return _softmax(_scores(q, k), mask) @ v


def correct(q, k, v, mask=None, is_causal=False):
    """Correct (bottom-right causal), for comparison."""
    s = _scores(q, k)
    n_q, n_k = s.shape[-2:]
    allowed = np.ones(s.shape, bool) if mask is None else np.broadcast_to(mask, s.shape)
    if is_causal:
        allowed = allowed & (np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + n_k - n_q)
    return _softmax(s, allowed) @ v
