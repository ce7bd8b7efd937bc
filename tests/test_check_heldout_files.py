"""The held-out sets of case files (issue 20): ``attnlab check`` on implementations rebuilt from bugs people reported
in public (each file names its source), forward and hand-written backward, by authors who never read the checker:
tests/heldout3/ (58 files) and tests/heldout4/ (50 files, from other reports, written later by another author;
measured before the checker's changes of that turn: 34 of 35 bugs named, docs/checker.md).

Rule, per set: at least 90 % of the buggy cases named by their primary code (``EXPECTED``, or one of the file's
``ALSO_OK`` codes), no finding on any correct case, no buggy case with a clean verdict. Every case runs in-process
(``isolate=False``) and is checked once per run (``computed_once``): its own test asserts its part of the rule, spread
over the workers, and the whole-set test reads the same rows. Each set's own claims (each correct case correct, each
bug present) are asserted without the checker by tests/test_heldout3_set.py and tests/test_heldout4_set.py;
``python benchmarks/check_acceptance.py --set 3`` (or ``--set 4``) prints the table.
"""

from __future__ import annotations

import warnings

import heldout3
import heldout4
import pytest

SETS = {"heldout3": heldout3.load_cases(), "heldout4": heldout4.load_cases()}
BY_KEY = {f"{name}/{c.name}": c for name, cases in SETS.items() for c in cases}


def _row(key: str) -> list:
    """One case's row: the codes found, the verdict and whether the rule holds for it; the checker failing is a
    result too, shown in the table."""
    import attnlab

    case = BY_KEY[key]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the checked code's own RuntimeWarnings (NaN rows, overflow)
            report = attnlab.check(case.target, isolate=False, name=case.name, **case.check_options())
    except Exception as err:
        return [[], "checker-error", f"checker raised {type(err).__name__}: {err}"[:160]]
    codes = [f.code for f in report.findings]
    if not case.buggy:
        result = "pass" if not codes else "false finding"
    elif report.verdict == "clean":
        result = "OK on a bug"
    else:
        result = "pass" if {case.expected, *case.also_ok} & set(codes) else "misnamed"
    return [codes, report.verdict, result]


def _render(rows) -> str:
    lines = [f"{'case':42} {'expected':26} {'got':50} {'verdict':10} result"]
    for case, codes, verdict, result in rows:
        lines.append(f"{case.name:42} {case.expected or '-':26} {','.join(codes) or '-':50} {verdict:10} {result}")
    return "\n".join(lines)


@pytest.mark.parametrize("key", list(BY_KEY))
def test_case_keeps_its_part_of_the_rule(key, computed_once):
    """The parts of the rule that hold case by case: no finding on a correct case, no clean verdict on a buggy one."""
    case = BY_KEY[key]
    row = (case, *computed_once.row(key, _row))
    if case.buggy:
        assert row[2] not in ("clean", "checker-error"), _render([row])
    else:
        assert row[3] == "pass", _render([row])


@pytest.mark.parametrize("name", list(SETS))
def test_acceptance_rule(name, computed_once):
    keys = [f"{name}/{c.name}" for c in SETS[name]]
    rows = computed_once.rows(keys, _row)
    table = [(case, *row) for case, row in zip(SETS[name], rows, strict=True)]
    buggy = [r for r in table if r[0].buggy]
    named = [r for r in buggy if r[3] == "pass"]
    rate = len(named) / len(buggy)
    false = [r[0].name for r in table if not r[0].buggy and r[3] != "pass"]
    ok_on_bug = [r[0].name for r in buggy if r[2] == "clean"]
    msg = (
        f"\n{_render(table)}\n\nnamed {len(named)}/{len(buggy)} ({rate:.0%}, needs >= 90%); "
        f"false findings on correct cases: {false}; buggy cases with a clean verdict: {ok_on_bug}"
    )
    assert rate >= 0.9 and not false and not ok_on_bug, msg
