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

from .._arrays import device_of, namespace, shape_of
from ..errors import DTypeError, MaskedRowError, ShapeError
from .attention import AttentionTrace
from .dropout import Dropout, dropout_multiplier
from .inputs import check_finite

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
    """``d_out`` checked against the output's shape ``want`` and for NaN/inf, as an ``xp`` array next to ``like``."""
    if isinstance(d_out, (list, tuple)):
        d_out = np.asarray(d_out)
    if not hasattr(d_out, "shape") or shape_of(d_out) != want:
        got = shape_of(d_out) if hasattr(d_out, "shape") else type(d_out).__name__
        raise ShapeError(f"d_out: shape {got}, expected the output's shape {want} {legend}")
    if xp is not np and isinstance(d_out, np.ndarray):
        d_out = xp.asarray(d_out, device=device_of(like))
    check_finite(xp, d_out, "d_out")
    return d_out


def attention_backward(trace: AttentionTrace, d_out: Any, *, dropout: Dropout | None = None) -> AttentionGrads:
    """Gradients of attention for the upstream gradient ``d_out``, from the forward's :class:`AttentionTrace`.

    Args:
        trace: the forward pass, from :func:`~attnlab.attention_trace` (any mask, bias, causal, scale,
            temperature; ``masked_rows`` "raise" or "zero").
        d_out: ``dO = ∂L/∂O``, shaped like the output ``[..., n_q, d_v]``.
        dropout: the :class:`~attnlab.core.dropout.Dropout` the forward applied to the weights (the same mask),
            or ``None``.

    Returns:
        :class:`AttentionGrads` with ``dq``, ``dk``, ``dv``, ``dbias`` (``None`` without bias) and ``ds``.

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
    a = trace.weights  # [..., n_q, n_k]
    cdt = a.dtype
    d_o = xp.astype(d_out, cdt)  # [..., n_q, d_v]

    if dropout is not None:
        if not isinstance(dropout, Dropout):
            raise DTypeError(f"dropout: expected a Dropout (from the forward) or None, got {type(dropout).__name__}")
        mult = dropout_multiplier(a, dropout)  # keep / (1 - p), broadcastable to [..., n_q, n_k]
        a_drop = a * mult  # [..., n_q, n_k]
    else:
        mult = None
        a_drop = a

    d_v = xp.matrix_transpose(a_drop) @ d_o  # [..., n_k, d_v]
    d_p = d_o @ xp.matrix_transpose(trace.v)  # [..., n_q, n_k]  gradient w.r.t. the (dropped) weights
    if mult is not None:
        d_p = d_p * mult  # gradient w.r.t. A
    delta = xp.sum(d_p * a, axis=-1, keepdims=True)  # [..., n_q, 1]
    d_s = a * (d_p - delta)  # [..., n_q, n_k]; exactly 0 where A == 0 (masked)
    if trace.temperature != 1.0:
        d_s = d_s / trace.temperature
    d_scores = d_s * trace.scale
    d_q = d_scores @ trace.k  # [..., n_q, d_k]
    d_k = xp.matrix_transpose(d_scores) @ trace.q  # [..., n_k, d_k]
    d_bias = None if trace.bias is None else _sum_to(xp, d_s, shape_of(trace.bias))
    return AttentionGrads(
        dq=_sum_to(xp, d_q, shape_of(trace.q)),
        dk=_sum_to(xp, d_k, shape_of(trace.k)),
        dv=_sum_to(xp, d_v, shape_of(trace.v)),
        dbias=d_bias,
        ds=d_s,
    )
