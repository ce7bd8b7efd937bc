"""The held-out acceptance set of ``attnlab check`` (forward): implementations the checker's authors never read.

Each :class:`Case` is one attention implementation, transcribed from public code (its ``source`` names the
repository, path and commit, or the URL) with at most one or two planted bugs, or left correct. ``expected`` is the
primary finding code the checker must name (None: a correct implementation, on which it must find nothing);
``second`` is the code of a second, independent bug where a case plants two. ``options`` are the keyword arguments
for :func:`attnlab.checker.check` that describe the function (what a user would declare, never what hides a bug).

The acceptance rule (issue 13) is measured by ``tests/test_check_heldout.py`` and printed by
``benchmarks/check_acceptance.py``: at least 90 % of the buggy cases named by their primary code, no finding on any
correct case, and no buggy case with a clean verdict.
Whoever changes the checker tunes it on the zoo (tests/zoo), never on this package: it measures bug classes.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Case:
    """One held-out implementation.

    Attributes:
        name: a unique short name.
        fn: what is passed to :func:`attnlab.checker.check` (a function, lambda, partial, class, instance or
            ``torch.nn.Module``).
        options: keyword arguments for :func:`attnlab.checker.check` (``isolate=False`` is added by the runner).
        expected: the primary finding code of the planted bug, or None for a correct implementation.
        source: where the code comes from (repository, path, commit or URL) and what was planted.
        second: the code of a second, independent planted bug (reported as a second finding), or None.
    """

    name: str
    fn: Any
    options: dict[str, Any] = field(default_factory=dict)
    expected: str | None = None
    source: str = ""
    second: str | None = None

    @property
    def buggy(self) -> bool:
        return self.expected is not None


def all_cases() -> list[Case]:
    """Every held-out case: correct implementations first, then the buggy ones."""
    from .buggy_functions import CASES as FUNCTIONS
    from .buggy_interfaces import CASES as INTERFACES
    from .buggy_modules import CASES as MODULES
    from .correct import CASES as CORRECT

    cases = [*CORRECT, *FUNCTIONS, *MODULES, *INTERFACES]
    names = [c.name for c in cases]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"held-out case names must be unique; repeated: {sorted(dup)}")
    return cases


def run_case(case: Case) -> Any:
    """``attnlab.check`` on one case, in-process (the acceptance run checks ~60 functions; a worker each is slow)."""
    from attnlab.checker import check

    return check(case.fn, isolate=False, name=case.name, **case.options)


def judge(case: Case, report: Any) -> str:
    """``"pass"`` or why the case fails the acceptance rule: a correct case must have no finding; a buggy one must
    not be clean and must carry its primary code (and the second one, where planted, is reported separately)."""
    codes = tuple(f.code for f in report.findings)
    if not case.buggy:
        return "pass" if not codes else "false finding"
    if report.ok:
        return "OK on a bug"
    if case.expected not in codes:
        return "misnamed" if codes else "no finding"
    return "pass"


def table_row(case: Case) -> list[Any]:
    """:func:`run_case` as one row of an acceptance table, in JSON: ``[codes, verdict, result]`` (the findings' codes
    in order, the report's verdict, :func:`judge`'s result). The checked code's own RuntimeWarnings (NaN rows,
    overflow) are expected and not errors here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = run_case(case)
    return [[f.code for f in report.findings], report.verdict, judge(case, report)]
