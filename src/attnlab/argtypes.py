"""Argument types of the ``attnlab`` command line (its subcommands and :mod:`attnlab.explain.args`): each checks one
value while the arguments are parsed, before any work starts.

Each factory returns an ``argparse`` ``type=`` function that converts the text and raises
:class:`argparse.ArgumentTypeError` with what was expected (the wording of :mod:`attnlab.validate`); the parser
prefixes the flag, so a bad value prints one line and exits with status 2:
``attnlab train: error: --lr: expected a finite number in (0, 1], got nan``.

>>> int_type(minimum=1)("12")
12
>>> int_type(minimum=1)("1e12")  # an exact integer in scientific notation is an integer
1000000000000
>>> int_type(minimum=1)("0")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: expected an int >= 1, got 0
>>> float_type(positive=True)("nan")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: expected a finite number > 0, got nan

Checks that need two options, or a range known only once the model or the example is loaded, raise
:class:`~attnlab.errors.OptionError` naming the flag; :func:`attnlab.cli.main` prints those the same way.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from .errors import OptionError
from .validate import check_float, check_int

__all__ = [
    "float_or_text",
    "float_type",
    "index_in",
    "input_file",
    "int_or_text",
    "int_type",
    "keywords",
    "output_file",
    "probability",
    "text_type",
]


def _reason(err: OptionError) -> str:
    """The message of a :mod:`attnlab.validate` error without its leading ``name: ``."""
    return str(err).split(": ", 1)[1]


def _shown(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


def _parse_int(text: str) -> int | str:
    """``text`` as an int (``12``, ``1_000``, ``1e12``: an exact integer of at most 100 digits), else ``text``
    (shortened to 40 characters, for the message)."""
    s = text.strip()
    if len(s) > 100:
        return _shown(s)
    try:
        return int(s)
    except ValueError:
        pass
    try:
        d = Decimal(s)
    except InvalidOperation:
        return _shown(text)
    if d.is_finite() and d.adjusted() < 100 and d == d.to_integral_value():
        return int(d)
    return _shown(text)


def int_type(*, minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an int in ``[minimum, maximum]`` (either bound optional)."""

    def parse(text: str) -> int:
        try:
            return check_int("value", _parse_int(text), minimum=minimum, maximum=maximum)
        except OptionError as err:
            raise argparse.ArgumentTypeError(_reason(err)) from None

    parse.__name__ = "int"
    return parse


def float_type(
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    positive: bool = False,
    expected: str | None = None,
) -> Callable[[str], float]:
    """An argparse type: a finite float (``> 0`` if ``positive``) in ``[minimum, maximum]``.

    ``expected`` replaces the description in the message (``"expected {expected}, got ..."``).
    """

    def parse(text: str) -> float:
        try:
            value: float | str = float(text)
        except ValueError:
            value = _shown(text)
        try:
            return check_float("value", value, minimum=minimum, maximum=maximum, positive=positive)
        except OptionError as err:
            reason = _reason(err) if expected is None else f"expected {expected}, got {value!r}"
            raise argparse.ArgumentTypeError(reason) from None

    parse.__name__ = "float"
    return parse


def probability(text: str) -> float:
    """An argparse type: a probability ``p`` with ``0 <= p < 1`` (a dropout rate: 1 would drop everything)."""
    try:
        p: float | str = float(text)
    except ValueError:
        p = _shown(text)
    if isinstance(p, str) or not 0.0 <= p < 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability 0 <= p < 1, got {p!r}")
    return p


def text_type(text: str) -> str:
    """An argparse type: text that is not empty."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected some text, got {text!r}")
    return text


def input_file(text: str) -> str:
    """An argparse type: the path of an existing, readable file."""
    p = Path(text)
    if not p.exists():
        raise argparse.ArgumentTypeError(f"no such file {text!r}")
    if not p.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not a file")
    if not os.access(p, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text!r} is not readable")
    return text


def output_file(suffixes: Sequence[str]) -> Callable[[str], str]:
    """An argparse type: a file to write, ending in one of ``suffixes``, in an existing writable folder."""
    listed = ", ".join(suffixes[:-1]) + f" or {suffixes[-1]}" if len(suffixes) > 1 else suffixes[0]

    def parse(text: str) -> str:
        p = Path(text)
        if p.suffix.lower() not in suffixes:
            raise argparse.ArgumentTypeError(f"{text!r} must end in {listed} (got {p.suffix or 'no extension'!r})")
        if p.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} is a folder; expected a file name")
        folder = p.parent
        if not folder.exists():
            raise argparse.ArgumentTypeError(f"folder {str(folder)!r} of {text!r} does not exist")
        if not folder.is_dir():
            raise argparse.ArgumentTypeError(f"{str(folder)!r} in {text!r} is not a folder")
        if not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
            raise argparse.ArgumentTypeError(f"{text!r} is not writable")
        return text

    parse.__name__ = "path"
    return parse


def index_in(flag: str, value: int | None, size: int, what: str) -> int | None:
    """``value`` if it is an index in ``[0, size)`` of ``what`` (``None`` passes), else an :class:`OptionError`.

    >>> index_in("--layer", 3, 30, "layers of SmolLM2-135M")
    3
    >>> index_in("--layer", 30, 30, "layers of SmolLM2-135M")
    Traceback (most recent call last):
    ...
    attnlab.errors.OptionError: --layer: expected an int in [0, 29] (30 layers of SmolLM2-135M), got 30
    """
    if value is None:
        return None
    if not 0 <= value < size:
        raise OptionError(f"{flag}: expected an int in [0, {size - 1}] ({size} {what}), got {value}")
    return value


def keywords(args: argparse.Namespace, flags: Mapping[str, str]) -> dict[str, Any]:
    """A library function's keyword arguments from the parsed command line: ``flags`` maps each keyword to the
    option that sets it (the one table a command keeps, also for naming the option in an error), and each value
    is what argparse stored for that option.

    >>> keywords(argparse.Namespace(pairs=8, block_q=None), {"n_pairs": "--pairs", "block_q": "--block-q"})
    {'n_pairs': 8, 'block_q': None}
    """
    return {keyword: getattr(args, flag.lstrip("-").replace("-", "_")) for keyword, flag in flags.items()}


def int_or_text(text: str) -> int | str:
    """An argparse type that only converts: ``text`` as an int, else the text itself, for a command that checks its
    options together later (with :func:`~attnlab.validate.check_int`, which names the flag and the expected range)."""
    try:
        return int(text)
    except ValueError:
        return text


def float_or_text(text: str) -> float | str:
    """Like :func:`int_or_text`, for a number: ``text`` as a float, else the text itself (checked later by name)."""
    try:
        return float(text)
    except ValueError:
        return text
