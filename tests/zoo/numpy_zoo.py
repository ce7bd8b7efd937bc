"""NumPy attention implementations: correct ones, and one per bug class (several subtle)."""

from __future__ import annotations

import math
import threading

import numpy as np

from . import Entry

# ---------------------------------------------------------------------------------------------------------------
# building blocks of a correct implementation (q [..., n_q, d_k], k [..., n_k, d_k], v [..., n_k, d_v])


def _scores(q, k, scale=None):
    s = math.sqrt(q.shape[-1]) if scale is None else 1 / scale
    return (q @ np.swapaxes(k, -1, -2)) / q.dtype.type(s)  # [..., n_q, n_k]


def _softmax(x, allowed=None):
    if allowed is not None:
        x = np.where(allowed, x, -np.inf)
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(x - m)
    d = np.sum(e, axis=-1, keepdims=True)
    return np.divide(e, d, out=np.zeros_like(e), where=d > 0)


def correct(q, k, v, mask=None):
    """Correct: stable softmax, mask before softmax, fully masked rows give 0."""
    return _softmax(_scores(q, k), mask) @ v


def correct_blocked(q, k, v, mask=None):
    """Correct, with masks in the True = blocked convention (as nn.MultiheadAttention)."""
    return _softmax(_scores(q, k), None if mask is None else ~mask) @ v


def correct_additive(q, k, v, mask=None):
    """Correct, additive mask (0 / finfo.min), returns (out, weights)."""
    s = _scores(q, k)
    if mask is not None:
        s = s + mask
    w = _softmax(s)
    return w @ v, w


def correct_bnhd(q, k, v, mask=None, is_causal=False, scale=None):
    """Correct, layout [B, n, h, d], SDPA-like flags (top-left causal)."""
    q, k, v = (np.swapaxes(x, 1, 2) for x in (q, k, v))
    s = _scores(q, k, scale)
    allowed = np.ones(s.shape, bool) if mask is None else mask
    if is_causal:
        allowed = allowed & np.tril(np.ones(s.shape[-2:], bool))
    return np.swapaxes(_softmax(s, allowed) @ v, 1, 2)


def refuses_half(q, k, v, mask=None):
    """Correct, but refuses float16 cleanly: unsupported, not a bug."""
    if q.dtype == np.float16:
        raise NotImplementedError("float16 is not supported")
    return correct(q, k, v, mask)


def scale_missing(q, k, v, mask=None):
    """Forgets 1/sqrt(d_k)."""
    return _softmax(q @ np.swapaxes(k, -1, -2), mask) @ v


def scale_d_model(q, k, v, mask=None):
    """Subtle: scales by 1/sqrt(d_model) = 1/sqrt(h·d_head); right whenever there is one head."""
    h = q.shape[-3] if q.ndim >= 3 else 1
    s = (q @ np.swapaxes(k, -1, -2)) / q.dtype.type(math.sqrt(h * q.shape[-1]))
    return _softmax(s, mask) @ v


def scale_ignored(q, k, v, mask=None, scale=None):
    """Subtle: accepts scale= but always uses 1/sqrt(d_k)."""
    return _softmax(_scores(q, k), mask) @ v


