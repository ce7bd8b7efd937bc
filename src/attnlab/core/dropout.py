"""Dropout on attention weights (article 001 §18): ``Ã = A ∘ keep / (1 - p)``, then ``O = Ã V``.

Inverted dropout: kept weights are scaled by ``1 / (1 - p)`` at training time so nothing changes at evaluation
time, when dropout is off, and ``E[Ã] = A`` entry by entry. The rows of ``Ã`` therefore need not sum to 1 (that is
not a bug). The mask is drawn from an explicit ``numpy.random.Generator`` (or seed) and kept (:class:`Dropout`), so
the backward pass uses the same one.

:func:`attnlab.multi_head_attention` does all of this with ``dropout_p=..., rng=..., training=True``; for single-head
attention :func:`attnlab.dropout` is the one step, and its mask goes to the backward:

>>> import attnlab
>>> rng = np.random.default_rng(0)
>>> q, k, v = rng.standard_normal((3, 4, 2))
>>> t = attnlab.attention_trace(q, k, v)
>>> d = attnlab.dropout(t.weights, 0.5, rng=rng)           # keep mask [n_q, n_k] drawn once, kept in d.dropout
>>> out = d.output @ t.v                                  # O = (A ∘ keep / (1 - p)) V
>>> grads = attnlab.attention_backward(t, np.ones_like(out), dropout=d.dropout)   # the same mask in the backward
>>> bool((grads.dv == d.output.T @ np.ones_like(out)).all())
True
>>> again = attnlab.dropout(t.weights, 0.5, keep=d.dropout.keep)   # an explicit mask reproduces it exactly
>>> bool((again.output == d.output).all())
True

The lower-level steps are :func:`make_dropout` (draw a :class:`Dropout`) and :func:`apply_dropout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._arrays import compute_dtype, device_of, namespace, shape_of, to_numpy
from ..errors import DTypeError, OptionError, ShapeError
from ..validate import check_float
from .inputs import as_array

__all__ = ["Dropout", "DropoutResult", "apply_dropout", "check_p", "dropout", "dropout_multiplier", "make_dropout"]


def check_p(p: Any, name: str = "dropout_p") -> float:
    """``p`` as a float in ``[0, 1)``, or :class:`~attnlab.errors.OptionError` naming ``name`` (``p = 1`` included).

    >>> check_p(0.1)
    0.1
    >>> check_p(1, "p")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    attnlab.errors.OptionError: p: expected a number with 0 <= p < 1, got 1 (p = 1 would drop every weight ...)
    """
    want = f"{name}: expected a number with 0 <= {name} < 1"
    try:
        x = check_float(name, p, minimum=0.0, maximum=1.0)
    except OptionError:
        raise OptionError(f"{want}, got {p!r}") from None
    if x == 1.0:
        raise OptionError(f"{want}, got {p!r} (p = 1 would drop every weight and divide by 1 - p = 0)")
    return x


@dataclass(frozen=True)
class Dropout:
    """One drawn dropout mask.

    Shapes: ``keep [..., n_q, n_k]`` boolean (NumPy), True where the weight is kept.

    ``p`` is the drop probability, in ``[0, 1)``; kept weights are multiplied by ``1 / (1 - p)``. Construction
    checks both (``p = 1`` would divide by zero).
    """

    p: float
    keep: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_p(self.p, "p"))
        keep = self.keep
        if not isinstance(keep, np.ndarray) or keep.dtype != np.bool_:
            shown = keep.dtype if isinstance(keep, np.ndarray) else type(keep).__name__
            raise DTypeError(f"keep: expected a boolean NumPy array (True = kept), got {shown}")

    @property
    def multiplier(self) -> np.ndarray:
        """``keep / (1 - p)`` as float64 ``[..., n_q, n_k]``: what each weight is multiplied by."""
        return self.keep / (1.0 - self.p)


def _generator(rng: Any, p: float) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, (bool, np.bool_)) and rng >= 0:
        return np.random.default_rng(int(rng))
    raise DTypeError(
        f"rng: dropout with p={p} needs an explicit numpy.random.Generator (rng=np.random.default_rng(seed)) or an "
        f"int seed >= 0, got {rng!r}"
    )


def make_dropout(shape: tuple[int, ...], p: float, rng: np.random.Generator | None) -> Dropout | None:
    """Draw a dropout mask of ``shape`` (each entry kept with probability ``1 - p``); ``None`` when ``p == 0``.

    ``keep = rng.random(shape) >= p``: the same generator state gives the same mask.

    >>> d = make_dropout((2, 3), 0.5, np.random.default_rng(0))
    >>> d.keep.shape, sorted(set(d.multiplier.ravel().tolist())) <= [0.0, 2.0]
    ((2, 3), True)
    """
    p = check_p(p)
    if p == 0.0:
        return None
    if not isinstance(rng, np.random.Generator):
        raise OptionError(
            f"rng: dropout_p={p} in training mode needs an explicit numpy.random.Generator "
            f"(rng=np.random.default_rng(seed)), got {rng!r}"
        )
    keep = rng.random(shape) >= p
    return Dropout(p=p, keep=keep)


@dataclass(frozen=True)
class DropoutResult:
    """What :func:`dropout` returns.

    Shapes:
        * ``output [..., n_q, n_k]``: ``weights ∘ keep / (1 - p)``, in the weights' library, dtype and device;
        * ``dropout``: the :class:`Dropout` applied (``keep`` broadcastable to the weights), for
          :func:`attnlab.attention_backward` (``dropout=``) or another :func:`dropout` call (``keep=``); ``None``
          when nothing was dropped (``p == 0`` without a mask).
    """

    output: Any
    dropout: Dropout | None


def dropout(weights: Any, p: float, *, rng: Any = None, keep: Any = None) -> DropoutResult:
    """Inverted dropout on attention weights: ``Ã = weights ∘ keep / (1 - p)``, the mask drawn or given.

    Each weight is kept with probability ``1 - p`` and then scaled by ``1 / (1 - p)``, so ``E[Ã] = weights``
    (the expectation over masks is the weights themselves) and evaluation needs no rescaling. Dropped weights are
    exactly 0, and so are masked ones (0 times anything). Call it only in training; the inputs are not modified.

    Args:
        weights: attention weights ``[..., n_q, n_k]`` (NumPy, PyTorch, any array-API array, or nested lists;
            integers are promoted to float64 as in the core).
        p: drop probability, ``0 <= p < 1``.
        rng: where the mask comes from: a ``numpy.random.Generator`` or an int seed
            (``np.random.default_rng(seed)``). The mask is ``rng.random(weights.shape) >= p``, the draw
            :func:`attnlab.multi_head_attention` makes for the same shape. Required when ``p > 0`` and no ``keep``.
        keep: instead of ``rng``, an explicit boolean mask broadcastable to the weights (True = kept), or a
            :class:`Dropout` from an earlier call (its ``p`` must equal ``p``): the same mask gives the same result.

    Returns:
        a :class:`DropoutResult` (``.output``, ``.dropout``).

    Raises:
        OptionError: ``p`` outside ``[0, 1)`` (``p = 1`` would divide by zero), or both ``rng`` and ``keep``.
        DTypeError: no ``rng`` (or a wrong one) where a mask must be drawn; a ``keep`` that is not boolean.
        ShapeError: a ``keep`` that does not broadcast to the weights.

    >>> a = np.full((2, 4), 0.25)
    >>> d = dropout(a, 0.5, rng=0)
    >>> d.output
    array([[0.5, 0. , 0. , 0. ],
           [0.5, 0.5, 0.5, 0.5]])
    >>> d.dropout.keep.tolist()[0], float(d.output.mean())   # kept weights doubled; the mean stays 0.25 on average
    ([True, False, False, False], 0.3125)
    """
    p = check_p(p, "p")
    if rng is not None and keep is not None:
        raise OptionError("rng, keep: give one of them (a generator to draw the mask from, or the mask itself)")
    if isinstance(weights, (list, tuple)):
        weights = np.asarray(weights)
    if not hasattr(weights, "shape") or not hasattr(weights, "dtype"):
        raise DTypeError(f"weights: expected an array [..., n_q, n_k], got {type(weights).__name__}")
    xp = namespace(weights)
    _, out_dtype = compute_dtype(xp, weights.dtype, "weights")
    if out_dtype != weights.dtype:  # integers and booleans: float64, as in the core
        weights = xp.astype(weights, out_dtype)
    shape = shape_of(weights)
    if isinstance(keep, Dropout):
        if keep.p != p:
            raise OptionError(f"keep: a Dropout drawn with p={keep.p}, but p={p}; pass the same p")
        drop = keep
    elif keep is not None:
        mask = to_numpy(keep)
        if mask.dtype != np.bool_:
            raise DTypeError(f"keep: expected a boolean mask (True = kept), got dtype {mask.dtype}; use keep != 0")
        try:
            np.broadcast_shapes(mask.shape, shape)
        except ValueError:
            raise ShapeError(f"keep: shape {mask.shape} does not broadcast to the weights' {shape}") from None
        drop = Dropout(p=p, keep=np.array(mask, copy=True))
    elif p == 0.0:
        return DropoutResult(output=weights, dropout=None)
    else:
        drop = Dropout(p=p, keep=_generator(rng, p).random(shape) >= p)
    return DropoutResult(output=apply_dropout(weights, drop), dropout=drop)


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
