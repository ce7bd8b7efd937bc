"""The second held-out sets through the checker (tests/heldout2/ forward, tests/heldout2_backward/ backward): written
after the first sets by other authors, who read only the user documentation and public code, never the checker.

The rule is the first sets' (issues 13 and 14): at least 90 % of the buggy cases named by their primary code, no
finding on a correct case, no buggy case with a clean verdict. The sets' own claims (each correct case correct,
each bug present) are asserted without the checker by tests/test_heldout2_set.py and
tests/test_heldout2_backward_set.py. ``python benchmarks/check_acceptance.py --set 2 [--backward]`` prints the table.
"""

from __future__ import annotations

import math
import warnings

import pytest
from heldout import judge, run_case
from heldout.backward_passes import run_check
from heldout2 import all_cases
from heldout2_backward import CASES as BACKWARD


@pytest.fixture(scope="module")
def forward():
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the checked code's own RuntimeWarnings (NaN rows, overflow) are expected
        for case in all_cases():
            report = run_case(case)
            rows.append((case, tuple(f.code for f in report.findings), report.verdict, judge(case, report)))
    return rows


def _table(rows) -> str:
    return "\n".join(
        f"{c.name:46} {c.expected or '-':24} {','.join(codes) or '-':50} {v:8} {r}" for c, codes, v, r in rows
    )


def test_forward_acceptance_rule(forward):
    buggy = [r for r in forward if r[0].buggy]
    named = [r for r in buggy if r[3] == "pass"]
    false = [r[0].name for r in forward if not r[0].buggy and r[3] != "pass"]
    ok_on_bug = [r[0].name for r in buggy if r[2] == "clean"]
    assert len(named) >= math.ceil(0.9 * len(buggy)) and not false and not ok_on_bug, _table(forward)


def test_forward_second_bugs_are_reported(forward):
    rows = [r for r in forward if r[0].second]
    assert rows and all(r[0].second in r[1] for r in rows), _table(rows)


def test_backward_acceptance_rule():
    rows, bad = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in BACKWARD:
            report = run_check(case)
            codes = report.codes
            ok = (case.primary in codes) if case.primary else not codes
            rows.append((case.name, case.primary, codes, report.verdict))
            if not ok:
                bad.append(rows[-1])
    buggy = [r for r in rows if r[1]]
    missed = [r for r in bad if r[1]]
    false = [r for r in bad if not r[1]]
    clean_on_bug = [r for r in buggy if r[3] == "clean"]
    assert len(buggy) - len(missed) >= math.ceil(0.9 * len(buggy)) and not false and not clean_on_bug, bad
