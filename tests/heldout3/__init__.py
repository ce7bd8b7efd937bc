"""The third held-out set for ``attnlab check`` (issue 20): attention implementations rebuilt from bugs people
reported in public, and correct real-world-shaped ones, forward and gradient.

Every case is one file: ``fwd_*`` (forward, buggy), ``ok_*`` (forward, correct), ``bwd_*`` (hand-written backward or
custom autograd Function, buggy) and ``okbwd_*`` (backward, correct). Each file names its public source (``SOURCE``),
its kind, the finding code a correct checker should name first (``EXPECTED``, ``None`` for a correct case), other
codes that would also be a right primary name (``ALSO_OK``), the options a user would pass (``CHECK``) and the
callable to check (``TARGET``). The set was written without reading the checker; ``verify_set.py`` checks each case
against an independent float64 reference, without the checker.
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
