"""What every command does the same way at the terminal: colour or not, and a reader that went away.

Colour follows ``--no-color``, then ``NO_COLOR`` (no-color.org), then ``FORCE_COLOR``, then whether the stream is a
terminal; a broken pipe points standard output at ``os.devnull`` so the interpreter's last flush raises nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import IO, Any

__all__ = ["is_terminal", "stdout_gone", "use_color"]


def use_color(stream: IO[Any] | Any, *, no_color: bool = False, environ: Mapping[str, str] | None = None) -> bool:
    """Whether output to ``stream`` is coloured: never with ``no_color`` (``--no-color``) or a non-empty
    ``NO_COLOR`` (no-color.org); always with a non-empty ``FORCE_COLOR``; otherwise when ``stream`` is a terminal.
    ``environ`` defaults to ``os.environ``.

    >>> import io
    >>> use_color(io.StringIO(), environ={}), use_color(io.StringIO(), environ={"FORCE_COLOR": "1"})
    (False, True)
    >>> use_color(io.StringIO(), environ={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    False
    """
    env = os.environ if environ is None else environ
    if no_color or env.get("NO_COLOR"):
        return False
    if env.get("FORCE_COLOR"):
        return True
    return is_terminal(stream)


def is_terminal(stream: IO[Any] | Any) -> bool:
    """Whether ``stream`` is a terminal (False for an object without ``isatty`` and for a closed stream).

    >>> import io
    >>> is_terminal(io.StringIO())
    False
    """
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except ValueError:  # a closed stream
        return False


def stdout_gone() -> None:
    """Point standard output at ``os.devnull`` after a broken pipe, so that the interpreter's last flush at exit
    raises nothing more (the recipe of Python's documentation, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no file descriptor (a captured stream in tests)
        pass
