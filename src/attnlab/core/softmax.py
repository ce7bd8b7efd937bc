"""Numerically stable softmax and its masked form, written against the array API standard.

Each function takes real floating or integer arrays of any array library, computes float16/bfloat16/float32 in
float32 and everything else in float64 (as the attention core does), and returns the input's floating dtype
(float64 for integers). They never return NaN for finite inputs: NaN and ``+inf`` inputs are refused by name
(:class:`~attnlab.errors.NonFiniteError`); ``-inf`` is a logit whose weight is exactly 0, but a row of nothing
else has no softmax (in :func:`masked_softmax` a row with no allowed entry is a policy, not an error).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._arrays import compute_dtype, device_of, namespace, shape_of, to_numpy
from ..errors import DTypeError, NonFiniteError, OptionError, RangeError, ShapeError
from ..validate import check_int
from .inputs import as_array, cast_checked

__all__ = ["log_softmax", "masked_softmax", "softmax"]


def _prepare(x: Any, name: str, axis: Any) -> tuple[Any, Any, Any, int]:
    """``x`` in its compute dtype, with its namespace, output dtype and the axis as a non-negative int."""
    x = as_array(x, name)
    xp = namespace(**{name: x})
    cdt, out_dtype = compute_dtype(xp, x.dtype, name)
    s = shape_of(x)
    if len(s) == 0:
        raise ShapeError(f"{name}: a 0-d array has no axis to take a softmax over; expected at least 1 dim")
    a = check_int("axis", axis)
    if not -len(s) <= a < len(s):
        raise OptionError(f"axis: expected an int in [{-len(s)}, {len(s) - 1}] for {name} of shape {s}, got {a}")
    a %= len(s)
    if s[a] == 0:
        raise ShapeError(f"{name}: axis {a} of shape {s} is empty; softmax needs at least one entry")
    return xp, xp.astype(x, cdt, copy=False), out_dtype, a


def _check_max(xp: Any, m: Any, has_entry: Any | None, name: str, what: str) -> None:
    """Refuse NaN, ``+inf`` and rows whose every (allowed) entry is ``-inf``, from the row maxima ``m``."""
    ok = xp.isfinite(m)
    if has_entry is not None:
        ok = xp.logical_or(ok, xp.logical_not(has_entry))
    if bool(xp.all(ok)):
        return
    mn = to_numpy(m)
    bad = ~np.isfinite(mn) if has_entry is None else ~np.isfinite(mn) & to_numpy(has_entry)
    row = tuple(int(i) for i in np.argwhere(bad)[0])
    value = mn[row]
    if np.isnan(value):
        problem = "holds NaN"
    elif value > 0:
        problem = "holds +inf"
    else:
        problem = f"has -inf at every {what}entry, so its softmax is undefined"
    raise NonFiniteError(
        f"{name}: the row at index {row} (keepdims layout of shape {mn.shape}) {problem}; softmax needs finite "
        f"logits (-inf only where others are finite); to leave keys out use masked_softmax(logits, allowed) or "
        f"mask= in attention"
    )


def softmax(x: Any, axis: int = -1) -> Any:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``: the row maximum is subtracted so nothing overflows.

    Shapes: ``x [...]`` -> the same shape.

    >>> import numpy as np
    >>> softmax(np.array([1.0, 2.0])).round(3)
    array([0.269, 0.731])
    >>> softmax(np.array([1e4, 0.0])).tolist()  # naive exp(1e4) would overflow
    [1.0, 0.0]
    >>> softmax(np.array([1e308, -1e308])).tolist()  # x - max is -inf: a weight of exactly 0
    [1.0, 0.0]
    """
    xp, x, out_dtype, axis = _prepare(x, "x", axis)
    with np.errstate(over="ignore"):  # x - max may overflow to -inf: its weight is 0, as exp of it would be
        m = xp.max(x, axis=axis, keepdims=True)
        _check_max(xp, m, None, "x", "")
        e = xp.exp(x - m)
        return xp.astype(e / xp.sum(e, axis=axis, keepdims=True), out_dtype)


