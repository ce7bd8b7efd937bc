"""Dropout on attention weights (article 001 §18): ``Ã = A ∘ keep / (1 - p)``, then ``O = Ã V``.

Inverted dropout: kept weights are scaled by ``1 / (1 - p)`` at training time so nothing changes at evaluation
time, when dropout is off. The rows of ``Ã`` therefore need not sum to 1 (that is not a bug). The mask is drawn
from an explicit ``numpy.random.Generator`` and kept (:class:`Dropout`), so the backward pass uses the same one.

:func:`attnlab.multi_head_attention` does all of this with ``dropout_p=..., rng=..., training=True``; for single-head
attention the steps are explicit:

>>> from attnlab import attention_trace, attention_backward
>>> rng = np.random.default_rng(0)
>>> q, k, v = rng.standard_normal((3, 4, 2))
>>> t = attention_trace(q, k, v)
>>> drop = make_dropout(t.weights.shape, 0.5, rng)        # keep mask [n_q, n_k], drawn once
>>> out = apply_dropout(t.weights, drop) @ t.v             # O = (A ∘ keep / (1 - p)) V
>>> grads = attention_backward(t, np.ones_like(out), dropout=drop)   # the same mask in the backward
>>> bool((grads.dv == apply_dropout(t.weights, drop).T @ np.ones_like(out)).all())
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._arrays import device_of, namespace, shape_of
from ..errors import DTypeError, OptionError, ShapeError
from .inputs import as_array

__all__ = ["Dropout", "apply_dropout", "check_dropout_p", "dropout_multiplier", "make_dropout"]


@dataclass(frozen=True)
class Dropout:
    """One drawn dropout mask.

    Shapes: ``keep [..., n_q, n_k]`` boolean (NumPy), True where the weight is kept.

    ``p`` is the drop probability; kept weights are multiplied by ``1 / (1 - p)``.
    """

    p: float
    keep: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_dropout_p(self.p))
        if not isinstance(self.keep, np.ndarray) or self.keep.dtype != np.bool_:
            shown = self.keep.dtype if isinstance(self.keep, np.ndarray) else type(self.keep).__name__
            raise DTypeError(f"keep: expected a NumPy bool array (True = kept), got {shown}")

    @property
    def multiplier(self) -> np.ndarray:
        """``keep / (1 - p)`` as float64 ``[..., n_q, n_k]``: what each weight is multiplied by."""
        return self.keep / (1.0 - self.p)


def check_dropout_p(p: Any) -> float:
    """``p`` as a float in ``[0, 1)``, or an :class:`~attnlab.errors.OptionError` naming ``dropout_p``."""
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.floating, np.integer)):
        raise OptionError(f"dropout_p: expected a number in [0, 1), got {p!r}")
    p = float(p)
    if not (math.isfinite(p) and 0.0 <= p < 1.0):
        raise OptionError(f"dropout_p: expected 0 <= dropout_p < 1, got {p!r} (p = 1 would drop every weight)")
    return p


def make_dropout(shape: tuple[int, ...], p: float, rng: np.random.Generator | None) -> Dropout | None:
    """Draw a dropout mask of ``shape`` (each entry kept with probability ``1 - p``); ``None`` when ``p == 0``.

    >>> d = make_dropout((2, 3), 0.5, np.random.default_rng(0))
    >>> d.keep.shape, sorted(set(d.multiplier.ravel().tolist())) <= [0.0, 2.0]
    ((2, 3), True)
    """
    p = check_dropout_p(p)
    if p == 0.0:
        return None
    if not isinstance(rng, np.random.Generator):
        raise OptionError(
            f"rng: dropout_p={p} in training mode needs an explicit numpy.random.Generator "
            f"(rng=np.random.default_rng(seed)), got {rng!r}"
        )
    keep = rng.random(shape) >= p
    return Dropout(p=p, keep=keep)


def apply_dropout(weights: Any, dropout: Dropout | None) -> Any:
    """``weights ∘ keep / (1 - p)``, in the weights' library and dtype (``weights`` itself when ``None``).

    Shapes: ``weights [..., n_q, n_k]``; ``dropout.keep`` broadcastable to it.
    """
    if dropout is None:
        return weights
    weights = as_array(weights, "weights")
    return weights * dropout_multiplier(weights, dropout)


def dropout_multiplier(weights: Any, dropout: Dropout) -> Any:
    """``keep / (1 - p)`` in the weights' library, dtype and device, after checking that it broadcasts to them.

    Shapes: ``weights [..., n_q, n_k]``; the result as ``dropout.keep`` (broadcastable to the weights).
    """
    if not isinstance(dropout, Dropout):
        raise DTypeError(f"dropout: expected a Dropout (from make_dropout) or None, got {type(dropout).__name__}")
    weights = as_array(weights, "weights")
    xp = namespace(weights=weights)
    if not xp.isdtype(weights.dtype, "real floating"):
        raise DTypeError(f"weights: dtype {weights.dtype}; expected attention weights of a real floating dtype")
    try:
        np.broadcast_shapes(dropout.keep.shape, shape_of(weights))
    except ValueError:
        raise ShapeError(
            f"dropout: keep mask shape {dropout.keep.shape} does not broadcast to the weights' {shape_of(weights)}"
        ) from None
    m = dropout.multiplier
    if xp is np:
        return xp.asarray(m, dtype=weights.dtype)
    return xp.asarray(m, dtype=weights.dtype, device=device_of(weights))
