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


# ------------------------------------------------------------------------------------ issue 13 §5: sharper names
def weights_float16(q, k, v, mask=None):
    """Subtle ``precision``: the weights are cast to float16 before ``@ V`` (to save memory)."""
    w = _softmax(_scores(q, k), mask).astype(np.float16)
    return (w @ v).astype(q.dtype)


def computes_in_float32(q, k, v, mask=None):
    """Correct under ``compute_dtype="auto"`` (a ``lower-precision`` note): every dtype computed in float32."""
    return correct(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), mask).astype(q.dtype)


def scores_float16(q, k, v, mask=None):
    """``precision``: Q and K are cast to float16 for the scores (a 'mixed precision' shortcut)."""
    s = (q.astype(np.float16) @ np.swapaxes(k.astype(np.float16), -1, -2)).astype(q.dtype)
    return _softmax(s / q.dtype.type(math.sqrt(q.shape[-1])), mask) @ v


def scale_after_softmax(q, k, v, mask=None):
    """``scale-after-softmax``: softmax of the raw scores, then the output divided by sqrt(d_k)."""
    w = _softmax(q @ np.swapaxes(k, -1, -2), mask)
    return (w @ v) / q.dtype.type(math.sqrt(q.shape[-1]))


def softmax_flattened(q, k, v, mask=None):
    """``softmax-axis``: the scores are flattened to [..., n_q·n_k] and softmaxed over all of them."""
    s = _scores(q, k)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    flat = s.reshape(*s.shape[:-2], -1)
    e = np.exp(flat - flat.max(axis=-1, keepdims=True))
    w = (e / e.sum(axis=-1, keepdims=True)).reshape(s.shape)
    return w @ v


def fill_after_softmax(q, k, v, mask=None):
    """``fill-after-softmax``: np.where(mask, weights, -1e9) on the weights, after the softmax."""
    w = _softmax(_scores(q, k))
    if mask is not None:
        w = np.where(mask, w, w.dtype.type(-1e9))  # -inf in float16
    return w @ v


def fill_1e4(q, k, v, mask=None):
    """Subtle ``finite-fill``: masked scores replaced by -1e4 (right unless the scores are large)."""
    s = _scores(q, k)
    if mask is not None:
        s = np.where(mask, s, s.dtype.type(-1e4))
    return _softmax(s) @ v


def fill_finfo_min(q, k, v, mask=None):
    """Correct: masked scores replaced by np.finfo(dtype).min (-65504 in float16); fully masked rows uniform."""
    s = _scores(q, k)
    if mask is not None:
        s = np.where(mask, s, np.finfo(s.dtype).min)
    return _softmax(s) @ v


def additive_finfo_min(q, k, v, mask=None):
    """Correct: an additive mask (1 - mask) * finfo(dtype).min added to the scores, as Hugging Face builds it."""
    s = _scores(q, k)
    if mask is not None:
        s = s + (1 - mask.astype(s.dtype)) * np.finfo(s.dtype).min
    return _softmax(s) @ v


def key_padding_tiled(q, k, v, key_padding_mask=None):
    """``mask-wrong-heads``: inputs flattened to [B·h, n, d] batch-major, the key padding [B, n_k] expanded with
    np.tile (b·h + head gets row (b·h + head) % B) instead of np.repeat."""
    b, h, n_q, _ = q.shape
    qf, kf, vf = (x.reshape(b * h, x.shape[-2], x.shape[-1]) for x in (q, k, v))
    allowed = None
    if key_padding_mask is not None:
        allowed = np.tile(key_padding_mask, (h, 1))[:, None, :]  # [B·h, 1, n_k]
    return (_softmax(_scores(qf, kf), allowed) @ vf).reshape(b, h, n_q, v.shape[-1])


