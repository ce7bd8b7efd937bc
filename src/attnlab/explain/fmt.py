"""How numbers are written in explanations: short, exact where exact, never rounded to a misleading 0 or 1."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["num", "vec"]


def num(x: float, digits: int = 4) -> str:
    """``x`` with up to ``digits`` decimals, trailing zeros dropped; tiny or near-1 values get more digits.

    >>> num(0.70710678), num(1.0), num(-0.0), num(float("-inf")), num(0.0000453979), num(0.9999546)
    ('0.7071', '1', '0', '-inf', '0.000045', '0.999955')
    """
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if (abs(x) >= 1e7 and x != round(x)) or abs(x) >= 1e16:  # e^600, 1e30: a short exponent, not 260 digits
        return f"{x:.4g}"
    # Near 0 and near ±1 (tiny weights, saturated softmax) more digits are shown, until the distance to the round
    # value is right within 5%: 0.0000454 is '0.000045', not '0' or '0.00005'.
    gap = min(abs(x), abs(1.0 - abs(x))) if x != 0 else 0.0
    for d in range(digits, 9):
        s = np.format_float_positional(x, precision=d, unique=False, fractional=True, trim="-")
        shown = float(s)
        if shown == x or abs(abs(shown) - abs(x)) <= 0.05 * gap:
            break
    else:
        if x != 0 and abs(x) < 1e-8:
            return f"{x:.2e}"
    if s in ("-0", "-0."):
        s = "0"
    return s


def vec(xs, digits: int = 4) -> str:
    """``[a, b, ...]`` written with :func:`num`.

    >>> vec([10, 0.5])
    '[10, 0.5]'
    """
    return "[" + ", ".join(num(x, digits) for x in np.asarray(xs, dtype=np.float64).ravel()) + "]"
