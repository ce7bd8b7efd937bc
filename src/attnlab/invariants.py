"""The invariants every attention implementation keeps (article 001 §21), checked on concrete arrays.

* ``scores-shape``: ``shape(Q Kᵀ) = [..., n_q, n_k]`` (the weights have that shape);
* ``d_k-match``: ``d_k(Q) = d_k(K)``; ``n_k-match``: ``n_k(K) = n_k(V)``;
* ``masked-weight``: a weight is exactly 0 wherever the mask forbids attending;
* ``row-sum``: each query row that may attend to at least one key sums to 1;
* ``output-av``: ``O = A V``.

>>> from attnlab import attention_trace
>>> check(attention_trace([[1, 0], [0, 1]], [[1, 0], [0, 1]], [[10, 0], [0, 20]], causal=True))
[]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._arrays import index_tuples, namespace, to_numpy
from .errors import DTypeError, NonFiniteError, ShapeError

__all__ = ["Violation", "check", "check_arrays"]

_MAX_POSITIONS = 16


@dataclass(frozen=True)
class Violation:
    """One broken invariant: its ``name``, a sentence, and (up to 16 of) the offending index tuples."""

    name: str
    message: str
    positions: tuple[tuple[int, ...], ...] = ()


def _positions(bad: np.ndarray) -> tuple[tuple[int, ...], ...]:
    return index_tuples(bad, _MAX_POSITIONS)


def _tolerance(dtype: np.dtype, source: Any = None) -> float:
    """Row-sum and O = AV tolerance per unit, for values stored in ``dtype`` (64 ulps; scaled by sqrt(n_k)).

    ``source`` is the caller's array: a bfloat16 one (float32 once converted to NumPy) has 8 bits.
    """
    if "bfloat16" in str(getattr(source, "dtype", "")):
        return 64 * 2.0**-8
    eps = float(np.finfo(dtype).eps) if np.issubdtype(dtype, np.floating) else 2.0**-52
    return 64 * eps


def _as_checked(x: Any, name: str, *, finite: bool = False) -> np.ndarray:
    """``x`` (any array library, or nested lists) as a NumPy array of at least 2 dims and a real dtype."""
    if x is None:
        raise DTypeError(f"{name}: expected an array, got None")
    if isinstance(x, (list, tuple)):
        try:
            x = np.asarray(x)
        except (ValueError, TypeError):
            raise ShapeError(f"{name}: nested lists of unequal lengths do not form an array") from None
    namespace(**{name: x})  # non-arrays, masked arrays and meta tensors are refused by name
    a = to_numpy(x)
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_):
        raise DTypeError(f"{name}: dtype {a.dtype} is not supported; expected a real floating or integer dtype")
    if a.ndim < 2:
        raise ShapeError(f"{name}: expected at least 2 dims [..., rows, cols], got shape {a.shape}")
    if finite and not np.isfinite(a).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        raise NonFiniteError(f"{name}: holds {a[where]} at index {where}; the inputs of a checked call must be finite")
    return a


def _allowed(allowed: Any, shape: tuple[int, ...]) -> np.ndarray:
    if isinstance(allowed, (list, tuple)):
        allowed = np.asarray(allowed)
    namespace(allowed=allowed)
    m = to_numpy(allowed)
    if m.dtype != np.bool_:
        raise DTypeError(f"allowed: dtype {m.dtype}; expected a bool mask (True = may attend), see attnlab.masks")
    try:
        return np.broadcast_to(m, shape)
    except ValueError:
        raise ShapeError(f"allowed: shape {m.shape} does not broadcast to the weights' shape {shape}") from None


def check_arrays(
    q: Any,
    k: Any,
    v: Any,
    weights: Any,
    output: Any,
    allowed: Any | None = None,
) -> list[Violation]:
    """Check the §21 invariants on the arrays of one attention call (any array library).

    Args:
        q: ``[..., n_q, d_k]``; k: ``[..., n_k, d_k]``; v: ``[..., n_k, d_v]``.
        weights: the attention weights ``[..., n_q, n_k]`` the implementation produced.
        output: its output ``[..., n_q, d_v]``.
        allowed: the boolean mask it was given (True = may attend), broadcastable to the weights; None = all.

    Returns:
        the violated invariants, empty when all hold. Rows with no allowed key are exempt from ``row-sum``
        and ``masked-weight`` (their treatment is a policy, checked elsewhere).
    """
    qn, kn, vn = (_as_checked(x, n, finite=True) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    a = _as_checked(weights, "weights")
    o = _as_checked(output, "output")
    tol_a, tol_out = _tolerance(a.dtype, weights), _tolerance(o.dtype, output)
    out: list[Violation] = []
    if kn.shape[-1] != qn.shape[-1]:
        out.append(Violation("d_k-match", f"d_k(Q)={qn.shape[-1]} but d_k(K)={kn.shape[-1]}"))
    if vn.shape[-2] != kn.shape[-2]:
        out.append(Violation("n_k-match", f"n_k(K)={kn.shape[-2]} but n_k(V)={vn.shape[-2]}"))
    n_q, n_k = qn.shape[-2], kn.shape[-2]
    if a.shape[-2:] != (n_q, n_k):
        out.append(Violation("scores-shape", f"weights have shape {a.shape}; expected [..., n_q={n_q}, n_k={n_k}]"))
    if out:  # the value checks below need consistent shapes
        return out
    tol = tol_a
    ok = np.ones(a.shape, dtype=bool) if allowed is None else _allowed(allowed, a.shape)
    live = np.asarray(ok.any(axis=-1))  # [..., n_q]: rows that may attend somewhere
    leaked = (~ok) & (a != 0) & live[..., None]
    if leaked.any():
        worst = float(np.nanmax(np.abs(np.where(leaked, a, 0.0))))
        out.append(
            Violation(
                "masked-weight",
                f"{int(leaked.sum())} weight(s) are not exactly 0 where the mask forbids attending (max {worst:.3g})",
                _positions(leaked),
            )
        )
    sums = a.astype(np.float64).sum(axis=-1)  # [..., n_q]
    off = live & ~(np.abs(sums - 1.0) <= tol * max(1.0, np.sqrt(n_k)))
    if off.any():
        worst = sums[off][np.argmax(np.abs(sums[off] - 1.0))]
        out.append(
            Violation("row-sum", f"{int(off.sum())} valid row(s) do not sum to 1 (e.g. {worst:.6g})", _positions(off))
        )
    if vn.shape[-1] == o.shape[-1] and o.shape[-2] == n_q:
        av = a.astype(np.float64) @ vn.astype(np.float64)  # [..., n_q, d_v]
        scale = max(1.0, float(np.max(np.abs(vn)))) if vn.size else 1.0
        o64 = o.astype(np.float64)
        try:
            diff = np.abs(np.broadcast_to(o64, np.broadcast_shapes(o64.shape, av.shape)) - av)
        except ValueError:
            diff = None
        if diff is None:
            out.append(Violation("output-av", f"output shape {o.shape} does not match A V's {av.shape}"))
        else:
            tol_o = max(tol, tol_out) * scale * max(1.0, np.sqrt(n_k))
            bad = live[..., None] & ~(diff <= tol_o)
            if bad.any():
                out.append(
                    Violation(
                        "output-av",
                        f"output differs from weights @ v by up to {float(np.nanmax(np.where(bad, diff, 0))):.3g}",
                        _positions(bad),
                    )
                )
    else:
        out.append(Violation("output-av", f"output shape {o.shape}; expected [..., n_q={n_q}, d_v={vn.shape[-1]}]"))
    return out


def check(trace: Any) -> list[Violation]:
    """Check the §21 invariants on an :class:`~attnlab.AttentionTrace`; an empty list means all hold.

    Anything but an ``AttentionTrace`` is a :class:`~attnlab.errors.DTypeError` (arrays go to
    :func:`check_arrays`).
    """
    from .core.attention import AttentionTrace

    if not isinstance(trace, AttentionTrace):
        raise DTypeError(
            f"trace: expected an AttentionTrace (from attnlab.attention_trace), got {type(trace).__name__}; "
            f"for the arrays of another implementation use invariants.check_arrays(q, k, v, weights, output, allowed)"
        )
    return check_arrays(trace.q, trace.k, trace.v, trace.weights, trace.output, trace.allowed)
