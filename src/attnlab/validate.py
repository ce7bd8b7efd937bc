"""Validators for options (numbers and choices, not arrays), shared by every module and command.

Each raises :class:`~attnlab.errors.OptionError` with the option's name, the value it got and what was expected,
and returns the value converted to a plain Python type:

>>> check_int("block_k", 64, minimum=1)
64
>>> check_int("block_k", 0, minimum=1)
Traceback (most recent call last):
...
attnlab.errors.OptionError: block_k: expected an int >= 1, got 0
>>> check_float("temperature", 0.5, positive=True)
0.5
>>> check_choice("masked_rows", "zero", ("raise", "zero", "nan"))
'zero'
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from .errors import OptionError

__all__ = ["check_choice", "check_float", "check_int", "check_optional_int"]


def _bounds(minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f" in [{minimum}, {maximum}]"
    if minimum is not None:
        return f" >= {minimum}"
    if maximum is not None:
        return f" <= {maximum}"
    return ""


def _checked_int(
    name: str, value: Any, minimum: int | None, maximum: int | None, error: type[Exception], what: str
) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise error(f"{name}: expected {what}{_bounds(minimum, maximum)}, got {value!r}")
    n = int(value)
    if (minimum is not None and n < minimum) or (maximum is not None and n > maximum):
        raise error(f"{name}: expected {what}{_bounds(minimum, maximum)}, got {n}")
    return n


def check_int(
    name: str,
    value: Any,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    error: type[Exception] = OptionError,
) -> int:
    """``value`` as an ``int`` (Python or NumPy integer, never a bool) within ``[minimum, maximum]``. ``error`` is
    the class raised (:class:`OptionError`; a mask's window is a :class:`~attnlab.errors.MaskError`)."""
    return _checked_int(name, value, minimum, maximum, error, "an int")


def check_optional_int(
    name: str, value: Any, *, minimum: int | None = None, error: type[Exception] = OptionError
) -> int | None:
    """``None`` (passed through) or ``value`` checked as by :func:`check_int` against a lower bound; the message
    says that ``None`` is accepted too.

    >>> check_optional_int("left", None, minimum=0) is None
    True
    >>> check_optional_int("left", -1, minimum=0)
    Traceback (most recent call last):
    ...
    attnlab.errors.OptionError: left: expected None or an int >= 0, got -1
    """
    return None if value is None else _checked_int(name, value, minimum, None, error, "None or an int")


def check_float(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    positive: bool = False,
    finite: bool = True,
) -> float:
    """``value`` as a ``float`` (any real number, never a bool): finite unless ``finite=False``, > 0 if ``positive``."""
    want = "a finite number" if finite else "a number"
    want += " > 0" if positive else ""
    want += _bounds(minimum, maximum)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise OptionError(f"{name}: expected {want}, got {value!r}")
    x = float(value)
    if (
        math.isnan(x)
        or (finite and math.isinf(x))
        or (positive and x <= 0)
        or (minimum is not None and x < minimum)
        or (maximum is not None and x > maximum)
    ):
        raise OptionError(f"{name}: expected {want}, got {value!r}")
    return x


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` if it is one of ``choices`` (compared with ``==``, bools never equal to ints)."""
    options = tuple(choices)
    for c in options:
        if type(c) is type(value) and c == value:
            return c
    listed = ", ".join(repr(c) for c in options)
    raise OptionError(f"{name}: expected one of {listed}, got {value!r}")
