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

from ._arrays import index_tuples, to_numpy

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


def _tolerance(dtype: np.dtype) -> float:
    """Row-sum and O = AV tolerance per unit, for values stored in ``dtype`` (64 ulps; scaled by sqrt(n_k))."""
    eps = float(np.finfo(dtype).eps) if np.issubdtype(dtype, np.floating) else 2.0**-52
    return 64 * eps


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
    qn, kn, vn = (to_numpy(x) for x in (q, k, v))
    a = to_numpy(weights)
    o = to_numpy(output)
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
    tol = _tolerance(a.dtype)
    ok = np.ones(a.shape, dtype=bool) if allowed is None else np.broadcast_to(to_numpy(allowed), a.shape)
    live = ok.any(axis=-1)  # [..., n_q]: rows that may attend somewhere
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
            tol_o = max(tol, _tolerance(o.dtype)) * scale * max(1.0, np.sqrt(n_k))
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
    """Check the §21 invariants on an :class:`~attnlab.AttentionTrace`; an empty list means all hold."""
    return check_arrays(trace.q, trace.k, trace.v, trace.weights, trace.output, trace.allowed)
