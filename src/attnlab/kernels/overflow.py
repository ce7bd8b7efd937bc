"""The errors the kernels raise when finite inputs overflow the dtype they are computed or stored in.

:func:`logits_overflow_error` has the signature of the core's shared message builder (``attnlab.errors``), so that
the kernels and the dense core say the same thing; the other two cover what only the kernels meet: a logit factor
``scale / temperature`` that is itself infinite, and gradients that overflow in the backward.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import RangeError

__all__ = ["factor_overflow_error", "gradient_overflow_error", "logits_overflow_error"]


def _g(x: float) -> str:
    return f"{x:.7g}"


def _limit(dtype: str) -> str:
    try:
        return f"largest finite {_g(float(np.finfo(dtype).max))}"
    except (TypeError, ValueError):
        return "its largest finite value"


def logits_overflow_error(
    index: tuple[int, ...],
    value: float,
    count: int,
    scores_shape: tuple[int, ...],
    dtype: str,
    *,
    q_max: float,
    k_max: float,
    bias_max: float | None,
    scale: float,
    temperature: float,
    index_layout: str = "(*batch, query, key)",
    note: str = "",
) -> RangeError:
    """The error for logits ``(scale · Q Kᵀ + bias) / temperature`` that are not finite although the inputs are.

    Args:
        index: the first offending entry found, in ``index_layout`` order.
        value: the value found there (``inf``, ``-inf`` or ``nan``: a NaN comes from ``inf - inf``).
        count: how many entries are not finite, ``-1`` if not counted (the tiled kernel stops at the first block).
        scores_shape: the shape of the full logits ``[*batch, n_q, n_k]``.
        dtype: the name of the dtype the logits were computed in.
        q_max, k_max: the largest magnitude of q and of k; ``bias_max`` that of the bias (None without one).
        scale, temperature: as used.
        index_layout: what each position of ``index`` is.
        note: an extra sentence.

    >>> str(logits_overflow_error((0, 1, 2), float("inf"), -1, (1, 3, 3), "float32", q_max=1e20, k_max=1e20,
    ...     bias_max=None, scale=0.5, temperature=1.0)).split("; ")[0]
    'logits: (scale · Q Kᵀ + bias) / temperature overflow float32 (largest finite 3.402823e+38) from finite inputs'
    """
    many = "" if count < 0 else f"{count} of {math.prod(scores_shape)} entries, "
    bias = "no bias" if bias_max is None else f"max |bias| {_g(bias_max)}"
    fixes = "a smaller scale or smaller q/k/bias, a larger temperature"
    if str(dtype) != "float64":
        fixes += ", or float64 inputs"
    return RangeError(
        f"logits: (scale · Q Kᵀ + bias) / temperature overflow {dtype} ({_limit(dtype)}) from finite inputs; "
        f"{value} at {index_layout} index {tuple(int(i) for i in index)} ({many}logits {tuple(scores_shape)}); "
        f"inputs: max |q| {_g(q_max)}, max |k| {_g(k_max)}, {bias}, scale {_g(scale)}, temperature {_g(temperature)}."
        f"{' ' + note if note else ''} Fix: {fixes}"
    )


def factor_overflow_error(what: str, value: float, dtype: str, *, scale: float, temperature: float) -> RangeError:
    """The error for a logit factor (``scale / temperature``, or ``1 / temperature`` for the bias) that is not a
    finite number in ``dtype``: every nonzero logit would be infinite, and a zero one NaN.

    >>> e = factor_overflow_error("scale / temperature", 0.5 / 1e-310, "float64", scale=0.5, temperature=1e-310)
    >>> str(e).split(":")[1]
    ' scale / temperature = 0.5 / 1e-310 = inf overflows float64 (largest finite 1.797693e+308)'
    """
    return RangeError(
        f"logits: {what} = {_g(scale) + ' / ' if what.startswith('scale') else '1 / '}{_g(temperature)} = "
        f"{_g(value)} overflows {dtype} ({_limit(dtype)}): every nonzero logit (scale · Q Kᵀ + bias) / temperature "
        f"would be infinite. Fix: a larger temperature or a smaller scale"
    )


def gradient_overflow_error(
    name: str, index: tuple[int, ...], value: float, dtype: str, *, d_out_max: float
) -> RangeError:
    """The error for a gradient of the backward that is not finite although its inputs are."""
    fixes = "smaller d_out (scale the loss down) or smaller v"
    if str(dtype) != "float64":
        fixes += ", or float64 inputs"
    return RangeError(
        f"{name}: the gradient overflows {dtype} ({_limit(dtype)}) from finite inputs; {value} at index "
        f"{tuple(int(i) for i in index)} (max |d_out| {_g(d_out_max)}). Fix: {fixes}"
    )
