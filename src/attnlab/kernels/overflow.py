"""The errors the kernels raise when finite inputs overflow the dtype they are computed or stored in.

:func:`~attnlab.errors.logits_overflow_error` is the core's shared message builder (re-exported here), so the kernels
and the dense core say the same thing; the other two cover what only the kernels meet: a logit factor
``scale / temperature`` that is itself infinite, and gradients that overflow in the backward.
"""

from __future__ import annotations

import numpy as np

from ..errors import RangeError, logits_overflow_error

__all__ = ["factor_overflow_error", "gradient_overflow_error", "logits_overflow_error"]


def _g(x: float) -> str:
    return f"{x:.7g}"


def _limit(dtype: str) -> str:
    try:
        return f"largest finite {_g(float(np.finfo(dtype).max))}"
    except (TypeError, ValueError):
        return "its largest finite value"


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
