"""A second held-out acceptance set for ``attnlab check`` (forward), independent of ``tests/heldout``.

Same :class:`heldout.Case` type and the same runner (``heldout.run_case``, ``heldout.judge``). Each case is an
attention implementation transcribed from public code (its ``source`` names the repository, path and version or
the URL, and what was planted) or a correct one.

Information rule followed while writing it: only ``tests/heldout/__init__.py`` (the Case type and the runner),
``docs/checker.md`` and ``README.md`` were read; nothing under ``src/attnlab/checker/``, ``tests/zoo/``, the other
files of ``tests/heldout/`` or ``tests/test_check*.py``, and the checker was never run on these cases. The
sources and bug writings of the first set (its case list) were avoided. ``expected`` was chosen from the
definitions of the finding codes in docs/checker.md.

``verify_set.verify_all()`` checks every claim against an independent float64 NumPy reference (correct cases
match; buggy ones differ where and how their ``source`` says); ``tests/test_heldout2_set.py`` runs it.
"""

from __future__ import annotations

from heldout import Case

__all__ = ["Case", "all_cases"]


def all_cases() -> list[Case]:
    """Every case of the second set: correct implementations first, then the buggy ones (unique names)."""
    from .buggy import CASES as BUGGY
    from .correct import CASES as CORRECT

    cases = [*CORRECT, *BUGGY]
    names = [c.name for c in cases]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"heldout2 case names must be unique; repeated: {sorted(dup)}")
    return cases