def softmax_axis(q, k, v, mask=None):
    """Softmax over the queries (axis -2); right only when n_q == 1."""
    s = _scores(q, k)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = np.max(s, axis=-2, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    d = e.sum(axis=-2, keepdims=True)
    return np.divide(e, d, out=np.zeros_like(e), where=d > 0) @ v


def mask_inverted(q, k, v, mask=None):
    """masked_fill(mask, -inf) with a True = may attend mask: treats True as blocked."""
    return _softmax(_scores(q, k), None if mask is None else ~mask) @ v


def mask_after_softmax(q, k, v, mask=None):
    """Subtle: multiplies the weights by the mask after the softmax; right without a mask."""
    w = _softmax(_scores(q, k))
    if mask is not None:
        w = w * mask
    return w @ v


def causal_off_by_one(q, k, v, mask=None, is_causal=False):
    """Subtle: the causal mask lets each query see one future token (tril(k=1))."""
    s = _scores(q, k)
    allowed = np.ones(s.shape, bool) if mask is None else mask
    if is_causal:
        allowed = allowed & np.tril(np.ones(s.shape[-2:], bool), k=1)
    return _softmax(s, allowed) @ v


def weak_fill(q, k, v, mask=None):
    """Subtle: masks with an additive -10 instead of -inf; padded keys with large values take over."""
    s = _scores(q, k)
    if mask is not None:
        s = np.where(mask, s, s - 10)
    return _softmax(s) @ v


def mask_row0(q, k, v, mask=None):
    """Subtle: uses only the first query's mask row for every query (assumes key padding); right for padding."""
    allowed = None if mask is None else np.broadcast_to(mask[..., :1, :], mask.shape)
    return _softmax(_scores(q, k), allowed) @ v


def masked_row_nan(q, k, v, mask=None):
    """Fill -inf, then a plain softmax: a fully masked row is 0/0 = NaN."""
    s = _scores(q, k)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def unstable(q, k, v, mask=None):
    """Subtle: exp without subtracting the row max (fine for small logits); masks with 0 weights."""
    e = np.exp(_scores(q, k))
    if mask is not None:
        e = np.where(mask, e, 0)
    d = e.sum(axis=-1, keepdims=True)
    return np.divide(e, d, out=np.zeros_like(e), where=d > 0) @ v


def finfo_min_fill(q, k, v, mask=None):
    """Right, except for its fully masked rows: finfo.min fill gives them the uniform average of V, not zeros."""
    s = _scores(q, k)
    if mask is not None:
        s = np.where(mask, s, np.finfo(s.dtype).min)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def gqa_tile_declared(q, k, v, mask=None):
    """Correct for the 'tile' head mapping (query head i uses K/V head i % h_kv), declared gqa='tile'."""
    g = q.shape[-3] // k.shape[-3]
    k, v = (np.tile(x, (1,) * (x.ndim - 3) + (g, 1, 1)) for x in (k, v))
    return _softmax(_scores(q, k), mask) @ v


def global_normalizer(q, k, v, mask=None):
    """Divides by the largest row sum of the whole tensor instead of each row's own sum."""
    s = _scores(q, k)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    e = np.exp(s - np.max(s))
    return (e / e.sum(axis=-1, keepdims=True).max()) @ v


def batch_reshape(q, k, v, mask=None):
    """Subtle: flattens K and V to [h·B, n, d] in the wrong order; right when B == 1 or h == 1."""
    if q.ndim != 4:
        return correct(q, k, v, mask)
    kk = np.swapaxes(k, 0, 1).reshape(k.shape)  # [h, B, ...] read back as [B, h, ...]
    vv = np.swapaxes(v, 0, 1).reshape(v.shape)
    return _softmax(_scores(q, kk), mask) @ vv


def shuffled_keys(q, k, v, mask=None):
    """Subtle: visits the keys in a random order (mathematically equal, not bitwise reproducible)."""
    perm = np.random.default_rng().permutation(k.shape[-2])
    allowed = None if mask is None else np.broadcast_to(mask, (*q.shape[:-1], k.shape[-2]))[..., perm]
    return _softmax(_scores(q, k[..., perm, :]), allowed) @ v[..., perm, :]


def crash_odd(q, k, v, mask=None):
    """Crashes on an odd number of keys (it processes keys in pairs)."""
    n = k.shape[-2]
    if n % 2:
        raise IndexError(f"index {n} is out of bounds for axis 0 with size {n}")
    return correct(q, k, v, mask)


def returns_none(q, k, v, mask=None):
    """Garbage: forgets to return."""
    correct(q, k, v, mask)


def upcasts(q, k, v, mask=None):
    """Subtle: the values are right but it returns float64 whatever the input dtype."""
    return correct(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), mask)


def scales_in_place(q, k, v, mask=None):
    """Subtle: right output, but scales the caller's q in place."""
    q *= q.dtype.type(1 / math.sqrt(q.shape[-1]))
    return _softmax(q @ np.swapaxes(k, -1, -2), mask) @ v


_stop = threading.Event()


def hangs_on_cross(q, k, v, mask=None):
    """Hangs (for 5 s) when n_q != n_k."""
    if q.shape[-2] != k.shape[-2]:
        _stop.wait(5.0)
    return correct(q, k, v, mask)


def gqa_tile(q, k, v, mask=None):
    """Subtle GQA bug: query head i uses K/V head i mod h_kv (tile) instead of i // group (repeat_interleave)."""
    if q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        reps = q.shape[-3] // k.shape[-3]
        tile = (1,) * (k.ndim - 3) + (reps, 1, 1)
        k, v = np.tile(k, tile), np.tile(v, tile)
    return correct(q, k, v, mask)


def gqa_correct(q, k, v, mask=None):
    """Correct GQA (repeat_interleave along the head axis)."""
    if q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        reps = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, reps, axis=-3), np.repeat(v, reps, axis=-3)
    return correct(q, k, v, mask)


def causal_only(q, k, v):
    """Correct causal-only implementation (decoder self-attention, bottom-right when n_q != n_k)."""
    s = _scores(q, k)
    n_q, n_k = s.shape[-2:]
    allowed = np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + (n_k - n_q)
    return _softmax(s, allowed) @ v


# ---------------------------------------------------------------------------------------------- mask interfaces
def key_padding_attention(q, k, v, key_padding_mask=None, is_causal=False):
    """Correct, with a key-padding mask ``[B, n_k]`` (True = a real key) and a top-left causal flag."""
    allowed = None
    if key_padding_mask is not None:
        allowed = key_padding_mask[:, None, None, :]
    if is_causal:
        c = np.tril(np.ones((q.shape[-2], k.shape[-2]), bool))
        allowed = c if allowed is None else allowed & c
    return _softmax(_scores(q, k), allowed) @ v