def log_softmax(x: Any, axis: int = -1) -> Any:
    """``x - logsumexp(x)`` along ``axis``, stably.

    Shapes: ``x [...]`` -> the same shape. A finite ``x`` whose log-probability is below the dtype's most
    negative number (``log_softmax([1e308, -1e308])``) is a :class:`~attnlab.errors.RangeError`, not ``-inf``.

    >>> log_softmax([0.0, 0.0]).round(4).tolist()
    [-0.6931, -0.6931]
    """
    xp, x, out_dtype, axis = _prepare(x, "x", axis)
    with np.errstate(over="ignore"):
        m = xp.max(x, axis=axis, keepdims=True)
        _check_max(xp, m, None, "x", "")
        y = x - m - xp.log(xp.sum(xp.exp(x - m), axis=axis, keepdims=True))
    lost = xp.logical_and(xp.isfinite(x), xp.logical_not(xp.isfinite(y)))
    if bool(xp.any(lost)):
        where = tuple(int(i) for i in np.argwhere(to_numpy(lost))[0])
        row_max = float(to_numpy(m)[(*where[:axis], 0, *where[axis + 1 :])])
        dtype = str(y.dtype).replace("torch.", "")
        raise RangeError(
            f"x: log_softmax at index {where} is below the most negative {dtype} ({float(xp.finfo(y.dtype).min):.7g}):"
            f" x there is {float(to_numpy(x)[where]):.7g} and its row's largest entry {row_max:.7g}, further apart "
            f"than {dtype} can hold; scale x down"
        )
    return cast_checked(xp, y, out_dtype, "log_softmax(x)")


def masked_softmax(logits: Any, allowed: Any) -> tuple[Any, Any, Any]:
    """Softmax over the last axis restricted to ``allowed`` entries; rows with nothing allowed come out as 0.

    Args:
        logits: ``[..., n_k]`` real scores (their values at disallowed entries are ignored, even NaN).
        allowed: ``[..., n_k]`` boolean, True = may attend; broadcastable to ``logits`` (a NumPy mask goes with
            any library's logits).

    Returns:
        ``(weights, lse, empty)``: weights ``[..., n_k]`` (exactly 0 where not allowed, all 0 on empty rows),
        the row log-sum-exp ``lse [...]`` over allowed entries (``-inf`` on empty rows), and ``empty [...]``,
        True for rows with no allowed entry. What empty rows finally become is the caller's policy. All in the
        compute dtype (float32 for float32 and lower precisions, float64 otherwise).

    NaN or ``+inf`` at an allowed entry, or a row whose allowed entries are all ``-inf``, is a
    :class:`~attnlab.errors.NonFiniteError`.

    >>> w, lse, empty = masked_softmax([[1e308, -1e308, 0.0]], [[True, True, False]])
    >>> w.tolist(), empty.tolist()
    ([[1.0, 0.0, 0.0]], [False])
    """
    logits = as_array(logits, "logits")
    allowed = as_array(allowed, "allowed")
    xp = namespace(logits=logits)
    cdt, _ = compute_dtype(xp, logits.dtype, "logits")
    namespace(allowed=allowed)
    if isinstance(allowed, np.ndarray) and xp is not np:
        allowed = xp.asarray(allowed, device=device_of(logits))
    else:
        namespace(logits=logits, allowed=allowed)
    if not xp.isdtype(allowed.dtype, "bool"):
        raise DTypeError(f"allowed: dtype {allowed.dtype}; expected a bool mask (True = may attend)")
    ls, als = shape_of(logits), shape_of(allowed)
    try:
        full = tuple(np.broadcast_shapes(ls, als))
    except ValueError:
        full = None
    if full != ls or len(ls) == 0 or ls[-1] == 0:
        raise ShapeError(
            f"allowed: shape {als} does not broadcast to the logits' shape {ls} [..., n_k] (n_k >= 1, never grown)"
        )
    logits = xp.astype(logits, cdt, copy=False)
    neg_inf = xp.asarray(-float("inf"), dtype=cdt)
    with np.errstate(over="ignore", invalid="ignore"):
        masked = xp.where(allowed, logits, neg_inf)  # [..., n_k]
        m = xp.max(masked, axis=-1, keepdims=True)  # [..., 1]
        empty = m == neg_inf  # [..., 1]: no allowed entry, or (refused below) only -inf ones
        if bool(xp.any(empty)):
            empty = xp.logical_not(xp.any(xp.broadcast_to(allowed, ls), axis=-1, keepdims=True))
        _check_max(xp, m, xp.logical_not(empty), "logits", "allowed ")
        m = xp.where(empty, xp.zeros_like(m), m)
        e = xp.exp(masked - m)  # exp(-inf) = 0 exactly at disallowed entries
        l = xp.sum(e, axis=-1, keepdims=True)
        safe_l = xp.where(empty, xp.ones_like(l), l)
        weights = e / safe_l
        lse = xp.where(empty, xp.full_like(m, -float("inf")), m + xp.log(safe_l))
    return weights, lse[..., 0], empty[..., 0]
