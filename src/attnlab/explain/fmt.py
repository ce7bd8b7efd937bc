"""How numbers are written everywhere attnlab shows one: short, exact where exact, never rounded to a misleading 0
or 1.

One rule for every view (``attnlab explain``'s tables, the lab's tables and SVG heatmaps, :mod:`attnlab.plot`'s
heatmaps and bars): :func:`num` with 4 decimals, trailing zeros dropped; near 0 and near ±1 more decimals, until the
distance to the round value is right within 5% (0.0000454 is ``0.000045``, 0.9999546 is ``0.999955``: never ``0``,
``1``, ``0.00`` or ``1.00``). A row sum is :func:`row_sum` (``Σ=1``, ``Σ=nan``). One colour for NaN in every
picture and in the terminal: :data:`NAN_COLOUR`.

The articles print some numbers rounded further (6.698 / 6.604 / 13.396 for 6.6976 / 6.6048 / 13.3952, §12's
6.6041 / 13.3959 from the rounded weights 0.6698 / 0.3302): attnlab writes the exact value with the rule above and
says where a printout differs (``attnlab demo``; the lab's item text; docs/learn.md).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["NAN_COLOUR", "num", "row_sum", "vec"]

#: NaN (a row with no legal key under the ``nan`` policy) in every picture and in the terminal: dark red.
NAN_COLOUR = "#a50f15"


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


def row_sum(s: float) -> str:
    """A row sum as the heatmaps write it at the right of a row: ``Σ=`` and :func:`num` of the sum rounded to 6
    decimals (float32 weights: 1.00000001 is written 1).

    >>> row_sum(1.0000000001), row_sum(0.0), row_sum(float("nan")), row_sum(0.2689414)
    ('Σ=1', 'Σ=0', 'Σ=nan', 'Σ=0.2689')
    """
    s = float(s)
    return "Σ=" + num(round(s, 6) if math.isfinite(s) else s)