def key_padding_repeated(q, k, v, key_padding_mask=None):
    """Correct: the same flattening with np.repeat (repeat_interleave) of the key padding."""
    b, h, n_q, _ = q.shape
    qf, kf, vf = (x.reshape(b * h, x.shape[-2], x.shape[-1]) for x in (q, k, v))
    allowed = None
    if key_padding_mask is not None:
        allowed = np.repeat(key_padding_mask, h, axis=0)[:, None, :]
    return (_softmax(_scores(qf, kf), allowed) @ vf).reshape(b, h, n_q, v.shape[-1])


def full_mask_head_major(q, k, v, mask=None):
    """``mask-wrong-heads``: a [B, h, n_q, n_k] mask flattened head-major (swapaxes, then reshape) while q, k, v
    are flattened batch-major."""
    if mask is None or q.ndim != 4:
        return correct(q, k, v, mask)
    b, h = q.shape[:2]
    m = np.swapaxes(np.broadcast_to(mask, (*q.shape[:-1], k.shape[-2])), 0, 1).reshape(b * h, *mask.shape[-2:])
    qf, kf, vf = (x.reshape(b * h, x.shape[-2], x.shape[-1]) for x in (q, k, v))
    return (_softmax(_scores(qf, kf), m) @ vf).reshape(*q.shape[:-1], v.shape[-1])


def causal_rebuilt_bottom_right(q, k, v, mask=None):
    """``causal-alignment``: a lower-triangular mask is recognised as 'causal' and rebuilt with the KV-cache
    (bottom-right) convention, so a given top-left mask with n_k > n_q lets queries see their future."""
    if mask is not None:
        n_q, n_k = mask.shape[-2:]
        if np.array_equal(mask, np.tril(mask)) and n_q != n_k:  # no key after the query: 'it is causal'
            mask = np.tril(np.ones((n_q, n_k), bool), k=n_k - n_q)
    return correct(q, k, v, mask)


def causal_align_ignored(q, k, v, mask=None, causal=None):
    """``causal-alignment``: takes the alignment string (causal='top_left' / 'bottom_right') and always builds
    the mask bottom-right."""
    allowed = mask
    if causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        c = np.tril(np.ones((n_q, n_k), bool), k=n_k - n_q)
        allowed = c if allowed is None else allowed & c
    return correct(q, k, v, allowed)


def causal_align_followed(q, k, v, mask=None, causal=None):
    """Correct: builds the causal mask with the alignment it is given."""
    allowed = mask
    if causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        c = np.tril(np.ones((n_q, n_k), bool), k=n_k - n_q if causal == "bottom_right" else 0)
        allowed = c if allowed is None else allowed & c
    return correct(q, k, v, allowed)


def flag_bottom_right(q, k, v, mask=None, is_causal=False):
    """``causal-alignment``: declared top-left (as PyTorch's is_causal), its causal flag builds the KV-cache
    (bottom-right) mask: with n_k > n_q queries see keys after the declared diagonal."""
    allowed = mask
    if is_causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        c = ~np.triu(np.ones((n_q, n_k), bool), k=n_k - n_q + 1)  # j <= i + n_k - n_q
        allowed = c if allowed is None else allowed & c
    return correct(q, k, v, allowed)


def loop_reuses_first_kv(q, k, v, mask=None):
    """``batch-leak``: a per-sequence loop that reads k[0] and v[0] for every batch element."""
    if q.ndim != 4:
        return correct(q, k, v, mask)
    out = np.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    for b in range(q.shape[0]):
        m = None if mask is None else np.broadcast_to(mask, (*q.shape[:-1], k.shape[-2]))[b]
        out[b] = correct(q[b], k[0], v[0], m)
    return out


def loop_per_sequence(q, k, v, mask=None):
    """Correct: the same loop with k[b], v[b]."""
    if q.ndim != 4:
        return correct(q, k, v, mask)
    out = np.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    for b in range(q.shape[0]):
        m = None if mask is None else np.broadcast_to(mask, (*q.shape[:-1], k.shape[-2]))[b]
        out[b] = correct(q[b], k[b], v[b], m)
    return out


