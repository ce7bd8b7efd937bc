"""Naming a function to check: ``path/to/file.py:func`` or ``package.module:func`` (``func`` may be dotted).

A ``package.module`` resolves against the current folder first, as ``python -m`` and pytest do: ``attnlab check
mypackage.layers:attend`` finds ``./mypackage`` whether attnlab was started as ``python -m attnlab`` (which puts the
current folder on ``sys.path`` itself) or as the ``attnlab`` console script (which does not).

:func:`parse_target` validates the form (and that a file exists) without importing anything; :func:`load_target`
imports the module and returns the callable. The checker's worker process calls :func:`load_target`, so the user's
module is only ever imported there.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import AttnlabError

__all__ = ["TargetError", "load_target", "parse_target"]


class TargetError(AttnlabError, ValueError):
    """The target could not be imported or is not callable (a usage error: nothing was checked)."""


def parse_target(target: str) -> tuple[str, str, bool]:
    """``(where, attribute, is_file)`` of ``target``; raises :class:`TargetError` for a malformed target."""
    if not isinstance(target, str) or ":" not in target:
        raise TargetError(f"target {target!r}: expected path/to/file.py:func or package.module:func")
    where, _, attr = target.rpartition(":")
    if not where or not attr:
        raise TargetError(f"target {target!r}: expected path/to/file.py:func or package.module:func")
    is_file = where.endswith(".py") or "/" in where or "\\" in where
    if is_file and not Path(where).is_file():
        raise TargetError(f"target {target!r}: file {where} does not exist")
    return where, attr, is_file


def _resolve_attr(obj: Any, dotted: str, where: str) -> Any:
    for part in dotted.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(f"{where} has no attribute {dotted!r}") from None
    return obj


def _current_folder_on_path() -> str | None:
    """Put the current folder first on ``sys.path`` unless it is there already (``""`` or its absolute path), as
    ``python -m`` does; it stays there once a module was imported from it (the package may import its own modules
    later). Returns what was added, or None."""
    cwd = os.getcwd()
    for entry in sys.path:
        try:
            if os.path.abspath(entry or os.curdir) == cwd:
                return None
        except (TypeError, ValueError):  # a non-string entry on sys.path
            continue
    sys.path.insert(0, cwd)
    return cwd


def load_target(target: str, modules: dict[str, Any] | None = None) -> Any:
    """The callable named by ``target``; ``modules`` (a worker's) keeps each file's module once imported, so that
    another target in the same file (a backward next to its forward) does not run the file again.

    Raises:
        TargetError: the target is malformed, the file or module does not exist (an ``ImportError`` while
            importing it; a module is looked for in the current folder first), the attribute is missing or not
            callable.
        BaseException: anything else the module raises while it is imported (including ``SystemExit``) passes
            through: that is the user's code failing, which the checker reports as a ``crash``.
    """
    where, attr, is_file = parse_target(target)
    if modules is not None and where in modules:
        module = modules[where]
    elif is_file:
        path = Path(where)
        mod_name = f"_attnlab_check_{path.stem}_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise TargetError(f"target {target!r}: cannot import {where}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        folder = str(path.resolve().parent)
        sys.path.insert(0, folder)
        try:
            spec.loader.exec_module(module)
        except ImportError as err:
            sys.modules.pop(mod_name, None)
            raise TargetError(f"target {target!r}: importing {where} failed: {type(err).__name__}: {err}") from err
        finally:
            if folder in sys.path:
                sys.path.remove(folder)
    else:
        added = _current_folder_on_path()
        try:
            module = importlib.import_module(where)
        except ImportError as err:
            if added is not None and added in sys.path:
                sys.path.remove(added)
            raise TargetError(
                f"target {target!r}: cannot import module {where}: {type(err).__name__}: {err} (looked in the "
                f"current folder {os.getcwd()} and on sys.path)"
            ) from err
    if modules is not None:
        modules[where] = module
    fn = _resolve_attr(module, attr, where)
    if not callable(fn):
        raise TargetError(f"target {target!r}: {attr} is a {type(fn).__name__}, not a function")
    return fn
