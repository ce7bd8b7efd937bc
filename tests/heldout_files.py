"""The file format the held-out sets share (tests/heldout3/, tests/heldout4/): one attention implementation per file,
found by its prefix, imported as a module of the set's package and read into a frozen :class:`Case`.

A set's package calls :func:`case_names` and :func:`load_cases` with its own package name and directory; each file
names its public source (``SOURCE``), its kind, the finding code a correct checker should name first (``EXPECTED``,
``None`` for a correct case), other codes that would also be a right primary name (``ALSO_OK``), the options a user
would pass (``CHECK``) and the callable to check (``TARGET``).
"""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
import types
from collections.abc import Mapping
from typing import Any

#: File-name prefixes of the case files, with the kind and whether the cases are correct.
PREFIXES = {
    "fwd_": ("forward", False),
    "ok_": ("forward", True),
    "bwd_": ("backward", False),
    "okbwd_": ("backward", True),
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One held-out implementation.

    Attributes:
        name: the file's stem (``fwd_gqa_tile_instead_of_repeat``).
        path: the file.
        kind: ``"forward"`` or ``"backward"``.
        expected: the primary finding code, or ``None`` for a correct implementation.
        also_ok: other codes that would also be a right primary name.
        check: the keyword options a user would pass to ``attnlab.check`` (read-only; ``backward`` as written in the
            file: the name of the backward function in the same file, or ``True`` for autograd).
        target: the object to check (the forward: a function or a callable instance).
        backward: the hand-written backward named by ``check["backward"]``, ``True`` (autograd through a custom
            ``torch.autograd.Function``), or ``None`` for forward cases.
        source: the URL of the public report or code the case was rebuilt from.
        check_target_name: the name of the checked callable in its file (the file's ``TARGET``).
    """

    name: str
    path: pathlib.Path
    kind: str
    expected: str | None
    also_ok: tuple[str, ...]
    check: Mapping[str, Any]
    target: Any
    backward: Any
    source: str
    check_target_name: str

    @property
    def buggy(self) -> bool:
        """True when the case has a bug (an ``expected`` code)."""
        return self.expected is not None

    @property
    def target_string(self) -> str:
        """``path/to/file.py:TARGET``, the form ``attnlab check`` takes on the command line."""
        return f"{self.path}:{self.check_target_name}"

    def check_options(self) -> dict[str, Any]:
        """The keyword options for ``attnlab.check(case.target, **options)``, ``backward`` resolved to the callable."""
        options = dict(self.check)
        if "backward" in options:
            options["backward"] = self.backward
        return options


def case_names(directory: pathlib.Path) -> list[str]:
    """The stems of every case file in a set's ``directory``, sorted."""
    return sorted(p.stem for p in directory.glob("*.py") if p.stem.startswith(tuple(PREFIXES)))


def kind_of(stem: str) -> tuple[str, bool]:
    """``(kind, correct)`` from a case file's prefix (the longest matching prefix wins: ``okbwd_`` over ``ok_``)."""
    prefix = max((p for p in PREFIXES if stem.startswith(p)), key=len)
    return PREFIXES[prefix]


def load_cases(package: str, directory: pathlib.Path) -> list[Case]:
    """Import every case file of the set ``package`` (its files in ``directory``) and return its records by name."""
    cases = []
    for stem in case_names(directory):
        mod = importlib.import_module(f"{package}.{stem}")
        check = dict(mod.CHECK)
        backward = check.get("backward")
        if isinstance(backward, str):
            backward = getattr(mod, backward)
        cases.append(
            Case(
                name=stem,
                path=directory / f"{stem}.py",
                kind=mod.KIND,
                expected=mod.EXPECTED,
                also_ok=tuple(mod.ALSO_OK),
                check=types.MappingProxyType(check),
                target=getattr(mod, mod.TARGET),
                backward=backward,
                source=mod.SOURCE,
                check_target_name=mod.TARGET,
            )
        )
    return cases