def gqa_first_head(q, k, v, mask=None):
    """``gqa-mapping``: multi-query shortcut, every query head reads K/V head 0."""
    if q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        k, v = k[..., :1, :, :], v[..., :1, :, :]
    return correct(q, k, v, mask)


def two_bugs(q, k, v, mask=None):
    """Two bugs: no 1/sqrt(d_k), and the mask read inverted; both are named."""
    return scale_missing(q, k, v, None if mask is None else ~mask)


def default_mask_square(q, k, v, mask=None):
    """``crash``: without a mask it builds a default mask (n_q, n_q), which breaks when n_q != n_k."""
    if mask is None:
        mask = np.ones((q.shape[-2], q.shape[-2]), bool)
    return correct(q, k, v, mask)


def output_like_q(q, k, v, mask=None):
    """``crash``: allocates the output like q, so it breaks when d_v != d_k."""
    out = np.empty_like(q)
    out[...] = correct(q, k, v, mask)
    return out


def zeroed_padding_keys(q, k, v, key_padding_mask=None, is_causal=False):
    """``padding-leak``: zeroes the padded keys and values (``k * mask``) instead of masking their scores; each
    padded key keeps the weight of a score 0."""
    if key_padding_mask is not None:
        keep = key_padding_mask[:, None, :, None].astype(q.dtype)
        k, v = k * keep, v * keep
    c = np.tril(np.ones((q.shape[-2], k.shape[-2]), bool)) if is_causal else None
    return _softmax(_scores(q, k), c) @ v


def varlen_padded_to_longest(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, softmax_scale=None
):
    """``padding-leak``: a varlen function that pads each packed sequence's K and V with zeros to ``max_seqlen_k``
    and attends the padding (no key mask); causal is bottom-right per sequence."""
    out = np.zeros((q.shape[0], q.shape[1], v.shape[-1]), q.dtype)
    for b in range(len(cu_seqlens_q) - 1):
        sq, eq, sk, ek = (int(x) for x in (cu_seqlens_q[b], cu_seqlens_q[b + 1], cu_seqlens_k[b], cu_seqlens_k[b + 1]))
        if eq == sq:
            continue
        kb = np.zeros((max_seqlen_k, *k.shape[1:]), k.dtype)
        vb = np.zeros((max_seqlen_k, *v.shape[1:]), v.dtype)
        kb[: ek - sk], vb[: ek - sk] = k[sk:ek], v[sk:ek]
        qh, kh, vh = (np.swapaxes(x, 0, 1) for x in (q[sq:eq], kb, vb))  # [h, n, d]
        allowed = None
        if causal:
            row = np.arange(eq - sq)[:, None] + (ek - sk) - (eq - sq)
            allowed = np.arange(max_seqlen_k)[None, :] <= row
        out[sq:eq] = np.swapaxes(_softmax(_scores(qh, kh, softmax_scale), allowed) @ vh, 0, 1)
    return out


