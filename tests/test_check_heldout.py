"""The held-out acceptance set (issue 13): ``attnlab check`` on implementations its authors never read.

Rule: at least 90 % of the buggy cases named by their primary code, no finding on any correct case, and no buggy
case with a clean verdict. Every case runs in-process (``isolate=False``); the failure message is the whole table.
"""

from __future__ import annotations

import warnings

import pytest
from heldout import all_cases, judge, run_case

CASES = all_cases()


@pytest.fixture(scope="module")
def table():
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the checked code's own RuntimeWarnings (NaN rows, overflow) are expected
        for case in CASES:
            try:
                report = run_case(case)
            except Exception as err:  # the checker failing is a result, shown in the table
                rows.append((case, (), "checker-error", f"checker raised {type(err).__name__}: {err}"[:160]))
                continue
            rows.append((case, tuple(f.code for f in report.findings), report.verdict, judge(case, report)))
    return rows


def _render(rows) -> str:
    lines = [f"{'case':42} {'expected':30} {'got':50} {'verdict':10} result"]
    for case, codes, verdict, result in rows:
        exp = (case.expected or "-") + (f"+{case.second}" if case.second else "")
        lines.append(f"{case.name:42} {exp:30} {','.join(codes) or '-':50} {verdict:10} {result}")
    return "\n".join(lines)


def test_the_set_is_large_and_varied():
    buggy = [c for c in CASES if c.buggy]
    correct = [c for c in CASES if not c.buggy]
    assert len(buggy) >= 35 and len(correct) >= 20
    assert all(c.source for c in CASES)
    forms = {c.options.get("mask_form", "full") for c in CASES}
    assert forms == {"full", "batch", "key_padding", "valid_lens", "kv_cache", "varlen"}


def test_acceptance_rule(table):
    buggy = [r for r in table if r[0].buggy]
    named = [r for r in buggy if r[3] == "pass"]
    false = [r[0].name for r in table if not r[0].buggy and r[3] != "pass"]
    ok_on_bug = [r[0].name for r in buggy if r[2] == "clean"]
    rate = len(named) / len(buggy)
    msg = (
        f"\n{_render(table)}\n\nnamed {len(named)}/{len(buggy)} ({rate:.0%}, needs >= 90%); "
        f"false findings on correct cases: {false}; buggy cases with a clean verdict: {ok_on_bug}"
    )
    assert rate >= 0.9 and not false and not ok_on_bug, msg


def test_two_bugs_are_two_findings(table):
    rows = [r for r in table if r[0].second]
    missing = [
        (r[0].name, r[0].expected, r[0].second, r[1]) for r in rows if not {r[0].expected, r[0].second} <= set(r[1])
    ]
    assert rows and not missing, missing
