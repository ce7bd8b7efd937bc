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

from typing import Any, Literal

import numpy as np

from ._arrays import namespace, shape_of, to_numpy
from .errors import DTypeError, MaskError, MemoryLimitError, NonFiniteError, OptionError, ShapeError
from .validate import check_float, check_int

__all__ = [
    "ALLOWED",
    "BLOCKED",
    "Align",
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
    "segments",
    "to_additive",
    "to_blocked",
    "to_string",
    "window",
    "zero_padded_queries",
]

ALLOWED = "■"
BLOCKED = "⬚"

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
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ShapeError(f"{name}: expected a positive int, got {n!r}")
    return int(n)


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


def _diagonal_shift(n_q: int, n_k: int, align: str | None, what: str) -> int:
    """How far right of the main diagonal query 0's own position sits (0 top-left, n_k - n_q bottom-right)."""
    if align is None:
        if n_q != n_k:
            raise MaskError(causal_alignment_message(n_q, n_k, what))
        return 0
    if align not in _ALIGNS:
        raise MaskError(f"align: expected 'top_left' or 'bottom_right', got {align!r}")
    return 0 if align == "top_left" else n_k - n_q


def causal_alignment_message(n_q: int, n_k: int, what: str = "causal") -> str:
    """The explanation given when a causal mask over ``n_q != n_k`` does not say how it is aligned."""
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
        f"  pass causal='top_left' or causal='bottom_right' (masks: align=...)"
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
    i = np.arange(n_q)[:, None]
    j = np.arange(n_k)[None, :]
    return j <= i + shift  # [n_q, n_k]


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
        if w is not None and (isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 0):
            raise MaskError(f"{name}: expected None or an int >= 0, got {w!r}")
    shift = _diagonal_shift(n_q, n_k, align, "window")
    _check_dense("window", (n_q, n_k))
    rel = np.arange(n_k)[None, :] - (np.arange(n_q)[:, None] + shift)  # [n_q, n_k], key minus query position
    ok = np.ones((n_q, n_k), dtype=bool)
    if left is not None:
        ok &= rel >= -left
    if right is not None:
        ok &= rel <= right
    return ok


def _lengths(lengths: Any, n: int, name: str) -> np.ndarray:
    lens = to_numpy(lengths)
    if lens.ndim != 1 or not (np.issubdtype(lens.dtype, np.integer) or lens.size == 0):
        raise ShapeError(f"lengths: expected a 1-D integer array [B], got shape {lens.shape} dtype {lens.dtype}")
    bad = np.flatnonzero((lens < 0) | (lens > n))
    if bad.size:
        raise ShapeError(f"lengths: entry {bad[0]} is {lens[bad[0]]}; expected 0 <= length <= {name}={n}")
    return lens.astype(np.int64)


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
    ok = np.arange(n_k)[None, :] < lens[:, None]  # [B, n_k]
    return ok.reshape((len(lens),) + (1,) * (ndim - 2) + (n_k,))


def query_padding(lengths: Any, n_q: int, *, ndim: int = 4) -> np.ndarray:
    """Which queries are real: ``[B, 1, n_q, 1]`` (or ``[B, n_q, 1]`` with ``ndim=3``), True for i < lengths[b].

    Combined with a key mask by ``&`` it makes padded query rows fully masked; with ``masked_rows="zero"`` their
    outputs are then exactly 0 (article 001 §7.1). Padded queries never hide keys from the real ones.
    """
    n_q = _check_len("n_q", n_q)
    lens = _lengths(lengths, n_q, "n_q")
    ndim = check_int("ndim", ndim, minimum=3)
    ok = np.arange(n_q)[None, :] < lens[:, None]  # [B, n_q]
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
    return qs[..., :, None] == ks[..., None, :]  # [..., n_q, n_k]


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
