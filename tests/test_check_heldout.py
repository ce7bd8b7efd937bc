"""The held-out acceptance set (issue 13): ``attnlab check`` on implementations its authors never read.

Rule: at least 90 % of the buggy cases named by their primary code, no finding on any correct case, and no buggy
case with a clean verdict. Every case runs in-process (``isolate=False``); the failure message is the whole table.
Each case is checked once per run (``computed_once``): its own test asserts its part of the rule, spread over the
workers, and the whole-set tests at the end read the same rows.
"""

from __future__ import annotations

import pytest
from heldout import all_cases, table_row

CASES = all_cases()
BY_KEY = {f"heldout/{c.name}": c for c in CASES}


def _row(key: str) -> list:
    """One case's row; the checker failing is a result, shown in the table."""
    try:
        return table_row(BY_KEY[key])
    except Exception as err:
        return [[], "checker-error", f"checker raised {type(err).__name__}: {err}"[:160]]


def _rows(computed_once) -> list[tuple]:
    rows = computed_once.rows(list(BY_KEY), _row)
    return [(case, tuple(codes), verdict, result) for case, (codes, verdict, result) in zip(CASES, rows, strict=True)]


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


@pytest.mark.parametrize("key", list(BY_KEY), ids=[c.name for c in CASES])
def test_case_keeps_its_part_of_the_rule(key, computed_once):
    """The rule's parts that hold case by case: no finding on a correct case, no clean verdict on a buggy one, and
    a second planted bug reported as a second finding."""
    case = BY_KEY[key]
    row = (case, *computed_once.row(key, _row))
    codes, verdict, result = row[1:]
    if case.buggy:
        assert verdict != "clean", _render([row])
    else:
        assert result == "pass", _render([row])
    assert not case.second or {case.expected, case.second} <= set(codes), _render([row])


# the whole set, after the per-case tests (so that in a parallel run these mostly read rows computed already)


def test_acceptance_rule(computed_once):
    table = _rows(computed_once)
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


def test_two_bugs_are_two_findings(computed_once):
    rows = [r for r in _rows(computed_once) if r[0].second]
    missing = [
        (r[0].name, r[0].expected, r[0].second, r[1]) for r in rows if not {r[0].expected, r[0].second} <= set(r[1])
    ]
    assert rows and not missing, missing