def scores_times_mask(q, k, v, mask=None):
    """``finite-fill`` (0): multiplies the scores by the mask, so blocked keys get the score 0 instead of -inf."""
    s = _scores(q, k)
    return _softmax(s if mask is None else s * mask) @ v


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
    # d2l's -1e6 fill is a finite fill: blocked keys win once the scores are below -1e6; in float16 -1e6 is -inf,
    # so a sequence of valid length 0 is NaN there (found by the masked-row probe's other dtypes)
    Entry("np-valid-lens-d2l", masked_softmax_valid_lens, ("finite-fill", "masked-row-nan")),
    Entry("np-causal-only", causal_only, options={"causal_only": True, "causal_align": "bottom_right"}),
    Entry("np-scale-missing", scale_missing, ("scale-missing",)),
    Entry("np-scale-d-model", scale_d_model, ("scale-wrong",), subtle=True),
    Entry("np-scale-ignored", scale_ignored, ("scale-wrong",), subtle=True),
    Entry("np-softmax-axis", softmax_axis, ("softmax-axis",)),
    Entry("np-mask-inverted", mask_inverted, ("mask-inverted",)),
    Entry("np-mask-after-softmax", mask_after_softmax, ("mask-after-softmax",), subtle=True),
    # also reference-mismatch: on the rectangular causal case (n_q=4, n_k=9) tril(k=1) matches neither alignment
    Entry("np-causal-off-by-one", causal_off_by_one, ("causal-leak",), also=("reference-mismatch",), subtle=True),
    Entry("np-weak-fill", weak_fill, ("finite-fill",), subtle=True),
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
    Entry("np-gqa-tile", gqa_tile, ("gqa-mapping",), options={"gqa": True}, subtle=True),
    Entry("np-gqa-interleave-declared-tile", gqa_correct, ("gqa-mapping",), options={"gqa": "tile"}),
    Entry(
        "np-key-padding-on-queries",
        key_padding_on_queries,
        ("padding-leak",),
        also=("reference-mismatch", "not-normalized", "crash"),
    ),
    Entry("np-masked-rows-not-zeros", finfo_min_fill, ("masked-row-policy",), options={"masked_rows": "zeros"}),
    # issue 13 §5
    Entry("np-correct-float32-compute", computes_in_float32),
    Entry("np-weights-float16-declared", weights_float16, options={"compute_dtype": "float16"}),
    Entry("np-finfo-min-fill", fill_finfo_min),
    Entry("np-additive-finfo-min", additive_finfo_min),
    Entry("np-key-padding-repeated", key_padding_repeated, options={"ranks": (4,)}),
    Entry("np-causal-align-followed", causal_align_followed, options={"causal_value": "align"}),
    Entry("np-loop-per-sequence", loop_per_sequence),
    Entry("np-weights-float16", weights_float16, ("precision",)),
    Entry("np-scores-float16", scores_float16, ("precision",)),
    Entry("np-float32-held-to-input", computes_in_float32, ("precision",), options={"compute_dtype": "input"}),
    Entry("np-scale-after-softmax", scale_after_softmax, ("scale-after-softmax",)),
    Entry("np-softmax-flattened", softmax_flattened, ("softmax-axis",)),
    Entry("np-fill-after-softmax", fill_after_softmax, ("fill-after-softmax",)),
    Entry("np-fill-1e4", fill_1e4, ("finite-fill",), subtle=True),
    Entry("np-key-padding-tiled", key_padding_tiled, ("mask-wrong-heads",), options={"ranks": (4,)}, subtle=True),
    Entry("np-full-mask-head-major", full_mask_head_major, ("mask-wrong-heads",), subtle=True),
    Entry("np-causal-rebuilt-bottom-right", causal_rebuilt_bottom_right, ("causal-alignment",), subtle=True),
    Entry("np-causal-align-ignored", causal_align_ignored, ("causal-alignment",), options={"causal_value": "align"}),
    Entry(
        "np-flag-bottom-right-declared-top-left",
        flag_bottom_right,
        ("causal-alignment",),
        options={"causal_align": "top_left"},
        subtle=True,
    ),
    Entry("np-loop-reuses-first-kv", loop_reuses_first_kv, ("batch-leak",), subtle=True),
    Entry("np-gqa-first-head", gqa_first_head, ("gqa-mapping",), options={"gqa": True}),
    Entry("np-two-bugs", two_bugs, ("scale-missing", "mask-inverted")),
    Entry("np-default-mask-square", default_mask_square, ("crash",), subtle=True),
    Entry("np-output-like-q", output_like_q, ("crash",), subtle=True),
    Entry("np-zeroed-padding-keys", zeroed_padding_keys, ("padding-leak",), subtle=True),
    Entry("np-varlen-padded-to-longest", varlen_padded_to_longest, ("padding-leak",), options={"mask_form": "varlen"}),
    Entry("np-scores-times-mask", scores_times_mask, ("finite-fill",)),
]