def key_padding_on_queries(q, k, v, key_padding_mask=None):
    """A key-padding mask ``[B, n_k]`` applied to the queries' axis (square inputs only): padding leaks."""
    allowed = None if key_padding_mask is None else key_padding_mask[:, None, :, None] | np.zeros(1, bool)
    if allowed is not None and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"n_q must equal n_k, got {q.shape[-2]} and {k.shape[-2]}")
    return (
        _softmax(_scores(q, k), None if allowed is None else np.broadcast_to(allowed, (*q.shape[:-1], k.shape[-2]))) @ v
    )


def masked_softmax_valid_lens(q, k, v, valid_lens=None):
    """d2l's ``masked_softmax`` (d2l.ai, "Attention Scoring Functions"): scores past each sequence's valid length
    replaced by -1e6 before the softmax; ``valid_lens [B]``."""
    s = _scores(q, k)
    if valid_lens is not None:
        keep = np.arange(k.shape[-2])[None, :] < np.asarray(valid_lens)[:, None]  # [B, n_k]
        s = np.where(keep[:, None, None, :], s, s.dtype.type(-1e6))
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


ENTRIES = [
    Entry("np-correct", correct),
    Entry("np-correct-blocked", correct_blocked, options={"mask_convention": "block"}),
    Entry("np-correct-additive-weights", correct_additive, options={"mask_convention": "additive"}),
    Entry("np-correct-bnhd", correct_bnhd, options={"layout": "bnhd", "causal_align": "top_left"}),
    Entry("np-refuses-float16", refuses_half),
    Entry("np-correct-gqa", gqa_correct, options={"gqa": True}),
    Entry("np-correct-gqa-tile", gqa_tile_declared, options={"gqa": "tile"}),
    Entry("np-finfo-min-uniform-rows", finfo_min_fill),
    Entry("np-key-padding", key_padding_attention),
    Entry(
        "np-key-padding-blocked",
        lambda q, k, v, key_padding_mask=None, is_causal=False: key_padding_attention(
            q, k, v, None if key_padding_mask is None else ~key_padding_mask, is_causal
        ),
        options={"mask_convention": "block"},
    ),
    Entry("np-valid-lens", masked_softmax_valid_lens),
    Entry("np-causal-only", causal_only, options={"causal_only": True, "causal_align": "bottom_right"}),
    Entry("np-scale-missing", scale_missing, ("scale-missing",)),
    Entry("np-scale-d-model", scale_d_model, ("scale-wrong",), subtle=True),
    Entry("np-scale-ignored", scale_ignored, ("scale-wrong",), subtle=True),
    Entry("np-softmax-axis", softmax_axis, ("softmax-axis",)),
    Entry("np-mask-inverted", mask_inverted, ("mask-inverted",)),
    Entry("np-mask-after-softmax", mask_after_softmax, ("mask-after-softmax",), subtle=True),
    # also reference-mismatch: on the rectangular causal case (n_q=4, n_k=9) tril(k=1) matches neither alignment
    Entry("np-causal-off-by-one", causal_off_by_one, ("causal-leak",), also=("reference-mismatch",), subtle=True),
    Entry("np-weak-fill", weak_fill, ("padding-leak",), also=("causal-leak",), subtle=True),
    Entry("np-mask-row0", mask_row0, ("reference-mismatch",), subtle=True),
    Entry("np-masked-row-nan", masked_row_nan, ("masked-row-nan",)),
    Entry("np-unstable", unstable, ("unstable-softmax",), subtle=True),
    Entry("np-global-normalizer", global_normalizer, ("not-normalized",), also=("causal-leak", "batch-leak")),
    Entry("np-batch-reshape", batch_reshape, ("batch-leak",), subtle=True),
    Entry("np-shuffled-keys", shuffled_keys, ("nondeterministic",), subtle=True),
    Entry("np-crash-odd", crash_odd, ("crash",)),
    Entry("np-returns-none", returns_none, ("crash",)),
    Entry("np-upcasts", upcasts, ("dtype",), subtle=True),
    Entry("np-scales-in-place", scales_in_place, ("mutates-input",), subtle=True),
    Entry("np-hangs", hangs_on_cross, ("timeout",), options={"timeout": 0.5}),
    Entry("np-gqa-tile", gqa_tile, ("reference-mismatch",), options={"gqa": True}, subtle=True),
    Entry("np-gqa-interleave-declared-tile", gqa_correct, ("reference-mismatch",), options={"gqa": "tile"}),
    Entry(
        "np-key-padding-on-queries",
        key_padding_on_queries,
        ("padding-leak",),
        also=("reference-mismatch", "not-normalized", "crash"),
    ),
    Entry("np-masked-rows-not-zeros", finfo_min_fill, ("masked-row-policy",), options={"masked_rows": "zeros"}),
]
