"""Masks: one meaning inside attnlab, converters at the edges.

Inside attnlab a mask is a boolean array and ``True`` means *this query may attend to this key*. It broadcasts
against the scores ``[..., n_q, n_k]``. Additive terms (ALiBi, relative position) are not masks: they are passed
as ``bias``. Every other convention enters through a converter here and only here:

================================  ===========================  ====================================
where the mask comes from         its convention               converter
================================  ===========================  ====================================
PyTorch SDPA ``attn_mask``        bool True = attend, or float  :func:`from_torch_sdpa`
``nn.MultiheadAttention``         bool True = *blocked*, float  :func:`from_torch_mha`
Hugging Face ``attention_mask``   1 = keep (2-D), or additive   :func:`from_hf`
JAX ``dot_product_attention``     bool True = attend            :func:`from_jax`
any True = blocked mask           bool True = *blocked*         :func:`from_blocked`
any 0/1 keep mask                 1 = keep                      :func:`from_keep`
additive floats                   0 / -inf / -1e9 / finfo.min   :func:`from_additive`
================================  ===========================  ====================================

and leaves through :func:`to_additive` (for a chosen dtype, no float16 overflow) or :func:`to_blocked`.

Constructors (:func:`causal`, :func:`window`, :func:`key_padding`, :func:`query_padding`, :func:`segments`)
return NumPy boolean arrays; combine them with ``&`` and ``|``. :func:`to_string` draws one:

>>> print(to_string(causal(4)))
■ ⬚ ⬚ ⬚
■ ■ ⬚ ⬚
■ ■ ■ ⬚
■ ■ ■ ■
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from ._arrays import namespace, shape_of, to_numpy
from .errors import DTypeError, MaskError, MemoryLimitError, NonFiniteError, OptionError, ShapeError
from .validate import check_float, check_int, check_optional_int

__all__ = [
    "ALLOWED",
    "BLOCKED",
    "Align",
    "BlockMask",
    "MaskSpec",
    "causal",
    "from_additive",
    "from_blocked",
    "from_hf",
    "from_jax",
    "from_keep",
    "from_torch_mha",
    "from_torch_sdpa",
    "key_padding",
    "query_padding",
    "real_tokens",
    "segments",
    "to_additive",
    "to_blocked",
    "to_string",
    "window",
    "zero_padded_queries",
]

#: The character :func:`to_string` draws for a pair that may attend.
ALLOWED = "■"
#: The character :func:`to_string` draws for a blocked pair.
BLOCKED = "⬚"

#: Where the causal diagonal sits when n_q != n_k (the values of ``align=``).
Align = Literal["top_left", "bottom_right"]
_ALIGNS = ("top_left", "bottom_right")

#: An additive entry at or below this value blocks its key (BERT's -1e4, -1e9, finfo.min and -inf all do).
BLOCKING_THRESHOLD = -1e4


# --------------------------------------------------------------------------------------------------------------
# drawing


def to_string(mask: Any, *, allowed: str = ALLOWED, blocked: str = BLOCKED) -> str:
    """Draw a boolean mask ``[n_q, n_k]``: one line per query, ``■`` where it may attend, ``⬚`` where it may not.

    Leading axes of size 1 are dropped; index a larger batch first (``mask[0, 0]``).

    >>> print(to_string(causal(2, 3, align="bottom_right")))
    ■ ■ ⬚
    ■ ■ ■
    """
    m = to_numpy(mask)
    if m.dtype != np.bool_:
        raise DTypeError(f"mask: dtype {m.dtype} cannot be drawn; expected bool (True = may attend)")
    while m.ndim > 2 and m.shape[0] == 1:
        m = m[0]
    if m.ndim == 1:
        m = m[None, :]
    if m.ndim != 2:
        raise ShapeError(f"mask: shape {m.shape} cannot be drawn; index it down to [n_q, n_k] first")
    return "\n".join(" ".join(allowed if x else blocked for x in row) for row in m)


# --------------------------------------------------------------------------------------------------------------
# constructors


def _check_len(name: str, n: Any) -> int:
    return check_int(name, n, minimum=1, error=ShapeError)  # a size: its error is a ShapeError


#: A dense mask over more entries than this (16 GiB of booleans) is refused before it is allocated.
MAX_MASK_ELEMENTS = 16 * 2**30


def _check_dense(what: str, shape: tuple[int, ...]) -> None:
    """Refuse to allocate a boolean mask of ``shape`` over :data:`MAX_MASK_ELEMENTS` entries, by name."""
    n = 1
    for s in shape:
        n *= int(s)
    if n > MAX_MASK_ELEMENTS:
        raise MemoryLimitError(
            f"{what}: a dense mask of shape {tuple(shape)} needs {n / 2**30:.3g} GiB (one byte per entry), over the "
            f"{MAX_MASK_ELEMENTS / 2**30:.0f} GiB limit; at this length pass the structure instead of a dense mask: "
            f"attnlab.flash_attention(q, k, v, causal=..., window=..., key_lengths=..., segments=...) never builds it"
        )


def _reach(causal: Any, left: int | None, right: int | None) -> tuple[int | None, int | None]:
    """``(back, ahead)``: a query at position p may see keys ``p - back .. p + ahead`` (None: unbounded on that side).
    The causal and window rules, written once: causal is a window with ``ahead = 0``; both together the tighter."""
    ahead = right if not causal else 0 if right is None else min(0, right)
    return left, ahead


def _position_allowed(key_pos: Any, query_pos: Any, back: int | None, ahead: int | None) -> np.ndarray:
    """True where a key at ``key_pos`` is within ``(back, ahead)`` of a query at ``query_pos`` (broadcast against
    each other: ``[1, n_k]`` and ``[n_q, 1]`` give ``[n_q, n_k]`` booleans, no integer array of that size)."""
    ok = np.ones(np.broadcast_shapes(np.shape(key_pos), np.shape(query_pos)), dtype=bool)
    if back is not None:
        ok &= key_pos >= query_pos - back
    if ahead is not None:
        ok &= key_pos <= query_pos + ahead
    return ok


def _bounded(bound: int | None, span: int) -> int | None:
    """``bound`` (a window side, in Python's integers) cut to ``[-span - 1, span]``, or None (unbounded) from ``span``
    on: positions that differ by at most ``span`` cannot tell the difference, and no sum with it wraps in int64."""
    if bound is None or bound >= span:
        return None
    return max(int(bound), -span - 1)


def _visible_keys(pos: Any, back: int | None, ahead: int | None, n_keys: Any) -> tuple[Any, Any]:
    """Keys ``[lo, hi)`` that queries at positions ``pos`` (an int or an array) may see among ``n_keys`` keys."""
    span = int(np.max(np.abs(pos), initial=0)) + int(np.max(n_keys, initial=0)) + 1
    back, ahead = _bounded(back, span), _bounded(ahead, span)
    lo = 0 if back is None else np.maximum(0, pos - back)
    hi = n_keys if ahead is None else np.minimum(n_keys, pos + 1 + ahead)
    return lo, hi


def _position_mask(n_q: int, n_k: int, shift: int, back: int | None, ahead: int | None) -> np.ndarray:
    """``[n_q, n_k]``, True = may attend: query i, at key position ``i + shift``, sees keys within ``(back, ahead)``:
    what :func:`causal`, :func:`window` and every block of a :class:`MaskSpec` draw. Key j is allowed when
    ``j - i`` lies in ``[shift - back, shift + ahead]``; those bounds are cut to ``[-n_q - n_k, n_q + n_k]`` in
    Python's integers first, so a window of ``2**63 - 1`` or a huge ``shift`` never wraps around in int64."""
    span = n_q + n_k

    def cut(t: int) -> int:
        return min(max(int(t), -span), span)

    lo = None if back is None else cut(shift - back)
    hi = None if ahead is None else cut(shift + ahead)
    return _position_allowed(np.arange(n_k)[None, :], np.arange(n_q)[:, None], None if lo is None else -lo, hi)


def _below(lengths: np.ndarray, n: int) -> np.ndarray:
    """``[B, n]``: True for positions ``< lengths[b]`` (the padding rule: the real tokens come first)."""
    return np.arange(n)[None, :] < np.asarray(lengths)[:, None]


def _diagonal_shift(n_q: int, n_k: int, align: str | None, what: str) -> int:
    """How far right of the main diagonal query 0's own position sits (0 top-left, n_k - n_q bottom-right)."""
    if align is None:
        if n_q != n_k:
            raise MaskError(causal_alignment_message(n_q, n_k, what))
        return 0
    if align not in _ALIGNS:
        raise MaskError(f"align: expected 'top_left' or 'bottom_right', got {align!r}")
    return 0 if align == "top_left" else n_k - n_q


def causal_alignment_message(
    n_q: int, n_k: int, what: str = "causal", *, fix: str = "pass causal='top_left' or causal='bottom_right'"
) -> str:
    """The explanation given when a causal mask over ``n_q != n_k`` does not say how it is aligned; ``fix`` is its
    last line's advice."""
    a, b = min(n_q, 4), min(n_k, 5)
    top = to_string(causal(a, b, align="top_left"))
    bottom = to_string(causal(a, b, align="bottom_right"))
    indent = "\n    "
    return (
        f"{what}: n_q={n_q} != n_k={n_k}, so the causal diagonal must be placed explicitly.\n"
        f"  'top_left' (PyTorch is_causal, JAX): query i sees keys j <= i, e.g. n_q={a}, n_k={b}:"
        f"{indent}{top.replace(chr(10), indent)}\n"
        f"  'bottom_right' (FlashAttention, KV-cache decoding): the last query sees every key:"
        f"{indent}{bottom.replace(chr(10), indent)}\n"
        f"  {fix} (masks: align=...)"
    )


def causal(n_q: int, n_k: int | None = None, *, align: Align | None = None) -> np.ndarray:
    """The causal mask ``[n_q, n_k]``: query i may attend to key j when j <= i (+ n_k - n_q if bottom-right).

    Args:
        n_q: number of queries.
        n_k: number of keys (default ``n_q``).
        align: ``"top_left"`` (PyTorch ``is_causal``, JAX) or ``"bottom_right"`` (FlashAttention, decoding with
            a KV cache: the last query is the newest token). Required when ``n_q != n_k``.

    >>> print(to_string(causal(2, 4, align="top_left")))
    ■ ⬚ ⬚ ⬚
    ■ ■ ⬚ ⬚
    """
    n_q = _check_len("n_q", n_q)
    n_k = n_q if n_k is None else _check_len("n_k", n_k)
    shift = _diagonal_shift(n_q, n_k, align, "causal")
    _check_dense("causal", (n_q, n_k))
    return _position_mask(n_q, n_k, shift, *_reach(True, None, None))  # [n_q, n_k]


def window(
    n_q: int,
    n_k: int | None = None,
    *,
    left: int | None = None,
    right: int | None = 0,
    align: Align | None = None,
) -> np.ndarray:
    """A sliding-window mask ``[n_q, n_k]``: query i sees keys from ``left`` before to ``right`` after its position.

    The query's own position is i (top-left) or i + n_k - n_q (bottom-right). ``left=None`` or ``right=None``
    leaves that side unbounded; the default ``right=0`` is a causal window (Mistral, Longformer's local part).

    >>> print(to_string(window(4, left=1)))
    ■ ⬚ ⬚ ⬚
    ■ ■ ⬚ ⬚
    ⬚ ■ ■ ⬚
    ⬚ ⬚ ■ ■
    """
    n_q = _check_len("n_q", n_q)
    n_k = n_q if n_k is None else _check_len("n_k", n_k)
    for name, w in (("left", left), ("right", right)):
        check_optional_int(name, w, minimum=0, error=MaskError)
    shift = _diagonal_shift(n_q, n_k, align, "window")
    _check_dense("window", (n_q, n_k))
    return _position_mask(n_q, n_k, shift, *_reach(False, left, right))  # [n_q, n_k]


def _check_range(name: str, lens: np.ndarray, size: str, n: int) -> None:
    """Refuse a length outside ``0 .. n`` (``size`` names n), by the argument's ``name`` and the entry's index."""
    bad = np.flatnonzero((lens < 0) | (lens > n))
    if bad.size:
        raise ShapeError(f"{name}: entry {bad[0]} is {lens[bad[0]]}; expected 0 <= length <= {size}={n}")


def _lengths(lengths: Any, n: int, size: str) -> np.ndarray:
    lens = to_numpy(lengths)
    if lens.ndim != 1 or not (np.issubdtype(lens.dtype, np.integer) or lens.size == 0):
        raise ShapeError(f"lengths: expected a 1-D integer array [B], got shape {lens.shape} dtype {lens.dtype}")
    _check_range("lengths", lens, size, n)
    return lens.astype(np.int64)


def real_tokens(lengths: Any, n: int, *, size: str = "n") -> np.ndarray:
    """``[B, n]``: True for the real positions ``i < lengths[b]`` of each sequence (the padding rule that
    :func:`key_padding`, :func:`query_padding` and :class:`MaskSpec`'s lengths follow). ``lengths`` ints ``[B]`` in
    ``0 .. n``, else a :class:`~attnlab.errors.ShapeError` (``size`` names n in it).

    >>> real_tokens([1, 3], 3).tolist()
    [[True, False, False], [True, True, True]]
    """
    return _below(_lengths(lengths, check_int(size, n, minimum=0, error=ShapeError), size), n)


def key_padding(lengths: Any, n_k: int, *, ndim: int = 4) -> np.ndarray:
    """Key padding from sequence lengths: key j of sequence b may be attended to when j < lengths[b].

    Returns ``[B, 1, 1, n_k]`` (broadcasts over heads and queries of ``[B, h, n_q, n_k]``), or ``[B, 1, n_k]``
    with ``ndim=3`` for scores without a head axis.

    >>> print(to_string(key_padding([2], 4)))
    ■ ■ ⬚ ⬚
    """
    n_k = _check_len("n_k", n_k)
    lens = _lengths(lengths, n_k, "n_k")
    ndim = check_int("ndim", ndim, minimum=2)
    ok = _below(lens, n_k)  # [B, n_k]
    return ok.reshape((len(lens),) + (1,) * (ndim - 2) + (n_k,))


def query_padding(lengths: Any, n_q: int, *, ndim: int = 4) -> np.ndarray:
    """Which queries are real: ``[B, 1, n_q, 1]`` (or ``[B, n_q, 1]`` with ``ndim=3``), True for i < lengths[b].

    Combined with a key mask by ``&`` it makes padded query rows fully masked; with ``masked_rows="zero"`` their
    outputs are then exactly 0 (article 001 §7.1). Padded queries never hide keys from the real ones.
    """
    n_q = _check_len("n_q", n_q)
    lens = _lengths(lengths, n_q, "n_q")
    ndim = check_int("ndim", ndim, minimum=3)
    ok = _below(lens, n_q)  # [B, n_q]
    return ok.reshape((len(lens),) + (1,) * (ndim - 3) + (n_q, 1))


def zero_padded_queries(output: Any, lengths: Any) -> Any:
    """A copy of ``output [B, ..., n_q, d_v]`` with the rows of padded queries (i >= lengths[b]) set to 0."""
    xp = namespace(output)
    out = xp.asarray(output)
    shape = shape_of(out)
    if len(shape) < 3:
        raise ShapeError(f"output: expected [B, ..., n_q, d_v], got shape {shape}")
    keep = query_padding(lengths, shape[-2], ndim=len(shape))
    if keep.shape[0] != shape[0]:
        raise ShapeError(f"lengths: {keep.shape[0]} entries, but output has batch size B={shape[0]}")
    keep_x = xp.asarray(keep) if xp is np else xp.asarray(keep, device=_device(out))
    return xp.where(keep_x, out, xp.zeros_like(out))


def segments(q_segments: Any, k_segments: Any | None = None) -> np.ndarray:
    """Packed sequences: query i may attend to key j when they carry the same segment id.

    Args:
        q_segments: integer ids ``[..., n_q]``.
        k_segments: integer ids ``[..., n_k]`` (default: the same as ``q_segments``).

    Returns ``[..., n_q, n_k]`` (block diagonal for sorted ids). Combine with :func:`causal` by ``&``.

    >>> print(to_string(segments([0, 0, 1])))
    ■ ■ ⬚
    ■ ■ ⬚
    ⬚ ⬚ ■
    """
    qs = to_numpy(q_segments)
    ks = qs if k_segments is None else to_numpy(k_segments)
    for name, s in (("q_segments", qs), ("k_segments", ks)):
        if s.ndim < 1 or not np.issubdtype(s.dtype, np.integer):
            raise ShapeError(f"{name}: expected integer ids [..., n], got shape {s.shape} dtype {s.dtype}")
    try:
        shape = (*np.broadcast_shapes(qs.shape[:-1], ks.shape[:-1]), qs.shape[-1], ks.shape[-1])
    except ValueError:
        raise ShapeError(
            f"k_segments: leading dims of shape {ks.shape} do not broadcast with q_segments {qs.shape}"
        ) from None
    _check_dense("segments", shape)
    same: np.ndarray = qs[..., :, None] == ks[..., None, :]  # [..., n_q, n_k]
    return same


# --------------------------------------------------------------------------------------------------------------
# converters in


def _device(x: Any) -> Any:
    from ._arrays import device_of

    return device_of(x)


def _require_bool(xp: Any, m: Any, name: str, hint: str) -> None:
    if not xp.isdtype(m.dtype, "bool"):
        raise DTypeError(f"{name}: expected a bool mask, got dtype {m.dtype}; {hint}")


def _mask_array(mask: Any, name: str) -> tuple[Any, Any]:
    """``(xp, array)`` for a mask argument: nested lists become NumPy; non-arrays and masked arrays are refused."""
    if isinstance(mask, (list, tuple, bool, np.generic)):
        try:
            mask = np.asarray(mask)
        except (ValueError, TypeError):
            raise ShapeError(f"{name}: nested lists of unequal lengths do not form a mask") from None
    xp = namespace(**{name: mask})
    return xp, xp.asarray(mask)


def _from_blocked(mask: Any, name: str) -> Any:
    xp, m = _mask_array(mask, name)
    _require_bool(xp, m, name, "a True = blocked mask is boolean")
    return xp.logical_not(m)


def from_blocked(mask: Any) -> Any:
    """From a boolean mask where True means *blocked* (``nn.MultiheadAttention``, ``masked_fill``) to attnlab's."""
    return _from_blocked(mask, "mask")


def from_keep(mask: Any) -> Any:
    """From a 0/1 mask (any dtype) where 1 means keep (Hugging Face ``attention_mask``) to attnlab's boolean."""
    xp, m = _mask_array(mask, "mask")
    if xp.isdtype(m.dtype, "bool"):
        return m
    if not xp.isdtype(m.dtype, ("integral", "real floating")):
        raise DTypeError(f"mask: dtype {m.dtype} is not a 0/1 keep mask; expected bool, integer or float 0/1 entries")
    ok = xp.logical_or(m == 0, m == 1)
    if not bool(xp.all(ok)):
        bad = np.argwhere(~to_numpy(ok))[0]
        raise MaskError(
            f"mask: a keep mask holds only 0 and 1, but entry {tuple(int(i) for i in bad)} is "
            f"{to_numpy(m)[tuple(bad)].item()!r}; for additive masks use masks.from_additive"
        )
    return m == 1


def _check_threshold(threshold: Any) -> float:
    t = check_float("threshold", threshold, finite=False)
    if not t < 0:
        raise OptionError(
            f"threshold: expected a negative number (an entry <= threshold blocks its key, 0 keeps it; "
            f"default {BLOCKING_THRESHOLD:g}), got {threshold!r}"
        )
    return t


def _from_additive(mask: Any, name: str, threshold: Any) -> Any:
    threshold = _check_threshold(threshold)
    xp, m = _mask_array(mask, name)
    if xp.isdtype(m.dtype, "bool"):
        raise DTypeError(f"{name}: got a bool mask where an additive float mask was expected; it is already canonical")
    if not xp.isdtype(m.dtype, "real floating"):
        raise DTypeError(f"{name}: expected an additive float mask, got dtype {m.dtype}; for 0/1 masks use from_keep")
    if bool(xp.any(xp.isnan(m))):
        bad = tuple(int(i) for i in np.argwhere(np.isnan(to_numpy(m)))[0])
        raise NonFiniteError(f"{name}: additive mask {shape_of(m)} holds NaN at {bad}; it neither keeps nor blocks")
    blocked = m <= threshold
    clean = xp.logical_or(blocked, m == 0)
    if not bool(xp.all(clean)):
        mn = to_numpy(m)
        bad = tuple(int(i) for i in np.argwhere(~to_numpy(clean))[0])
        raise MaskError(
            f"{name}: additive mask {shape_of(m)} holds {mn[bad].item()!r} at {bad}, neither 0 nor a blocking value "
            f"(<= {threshold:g} or -inf); that is a bias (ALiBi, relative position): pass it as bias=, and "
            f"only its blocking part as mask="
        )
    return xp.logical_not(blocked)


def from_additive(mask: Any, *, threshold: float = BLOCKING_THRESHOLD) -> Any:
    """From an additive float mask (0 = attend; -inf, -1e9, finfo.min ... = blocked) to attnlab's boolean.

    An entry blocks when it is ``-inf`` or at most ``threshold`` (default -1e4, BERT's value; any negative number
    or ``-inf`` may be given, since 0 is the value that keeps). Any other non-zero entry is a bias, not a mask: it
    is refused, with a pointer to the ``bias`` argument; NaN is refused too.

    >>> from_additive([[0.0, -1e9], [0.0, 0.0]]).tolist()
    [[True, False], [True, True]]
    """
    return _from_additive(mask, "mask", threshold)


def from_torch_sdpa(attn_mask: Any) -> Any:
    """From ``torch.nn.functional.scaled_dot_product_attention``'s ``attn_mask`` (bool True = attend, or float).

    A float ``attn_mask`` must be a pure mask (0 / blocking values); a real-valued bias goes in ``bias``.
    """
    xp, m = _mask_array(attn_mask, "attn_mask")
    return m if xp.isdtype(m.dtype, "bool") else _from_additive(m, "attn_mask", BLOCKING_THRESHOLD)


def _mha_part(x: Any, name: str) -> Any:
    xp, m = _mask_array(x, name)
    return _from_blocked(m, name) if xp.isdtype(m.dtype, "bool") else _from_additive(m, name, BLOCKING_THRESHOLD)


def from_torch_mha(
    *,
    key_padding_mask: Any | None = None,
    attn_mask: Any | None = None,
    num_heads: int | None = None,
) -> Any:
    """From ``nn.MultiheadAttention``'s masks (bool True = *blocked*, or additive float) to one attnlab mask.

    Args:
        key_padding_mask: ``[B, n_k]`` (or ``[n_k]`` unbatched).
        attn_mask: ``[n_q, n_k]``, or ``[B * num_heads, n_q, n_k]`` (then ``num_heads`` is required).
        num_heads: heads of the layer, to unpack a 3-D ``attn_mask``.

    Returns:
        a bool mask broadcastable to ``[B, h, n_q, n_k]`` (True = may attend). The two masks must agree on
        ``n_k`` and on ``B``: a :class:`~attnlab.errors.ShapeError` names both shapes otherwise.
    """
    if key_padding_mask is None and attn_mask is None:
        raise MaskError("from_torch_mha: pass key_padding_mask=, attn_mask= or both")
    if num_heads is not None:
        num_heads = check_int("num_heads", num_heads, minimum=1)
    namespace(key_padding_mask=key_padding_mask, attn_mask=attn_mask)
    out = None
    kp_shape = None
    if key_padding_mask is not None:
        kp = _mha_part(key_padding_mask, "key_padding_mask")
        s = kp_shape = shape_of(kp)
        if len(s) not in (1, 2):
            raise ShapeError(f"key_padding_mask: expected [B, n_k] or [n_k], got shape {s}")
        xp = namespace(kp)
        kp = xp.reshape(kp, (s[0], 1, 1, s[1]) if len(s) == 2 else (1, 1, 1, s[0]))  # [B, 1, 1, n_k]
        out = kp
    if attn_mask is not None:
        am = _mha_part(attn_mask, "attn_mask")
        s = am_shape = shape_of(am)
        if len(s) == 3:
            if num_heads is None or s[0] % num_heads:
                raise ShapeError(
                    f"attn_mask: shape {s} is [B * num_heads, n_q, n_k]; pass num_heads= (a divisor of {s[0]})"
                )
            xp = namespace(am)
            am = xp.reshape(am, (s[0] // num_heads, num_heads, s[1], s[2]))  # [B, h, n_q, n_k]
        elif len(s) != 2:
            raise ShapeError(f"attn_mask: expected [n_q, n_k] or [B * num_heads, n_q, n_k], got shape {s}")
        if out is not None:
            try:
                np.broadcast_shapes(shape_of(out), shape_of(am))
            except ValueError:
                raise ShapeError(
                    f"attn_mask: shape {am_shape} does not fit key_padding_mask's {kp_shape} (as [B, 1, 1, n_k] "
                    f"{shape_of(out)} against {shape_of(am)} [B, h, n_q, n_k]): n_k and B must agree"
                ) from None
            xp = namespace(am)
            out = xp.logical_and(out, am)
        else:
            out = am
    return out


def from_hf(attention_mask: Any) -> Any:
    """From a Hugging Face ``attention_mask`` to attnlab's boolean.

    * 2-D ``[B, n_k]`` with 1 = real token, 0 = padding -> ``[B, 1, 1, n_k]``;
    * 4-D "extended" additive masks ``[B, 1, n_q, n_k]`` (0 / finfo.min) -> the same shape, boolean;
    * 4-D boolean masks (True = attend, as HF's sdpa path builds them) pass through.
    """
    xp, m = _mask_array(attention_mask, "attention_mask")
    s = shape_of(m)
    if len(s) == 2:
        return from_keep(m)[:, None, None, :]  # [B, 1, 1, n_k]
    if len(s) == 4:
        return m if xp.isdtype(m.dtype, "bool") else _from_additive(m, "attention_mask", BLOCKING_THRESHOLD)
    raise ShapeError(f"attention_mask: expected [B, n_k] (1 = keep) or [B, 1, n_q, n_k], got shape {s}")


def from_jax(mask: Any) -> Any:
    """From ``jax.nn.dot_product_attention``'s ``mask`` (bool, True = attend, ``[B, N, T, S]``): same meaning."""
    xp, m = _mask_array(mask, "mask")
    _require_bool(xp, m, "mask", "JAX masks are boolean; for an additive bias use bias=")
    return m


# --------------------------------------------------------------------------------------------------------------
# converters out


def to_blocked(mask: Any) -> Any:
    """attnlab's mask as True = *blocked* (for ``nn.MultiheadAttention`` and ``masked_fill``)."""
    xp, m = _mask_array(mask, "mask")
    _require_bool(xp, m, "mask", "attnlab masks are boolean (True = may attend)")
    return xp.logical_not(m)


def to_additive(mask: Any, dtype: Any = None, *, fill: Literal["min", "-inf"] = "min") -> Any:
    """attnlab's mask as an additive float mask: 0 where allowed, ``fill`` where blocked.

    ``fill="min"`` uses the dtype's most negative finite number (``finfo(dtype).min``), which never overflows,
    not even in float16 where -1e9 would become -inf; ``fill="-inf"`` uses -inf. ``dtype`` defaults to float32
    and must be a floating dtype of the mask's library (an integer dtype cannot hold -inf, and its "most negative"
    value would be an ordinary score).

    >>> to_additive([[True, False]], np.float16).tolist()
    [[0.0, -65504.0]]
    """
    xp, m = _mask_array(mask, "mask")
    _require_bool(xp, m, "mask", "attnlab masks are boolean (True = may attend)")
    dtype = xp.float32 if dtype is None else dtype
    floating = False
    try:
        if xp is np:
            dtype = np.dtype(dtype)
        floating = xp.isdtype(dtype, "real floating")
    except (TypeError, ValueError, AttributeError):
        floating = False
    if not floating:
        raise DTypeError(
            f"dtype: expected a floating dtype for an additive mask (float32, float16, bfloat16, float64), got "
            f"{dtype!r}; an integer dtype cannot hold -inf, and a bool mask is attnlab's own"
        )
    if fill == "min":
        value = float(xp.finfo(dtype).min)
    elif fill == "-inf":
        value = -float("inf")
    else:
        raise MaskError(f"fill: expected 'min' or '-inf', got {fill!r}")
    zero = xp.zeros(shape_of(m), dtype=dtype) if xp is np else xp.zeros(shape_of(m), dtype=dtype, device=_device(m))
    return xp.where(m, zero, xp.full_like(zero, value))


# --------------------------------------------------------------------------------------------------------------
# the structured mask: one value that every attention variant reads


def _position_pattern(
    bq: int, bk: int, offset: int, causal: bool, left: int | None, right: int | None
) -> tuple[np.ndarray, bool]:
    """``(blocked [bq, bk], all blocked)`` for the causal/window constraints, True = *blocked*, where ``offset`` is the
    block's first key position minus its first query position (key j, query i blocked when ``j + offset - i`` is
    beyond the window or, causal, above 0)."""
    bad = ~_position_mask(bq, bk, -offset, *_reach(causal, left, right))
    bad.flags.writeable = False
    return bad, bool(bad.all())


_cached_pattern = functools.lru_cache(maxsize=256)(_position_pattern)


def _position_blocked(
    bq: int, bk: int, offset: int, causal: bool, left: int | None, right: int | None
) -> tuple[np.ndarray, bool]:
    """:func:`_position_pattern`, cached for kernel-sized blocks (every diagonal block of a call is alike); a whole
    mask is computed afresh (256 cached ``[n, n]`` masks would hold gigabytes)."""
    if bq * bk <= 1 << 20:
        return _cached_pattern(bq, bk, offset, causal, left, right)
    return _position_pattern(bq, bk, offset, causal, left, right)


def _ids(name: str, ids: Any, what: str) -> np.ndarray:
    """Integer ids or lengths as a 2-D (segments) or 1-D (lengths) int64 array, by name."""
    a = to_numpy(ids)
    if what == "lengths":
        if a.ndim == 0:
            a = a.reshape(1)
        if a.ndim != 1 or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
            raise ShapeError(f"{name}: expected a 1-D integer array [B], got shape {a.shape} dtype {a.dtype}")
        return a.astype(np.int64)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2 or not np.issubdtype(a.dtype, np.integer):
        raise ShapeError(
            f"segments: {name} must be integer ids [n] or [B, n], got shape {a.shape} dtype {a.dtype} "
            f"(pass one array for self-attention or a (q_segments, k_segments) pair)"
        )
    return a


def _window_pair(window: Any) -> tuple[int | None, int | None] | None:
    """``None``; an int ``w`` (keys up to ``w`` positions back, none ahead); or ``(left, right)``, None = unbounded."""
    if window is None:
        return None
    if isinstance(window, (int, np.integer)) and not isinstance(window, bool):
        pair = (int(window), 0)
    elif isinstance(window, (tuple, list)) and len(window) == 2:
        pair = tuple(window)
    else:
        raise MaskError(f"window: expected None, an int >= 0 or a (left, right) pair, got {window!r}")
    for name, w in zip(("window left", "window right"), pair, strict=True):
        try:
            check_optional_int(name, w, minimum=0, error=MaskError)
        except MaskError as err:
            raise MaskError(f"{err} (window={window!r})") from None
    return (None if pair[0] is None else int(pair[0]), None if pair[1] is None else int(pair[1]))


def _offsets(q_offset: Any, causal: Any) -> np.ndarray | None:
    if q_offset is None:
        return None
    off: np.ndarray | None
    if isinstance(q_offset, (int, np.integer)) and not isinstance(q_offset, bool) and q_offset >= 0:
        off = np.array([int(q_offset)], dtype=np.int64)
    else:
        off = to_numpy(q_offset) if hasattr(q_offset, "shape") or isinstance(q_offset, list) else None
        if off is None or off.ndim != 1 or not np.issubdtype(off.dtype, np.integer) or (off < 0).any():
            raise MaskError(
                f"q_offset: expected None or an int >= 0 (query 0's key position), or one per sequence [B], got "
                f"{q_offset!r}"
            )
        off = off.astype(np.int64)
    if causal not in (True, False):
        shown = q_offset if off.size == 1 and not hasattr(q_offset, "shape") else "[...]"
        raise MaskError(
            f"q_offset={shown} already places the queries (query i sits at key position q_offset + i); "
            f"pass causal=True with it, not causal={causal!r}"
        )
    return off


@dataclass(frozen=True)
class BlockMask:
    """One block of a :class:`MaskSpec` as the kernels apply it: ``blocked [bq, bk]`` (True = *blocked*,
    read-only), and ``position``: when only the causal/window constraints cut the block, the key
    ``(bq, bk, offset, causal, left, right)`` of its cached pattern (every diagonal block of a call shares one)."""

    blocked: np.ndarray
    position: tuple[Any, ...] | None = None


@dataclass(frozen=True, eq=False)
class MaskSpec:
    """Which keys each query may see, as structure rather than an ``[n_q, n_k]`` array: one value that the core, the
    tiled kernel, the KV cache and the ring attention all read (their ``causal=``, ``window=``, ``key_lengths=``...
    keywords build it). All parts combine (AND).

    Attributes:
        causal: ``False``, ``True`` (needs n_q == n_k, or ``q_offset``), ``"top_left"`` or ``"bottom_right"``.
        q_offset: the key position of query 0 (query i sits at ``q_offset + i``): an int, or one per sequence
            ``[B]`` (a KV cache's sequences at different lengths). Places the causal diagonal and the window.
        window: ``(left, right)``: a query at position p sees keys ``p - left .. p + right`` (None: unbounded on
            that side); an int ``w`` means ``(w, 0)``.
        key_lengths: ``[B]`` (or one shared) ints: keys ``j >= key_lengths[b]`` of sequence b are padding.
        query_lengths: ``[B]`` ints: queries ``i >= query_lengths[b]`` are padding (their rows see nothing).
        segments: packed sequences ``(q_ids [B or 1, n_q], k_ids [B or 1, n_k])``: a query sees only keys with its
            id (one array: the same ids for both).
        dense: a boolean mask (True = may attend) broadcastable to the scores ``[..., n_q, n_k]``, or None.
        n_q, n_k: the sizes, once :meth:`sized` has checked the parts against them (None before).

    "Sequence" b is the index along the first axis of the scores (B); a part with one row is shared by all.

    >>> spec = MaskSpec(causal="bottom_right", window=1).sized(3, 5)
    >>> print(spec.to_string())
    ⬚ ■ ■ ⬚ ⬚
    ⬚ ⬚ ■ ■ ⬚
    ⬚ ⬚ ⬚ ■ ■
    >>> spec.key_range(0, 3)
    (1, 5)
    """

    causal: bool | Align = False
    q_offset: Any = None
    window: Any = None
    key_lengths: Any = None
    query_lengths: Any = None
    segments: Any = None
    dense: Any = None
    n_q: int | None = None
    n_k: int | None = None

    def __post_init__(self) -> None:
        causal = False if self.causal is None else self.causal
        if isinstance(causal, np.ndarray) or causal not in (False, True, "top_left", "bottom_right"):
            raise MaskError(f"causal: expected False, True, 'top_left' or 'bottom_right', got {causal!r}")
        seg = self.segments
        if seg is not None:
            pair = seg if isinstance(seg, tuple) and len(seg) == 2 else (seg, seg)
            seg = (_ids("q_segments", pair[0], "ids"), _ids("k_segments", pair[1], "ids"))
        norm = {
            "causal": causal,
            "q_offset": _offsets(self.q_offset, causal),
            "window": _window_pair(self.window),
            "key_lengths": None if self.key_lengths is None else _ids("key_lengths", self.key_lengths, "lengths"),
            "query_lengths": None
            if self.query_lengths is None
            else _ids("query_lengths", self.query_lengths, "lengths"),
            "segments": seg,
        }
        for name, value in norm.items():
            object.__setattr__(self, name, value)

    @classmethod
    def build(cls, mask: Any = None, **parts: Any) -> MaskSpec:
        """The spec that a variant's keywords spell: ``mask`` a boolean array (True = may attend, the ``dense``
        part), a :class:`MaskSpec`, or None; ``parts`` fields of :class:`MaskSpec` (``causal=``, ``window=``...),
        those left at None or False ignored. A :class:`MaskSpec` given with other parts is a
        :class:`~attnlab.errors.MaskError`: say it once.

        >>> MaskSpec.build(None, causal=True, window=None).causal
        True
        """
        given = {name: value for name, value in parts.items() if value is not None and value is not False}
        if isinstance(mask, MaskSpec):
            if given:
                raise MaskError(
                    f"mask: a MaskSpec already says which keys each query sees; pass {', '.join(sorted(given))} in "
                    f"it (MaskSpec({', '.join(f'{n}=...' for n in sorted(given))})), not beside it"
                )
            return mask
        return cls(dense=mask, **given)

    # ---------------------------------------------------------------------------------------------------------
    @property
    def structured(self) -> bool:
        """Whether any part other than ``dense`` constrains the keys."""
        return bool(self.causal) or any(
            x is not None for x in (self.window, self.key_lengths, self.query_lengths, self.segments)
        )

    @property
    def align(self) -> str | None:
        """The causal alignment (``"top_left"``, ``"bottom_right"``; None without causal, or with ``q_offset``)."""
        if not self.causal or self.q_offset is not None:
            return None
        return "top_left" if self.causal is True else self.causal

    def sized(self, n_q: int, n_k: int, sequences: int = 1) -> MaskSpec:
        """This spec checked against ``n_q`` queries, ``n_k`` keys and ``sequences`` (B, the scores' first axis):
        errors name the part (``causal=True`` over n_q != n_k draws both alignments)."""
        n_q, n_k = int(n_q), int(n_k)
        if self.q_offset is None and n_q != n_k:
            if self.causal is True:
                raise MaskError(causal_alignment_message(n_q, n_k, "causal=True"))
            if self.window is not None and not self.causal:
                fix = "pass q_offset= or causal='top_left'/'bottom_right'"
                raise MaskError(causal_alignment_message(n_q, n_k, "window", fix=fix))
        parts = [("q_offset", self.q_offset, None), ("key_lengths", self.key_lengths, ("n_k", n_k))]
        parts.append(("query_lengths", self.query_lengths, ("n_q", n_q)))
        for name, a, limit in parts:
            if a is None:
                continue
            if a.shape[0] not in (1, sequences):
                raise ShapeError(
                    f"{name}: {a.shape[0]} entries, expected one per sequence (B={sequences}, the first leading "
                    f"axis of q) or a single one"
                )
            if limit is not None:
                _check_range(name, a, *limit)
        seg = self.segments
        if seg is not None:
            for name, s, n in (("q_segments", seg[0], n_q), ("k_segments", seg[1], n_k)):
                if s.shape[1] != n:
                    raise ShapeError(f"segments: {name} has {s.shape[1]} ids, expected {n} (shape {s.shape})")
                if s.shape[0] not in (1, sequences):
                    raise ShapeError(
                        f"segments: {name} has {s.shape[0]} rows, expected 1 or one per sequence (B={sequences})"
                    )
            if seg[0].shape[0] != seg[1].shape[0]:
                b = max(seg[0].shape[0], seg[1].shape[0])
                seg = (np.broadcast_to(seg[0], (b, n_q)), np.broadcast_to(seg[1], (b, n_k)))
        return replace(self, segments=seg, n_q=n_q, n_k=n_k)

    def sequence(self, b: int) -> MaskSpec:
        """The spec of sequence ``b`` alone (its row of every per-sequence part; ``dense`` left out), unsized: what a
        variant that runs sequence by sequence passes on.

        >>> MaskSpec(causal=True, q_offset=[3, 5], key_lengths=[4, 6]).sequence(1).q_offset.tolist()
        [5]
        """

        def row(a: Any) -> Any:
            return None if a is None else a[b : b + 1] if a.shape[0] > 1 else a

        seg = None if self.segments is None else (row(self.segments[0]), row(self.segments[1]))
        return replace(
            self, q_offset=row(self.q_offset), key_lengths=row(self.key_lengths), query_lengths=row(self.query_lengths),
            segments=seg, dense=None, n_q=None, n_k=None,
        )  # fmt: skip

    def _need_sizes(self) -> tuple[int, int]:
        if self.n_q is None or self.n_k is None:
            raise MaskError("MaskSpec: sizes unknown; call spec.sized(n_q, n_k) first")
        return self.n_q, self.n_k

    @staticmethod
    def _row(a: np.ndarray, seq: int) -> Any:
        return a[seq] if a.shape[0] > 1 else a[0]

    def shift(self, seq: int = 0) -> int:
        """The key position of query 0 of sequence ``seq`` (query i sits at ``shift + i``)."""
        n_q, n_k = self._need_sizes()
        if self.q_offset is not None:
            return int(self._row(self.q_offset, seq))
        return _diagonal_shift(n_q, n_k, self.align or "top_left", "causal")  # no causal part: positions top-left

    def n_keys(self, seq: int = 0) -> int:
        """Keys of sequence ``seq`` that are not padding."""
        _, n_k = self._need_sizes()
        return n_k if self.key_lengths is None else int(self._row(self.key_lengths, seq))

    @property
    def reach(self) -> tuple[int | None, int | None]:
        """``(back, ahead)``: a query at key position p may see keys ``p - back .. p + ahead`` (None: unbounded), the
        causal and window parts together.

        >>> MaskSpec(causal=True, window=3).reach
        (3, 0)
        """
        left, right = self.window if self.window is not None else (None, None)
        return _reach(self.causal, left, right)

    def key_range(self, i0: int, i1: int, seq: int = 0) -> tuple[int, int]:
        """Keys ``[lo, hi)`` that query rows ``[i0, i1)`` of sequence ``seq`` may see at most (causal, window, key
        lengths; empty when ``hi <= lo``, as when every row is a padded query, ``i0 >= query_lengths[seq]``)."""
        if self.query_lengths is not None and i0 >= int(self._row(self.query_lengths, seq)):
            return 0, 0
        shift, (back, ahead) = self.shift(seq), self.reach
        lo, _ = _visible_keys(i0 + shift, back, ahead, self.n_keys(seq))
        _, hi = _visible_keys(i1 - 1 + shift, back, ahead, self.n_keys(seq))
        return int(lo), int(hi)

    def query_range(self, j0: int, j1: int, seq: int = 0) -> tuple[int, int]:
        """Query rows ``[lo, hi)`` that may see some key of ``[j0, j1)`` (causal, window, query lengths)."""
        n_q, _ = self._need_sizes()
        lo, hi = 0, n_q if self.query_lengths is None else int(self._row(self.query_lengths, seq))
        shift, (back, ahead) = self.shift(seq), self.reach
        if ahead is not None:  # query p sees key j when j - ahead <= p <= j + back
            lo = max(lo, j0 - shift - ahead)
        if back is not None:
            hi = min(hi, j1 + back - shift)
        return lo, hi

    def blocked(
        self, i0: int, i1: int, j0: int, j1: int, seq: int = 0, dense: Any = None
    ) -> BlockMask | Literal[False] | None:
        """Block ``[i0:i1, j0:j1]`` of sequence ``seq`` for the kernels: ``None`` if nothing in it is blocked,
        ``False`` if everything is (skip it), else a :class:`BlockMask` (True = *blocked*). ``dense`` is this batch
        index's ``[n_q, n_k]`` dense mask (True = may attend) or None: the kernels index their own layout.
        Key lengths are not looked at (:meth:`key_range` cuts them); rows of padded queries (``i >=
        query_lengths[seq]``) are blocked here, since a query block can straddle the last real query."""
        parts: list[np.ndarray] = []
        if self.query_lengths is not None:
            n_real = int(self._row(self.query_lengths, seq))
            if n_real <= i0:
                return False
            if n_real < i1:
                pad = np.zeros((i1 - i0, j1 - j0), dtype=bool)
                pad[n_real - i0 :] = True
                parts.append(pad)
        shift = self.shift(seq)
        left, right = self.window if self.window is not None else (None, None)
        back, ahead = self.reach  # does the block's corner farthest from the diagonal on either side fall outside?
        need_rel = (ahead is not None and j1 - 1 > i0 + shift + ahead) or (
            back is not None and j0 < i1 - 1 + shift - back
        )
        key = None
        if need_rel:
            key = (i1 - i0, j1 - j0, j0 - i0 - shift, bool(self.causal), left, right)
            pattern, everything = _position_blocked(*key)
            if everything:
                return False
            parts.append(pattern)
        if self.segments is not None:
            q_ids, k_ids = self.segments
            b = seq if q_ids.shape[0] > 1 else 0
            qs, ks = q_ids[b, i0:i1], k_ids[b, j0:j1]
            qmin, qmax, kmin, kmax = qs.min(), qs.max(), ks.min(), ks.max()
            if qmax < kmin or kmax < qmin:
                return False
            if not (qmin == qmax == kmin == kmax):
                parts.append(qs[:, None] != ks[None, :])
        if dense is not None:
            m = dense[i0:i1, j0:j1]
            if not m.all():
                if not m.any():
                    return False
                parts.append(~m)
        if not parts:
            return None
        if len(parts) == 1 and key is not None:
            return BlockMask(parts[0], key)
        bad = parts[0]
        for p in parts[1:]:
            bad = bad | p
        if bad.all():
            return False
        return BlockMask(bad)

    def block(self, i0: int, i1: int, j0: int, j1: int) -> np.ndarray | Literal[False] | None:
        """Block ``[i0:i1, j0:j1]`` of every sequence at once, True = may attend: ``None`` if every pair is
        allowed, ``False`` if none is, else ``[S, i1-i0, j1-j0]`` (S = 1 or B). Not the dense part."""
        self._need_sizes()
        seqs = self._sequences()
        allowed = np.zeros((seqs, i1 - i0, j1 - j0), dtype=bool)
        for s in range(seqs):
            lo, hi = self.key_range(i0, i1, s)
            qlo, qhi = self.query_range(j0, j1, s)
            if hi <= max(lo, j0) or lo >= j1 or qhi <= max(qlo, i0) or qlo >= i1:
                continue
            b = self.blocked(i0, i1, j0, j1, s)
            if b is False:
                continue
            ok = np.ones((i1 - i0, j1 - j0), dtype=bool) if b is None else ~b.blocked
            ok[:, : max(0, lo - j0)] = False
            ok[:, max(0, hi - j0) :] = False
            if self.query_lengths is not None:
                ok[max(0, qhi - i0) :, :] = False
            allowed[s] = ok
        if not allowed.any():
            return False
        if allowed.all():
            return None
        return allowed

    def _sequences(self) -> int:
        rows = [a.shape[0] for a in (self.q_offset, self.key_lengths, self.query_lengths) if a is not None]
        if self.segments is not None:
            rows.append(self.segments[0].shape[0])
        return max(rows, default=1)

    def structure(self) -> np.ndarray | None:
        """The structured parts as one array ``[S, n_q, n_k]`` (True = may attend; S = 1 or B), None if there are
        none. Refused above :data:`MAX_MASK_ELEMENTS` entries (:class:`~attnlab.errors.MemoryLimitError`)."""
        n_q, n_k = self._need_sizes()
        if not self.structured:
            return None
        _check_dense("MaskSpec", (self._sequences(), n_q, n_k))
        out = self.block(0, n_q, 0, n_k)
        if out is None:
            return np.ones((1, n_q, n_k), dtype=bool)
        if out is False:
            return np.zeros((self._sequences(), n_q, n_k), dtype=bool)
        return out

    def to_array(self, shape: tuple[int, ...] | None = None) -> Any:
        """The whole mask, True = may attend: the structure AND ``dense``, broadcast to the scores' ``shape``
        (``[..., n_q, n_k]``; default ``[S, n_q, n_k]``). Sequences run along the first axis of ``shape``. In
        ``dense``'s library when it has one (the structure joins it there), else NumPy."""
        n_q, n_k = self._need_sizes()
        s = self.structure()
        shape = tuple(shape) if shape is not None else (self._sequences(), n_q, n_k)
        if s is not None and len(shape) > 3:
            s = s.reshape((s.shape[0],) + (1,) * (len(shape) - 3) + (n_q, n_k))
        elif s is not None and len(shape) == 2:
            s = s[0]
        if self.dense is None:
            return np.broadcast_to(np.ones((n_q, n_k), dtype=bool) if s is None else s, shape)
        xp = namespace(dense=self.dense)
        if s is None:
            return xp.broadcast_to(self.dense, shape)
        s_x = s if xp is np else xp.asarray(s, device=_device(self.dense))
        return xp.broadcast_to(xp.logical_and(s_x, self.dense), shape)

    def empty_rows(self) -> np.ndarray:
        """``[S, n_q]``: True for the query rows of each sequence that may see no key at all (the structure; the
        dense part is not looked at)."""
        n_q, _ = self._need_sizes()
        seqs = self._sequences()
        out = np.zeros((seqs, n_q), dtype=bool)
        rows = np.arange(n_q)

        for s in range(seqs):
            lo, hi = _visible_keys(rows + self.shift(s), *self.reach, self.n_keys(s))
            lo, hi = np.broadcast_to(lo, (n_q,)), np.broadcast_to(hi, (n_q,))
            empty = hi <= lo
            if self.query_lengths is not None:
                empty |= rows >= int(self._row(self.query_lengths, s))
            if self.segments is not None:
                q_ids, k_ids = self.segments
                b = s if q_ids.shape[0] > 1 else 0
                for i in np.flatnonzero(~empty):
                    empty[i] = not (k_ids[b, lo[i] : hi[i]] == q_ids[b, i]).any()
            out[s] = empty
        return out

    def to_string(self, seq: int = 0, **kw: Any) -> str:
        """Draw sequence ``seq``'s mask (the structure, AND ``dense`` when it is ``[n_q, n_k]``) with
        :func:`to_string`."""
        n_q, n_k = self._need_sizes()
        s = self.structure()
        m = np.ones((n_q, n_k), dtype=bool) if s is None else s[seq if s.shape[0] > 1 else 0]
        if self.dense is not None:
            d = to_numpy(self.dense)
            while d.ndim > 2 and d.shape[0] == 1:
                d = d[0]
            if d.ndim == 2:
                m = m & d
        return to_string(m, **kw)
