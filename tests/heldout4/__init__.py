"""Held-out set 4 for ``attnlab check`` (issue 20): the package of its case files (``fwd_*``, ``ok_*``, ``bwd_*``,
``okbwd_*``, read by ``tests/heldout_files.py``) and of ``verify_set.py``, which checks them without the checker.
"""

from __future__ import annotations

import pathlib

import heldout_files
from heldout_files import PREFIXES, Case, kind_of

HERE = pathlib.Path(__file__).resolve().parent

__all__ = ["HERE", "PREFIXES", "Case", "case_names", "kind_of", "load_cases"]


def case_names() -> list[str]:
    """The stems of every case file, sorted."""
    return heldout_files.case_names(HERE)


def load_cases() -> list[Case]:
    """Import every case file and return its record, sorted by name."""
    return heldout_files.load_cases(__name__, HERE)
