"""The second held-out sets through the checker (tests/heldout2/ forward, tests/heldout2_backward/ backward): written
after the first sets by other authors, who read only the user documentation and public code, never the checker.

The rule is the first sets' (issues 13 and 14): at least 90 % of the buggy cases named by their primary code, no
finding on a correct case, no buggy case with a clean verdict. The sets' own claims (each correct case correct,
each bug present) are asserted without the checker by tests/test_heldout2_set.py and
tests/test_heldout2_backward_set.py. ``python benchmarks/check_acceptance.py --set 2 [--backward]`` prints the table.
Each case is checked once per run (``computed_once``): its own test asserts its part of the rule, spread over the
workers, and the whole-set tests at the end read the same rows.
"""

from __future__ import annotations

import math
import warnings

import pytest
from heldout import table_row
from heldout.backward_passes import run_check
from heldout2 import all_cases
from heldout2_backward import CASES as BACKWARD

FORWARD = {f"heldout2/{c.name}": c for c in all_cases()}
BACKWARD_BY_KEY = {f"heldout2-backward/{c.name}": c for c in BACKWARD}


def _forward_row(key: str) -> list:
    return table_row(FORWARD[key])


def _backward_row(key: str) -> list:
    """``[codes, verdict]`` of the backward check of one case."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the checked code's own RuntimeWarnings (NaN rows, overflow) are expected
        report = run_check(BACKWARD_BY_KEY[key])
    return [list(report.codes), report.verdict]


def _forward(computed_once) -> list[tuple]:
    rows = computed_once.rows(list(FORWARD), _forward_row)
    return [(case, tuple(codes), v, r) for case, (codes, v, r) in zip(FORWARD.values(), rows, strict=True)]


def _table(rows) -> str:
    return "\n".join(
        f"{c.name:46} {c.expected or '-':24} {','.join(codes) or '-':50} {v:8} {r}" for c, codes, v, r in rows
    )


@pytest.mark.parametrize("key", list(FORWARD), ids=[c.name for c in FORWARD.values()])
def test_forward_case_keeps_its_part_of_the_rule(key, computed_once):
    """No finding on a correct case, no clean verdict on a buggy one, a second planted bug reported too."""
    case = FORWARD[key]
    codes, verdict, result = computed_once.row(key, _forward_row)
    row = _table([(case, codes, verdict, result)])
    assert verdict != "clean" if case.buggy else result == "pass", row
    assert not case.second or case.second in codes, row


@pytest.mark.parametrize("key", list(BACKWARD_BY_KEY), ids=[c.name for c in BACKWARD])
def test_backward_case_keeps_its_part_of_the_rule(key, computed_once):
    """No finding on a correct case, no clean verdict on a buggy one."""
    case = BACKWARD_BY_KEY[key]
    codes, verdict = computed_once.row(key, _backward_row)
    assert verdict != "clean" if case.primary else not codes, (case.name, case.primary, codes, verdict)


# the whole sets, after the per-case tests (so that in a parallel run these mostly read rows computed already)


def test_forward_acceptance_rule(computed_once):
    forward = _forward(computed_once)
    buggy = [r for r in forward if r[0].buggy]
    named = [r for r in buggy if r[3] == "pass"]
    false = [r[0].name for r in forward if not r[0].buggy and r[3] != "pass"]
    ok_on_bug = [r[0].name for r in buggy if r[2] == "clean"]
    assert len(named) >= math.ceil(0.9 * len(buggy)) and not false and not ok_on_bug, _table(forward)


def test_forward_second_bugs_are_reported(computed_once):
    rows = [r for r in _forward(computed_once) if r[0].second]
    assert rows and all(r[0].second in r[1] for r in rows), _table(rows)


def test_backward_acceptance_rule(computed_once):
    rows, bad = [], []
    for case, (codes, verdict) in zip(BACKWARD, computed_once.rows(list(BACKWARD_BY_KEY), _backward_row), strict=True):
        codes = tuple(codes)
        ok = (case.primary in codes) if case.primary else not codes
        rows.append((case.name, case.primary, codes, verdict))
        if not ok:
            bad.append(rows[-1])
    buggy = [r for r in rows if r[1]]
    missed = [r for r in bad if r[1]]
    false = [r for r in bad if not r[1]]
    clean_on_bug = [r for r in buggy if r[3] == "clean"]
    assert len(buggy) - len(missed) >= math.ceil(0.9 * len(buggy)) and not false and not clean_on_bug, bad
