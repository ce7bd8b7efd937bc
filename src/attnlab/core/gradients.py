"""The analytic backward pass of scaled dot-product attention (article 001 §9).

Forward (what :func:`~attnlab.attention_trace` records): ``S = (Q Kᵀ · scale + bias) / temperature`` with masked
entries removed, ``A = softmax(S)`` row by row, optionally ``Ã = A ∘ keep / (1 - p)`` (dropout), ``O = Ã V``.
Given ``dO = ∂L/∂O`` the backward is, in FlashAttention's vocabulary:

* ``dV = Ãᵀ dO``;
* ``dP = (dO Vᵀ) ∘ keep / (1 - p)``, the gradient with respect to ``A`` (``G_A = G_O Vᵀ`` without dropout);
* ``delta = rowsum(dP ∘ A)`` and ``dS = A ∘ (dP - delta)``, the softmax Jacobian ``g_s = a ∘ (g_a - (g_a·a) 1)``;
* ``dQ = dS K · scale`` and ``dK = dSᵀ Q · scale`` (``scale = 1/sqrt(d_k)``), ``dBias = dS``.

``dS`` is exactly 0 wherever ``A`` is 0, so masked entries and fully masked rows (``masked_rows="zero"``) pass
exactly zero gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._arrays import compute_dtype, device_of, namespace, shape_of
from ..errors import DTypeError, MaskedRowError, RangeError, ShapeError
from .attention import AttentionTrace
from .dropout import Dropout, dropout_multiplier
from .inputs import as_array, cast_checked, check_finite, max_abs

__all__ = ["AttentionGrads", "attention_backward"]


@dataclass(frozen=True)
class AttentionGrads:
    """Gradients of a scalar loss with respect to the inputs of one attention computation.

    Shapes (each as its input's shape in the trace; broadcast inputs get their gradient summed back):

    * ``dq [..., n_q, d_k]``, ``dk [..., n_k, d_k]``, ``dv [..., n_k, d_v]``;
    * ``dbias``: as the trace's ``bias`` (``None`` when there was no bias);
    * ``ds [..., n_q, n_k]``: the gradient with respect to ``Q Kᵀ · scale + bias`` (FlashAttention's ``dS``).

    All in the trace's compute dtype (float64, or float32 for lower precisions).
    """

    dq: Any
    dk: Any
    dv: Any
    dbias: Any | None
    ds: Any


def _sum_to(xp: Any, x: Any, shape: tuple[int, ...]) -> Any:
    """Sum ``x`` over the axes along which an input of ``shape`` was broadcast (the adjoint of broadcasting)."""
    s = shape_of(x)
    extra = len(s) - len(shape)
    if extra > 0:
        x = xp.sum(x, axis=tuple(range(extra)))
    axes = tuple(i for i, (a, b) in enumerate(zip(shape_of(x), shape, strict=True)) if b == 1 and a != 1)
    if axes:
        x = xp.sum(x, axis=axes, keepdims=True)
    return x


def upstream_gradient(xp: Any, d_out: Any, want: tuple[int, ...], legend: str, like: Any) -> Any:
    """``d_out`` checked against the output's shape ``want`` and for NaN/inf, as an ``xp`` array next to ``like``.

    A NumPy ``d_out`` goes with any library's forward; another library's must be the forward's.
    """
    d_out = as_array(d_out, "d_out")
    own = namespace(d_out=d_out)  # non-arrays, masked arrays, meta tensors
    if not isinstance(d_out, np.ndarray):
        namespace(forward=like, d_out=d_out)
    if shape_of(d_out) != want:
        raise ShapeError(f"d_out: shape {shape_of(d_out)}, expected the output's shape {want} {legend}")
    compute_dtype(own, d_out.dtype, "d_out")
    if xp is not np and isinstance(d_out, np.ndarray):
        d_out = xp.asarray(d_out, device=device_of(like))
    check_finite(xp, d_out, "d_out")
    return d_out


def _grads(trace: AttentionTrace, d_out: Any, dropout: Dropout | None, cdt: Any) -> tuple[Any, ...]:
    """``(dq, dk, dv, dbias, ds)`` computed in ``cdt`` (the trace's arrays converted to it)."""
    xp = namespace(trace.q)
    a = xp.astype(trace.weights, cdt)  # [..., n_q, n_k]
    d_o = xp.astype(d_out, cdt)  # [..., n_q, d_v]
    q, k, v = (xp.astype(x, cdt) for x in (trace.q, trace.k, trace.v))
    if dropout is not None:
        mult = dropout_multiplier(a, dropout)  # keep / (1 - p), broadcastable to [..., n_q, n_k]
        a_drop = a * mult  # [..., n_q, n_k]
    else:
        mult = None
        a_drop = a

    d_v = xp.matrix_transpose(a_drop) @ d_o  # [..., n_k, d_v]
    d_p = d_o @ xp.matrix_transpose(v)  # [..., n_q, n_k]  gradient w.r.t. the (dropped) weights
    if mult is not None:
        d_p = d_p * mult  # gradient w.r.t. A
    delta = xp.sum(d_p * a, axis=-1, keepdims=True)  # [..., n_q, 1]
    d_s = a * (d_p - delta)  # [..., n_q, n_k]; exactly 0 where A == 0 (masked)
    if trace.temperature != 1.0:
        d_s = d_s / trace.temperature
    d_scores = d_s * trace.scale
    d_q = d_scores @ k  # [..., n_q, d_k]
    d_k = xp.matrix_transpose(d_scores) @ q  # [..., n_k, d_k]
    d_bias = None if trace.bias is None else _sum_to(xp, d_s, shape_of(trace.bias))
    return (
        _sum_to(xp, d_q, shape_of(trace.q)),
        _sum_to(xp, d_k, shape_of(trace.k)),
        _sum_to(xp, d_v, shape_of(trace.v)),
        d_bias,
        d_s,
    )


_GRAD_NAMES = ("dq", "dk", "dv", "dbias", "ds")


def _first_overflow(xp: Any, grads: tuple[Any, ...]) -> str | None:
    for name, g in zip(_GRAD_NAMES, grads, strict=True):
        if g is not None and not bool(xp.all(xp.isfinite(g))):
            return name
    return None


def attention_backward(trace: AttentionTrace, d_out: Any, *, dropout: Dropout | None = None) -> AttentionGrads:
    """Gradients of attention for the upstream gradient ``d_out``, from the forward's :class:`AttentionTrace`.

    Args:
        trace: the forward pass, from :func:`~attnlab.attention_trace` (any mask, bias, causal, scale,
            temperature; ``masked_rows`` "raise" or "zero").
        d_out: ``dO = ∂L/∂O``, shaped like the output ``[..., n_q, d_v]``.
        dropout: the :class:`~attnlab.core.dropout.Dropout` the forward applied to the weights (the same mask),
            or ``None``.

    Returns:
        :class:`AttentionGrads` with ``dq``, ``dk``, ``dv``, ``dbias`` (``None`` without bias) and ``ds``, in the
        trace's compute dtype. A float32 backward whose intermediates overflow (``dO Vᵀ`` beyond 3.4e38) is redone
        in float64 and converted back; a gradient that float32 (or, computed in float64, float64) cannot hold
        is a :class:`~attnlab.errors.RangeError` naming it.

    Shapes: ``q [..., n_q, d_k]``, ``k [..., n_k, d_k]``, ``v [..., n_k, d_v]``, ``d_out [..., n_q, d_v]``.

    The articles' 2×2 example with ``L = sum(O)``: ``dV`` holds each key's column sum of the weights.

    >>> from attnlab import attention_trace
    >>> t = attention_trace([[1, 0], [0, 1]], [[1, 0], [0, 1]], [[10, 0], [0, 20]])
    >>> g = attention_backward(t, np.ones((2, 2)))
    >>> g.dv.round(4).tolist()
    [[1.0, 1.0], [1.0, 1.0]]
    >>> g.dq.round(4).tolist()
    [[-1.564, 1.564], [-1.564, 1.564]]
    """
    if not isinstance(trace, AttentionTrace):
        raise DTypeError(
            f"trace: expected an AttentionTrace (from attnlab.attention_trace), got {type(trace).__name__}"
        )
    if trace.policy == "nan" and trace.masked_rows:
        raise MaskedRowError(
            f"trace: {len(trace.masked_rows)} fully masked row(s) were made NaN (masked_rows='nan'), so their "
            f"gradient is undefined; run the forward with masked_rows='zero' (zero output, zero gradient)",
            trace.masked_rows,
        )
    xp = namespace(trace.q)
    d_out = upstream_gradient(xp, d_out, shape_of(trace.output), "[..., n_q, d_v]", trace.q)
    if dropout is not None and not isinstance(dropout, Dropout):
        raise DTypeError(f"dropout: expected a Dropout (from the forward) or None, got {type(dropout).__name__}")
    cdt = trace.weights.dtype
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked for below, and explained
        grads = _grads(trace, d_out, dropout, cdt)
        bad = _first_overflow(xp, grads)
        if bad is not None and cdt != xp.float64:
            wide = _grads(trace, d_out, dropout, xp.float64)
            bad = _first_overflow(xp, wide)
            if bad is None:
                grads = tuple(
                    None if g is None else cast_checked(xp, g, cdt, n) for n, g in zip(_GRAD_NAMES, wide, strict=True)
                )
    if bad is not None:
        dt = str(cdt).replace("torch.", "")
        note = f" (the {dt} trace was recomputed in float64)" if cdt != xp.float64 else ""
        raise RangeError(
            f"{bad}: the attention gradient overflows float64 (largest finite {np.finfo(np.float64).max:.7g}){note} "
            f"from finite inputs: max |d_out| {max_abs(xp, d_out):.7g}, max |q| {max_abs(xp, trace.q):.7g}, "
            f"max |k| {max_abs(xp, trace.k):.7g}, max |v| {max_abs(xp, trace.v):.7g}, scale {trace.scale:.7g}, "
            f"temperature {trace.temperature:.7g}; scale d_out (the loss) or the inputs down"
        )
    dq, dk, dv, dbias, ds = grads
    return AttentionGrads(dq=dq, dk=dk, dv=dv, dbias=dbias, ds=ds)
