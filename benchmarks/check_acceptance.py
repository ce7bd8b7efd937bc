"""The held-out acceptance table of ``attnlab check`` (issues 13 and 14): every case of ``tests/heldout/`` through
the checker, in-process, with what was expected, what was found and the verdict, then the acceptance rates.

Run: ``PYTHONPATH=src python benchmarks/check_acceptance.py`` (the forward set; ``--backward`` the held-out backward
passes of ``tests/heldout/backward_passes.py``; ``--set 2`` the second held-out sets, ``tests/heldout2/`` and
``tests/heldout2_backward/``, written later by other authors; ``--set 3`` the third set, ``tests/heldout3/``, forward
and gradient cases rebuilt from public bug reports by an author who never read the checker (issue 20); ``--set 4``
the fourth, ``tests/heldout4/``, made the same way from other reports; ``--json`` for machine-readable rows). Exit
status 0 when the acceptance rule holds, 1 when it does not.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from heldout import judge, run_case


def forward_cases(which: int) -> list:
    if which == 2:
        from heldout2 import all_cases
    else:
        from heldout import all_cases
    return all_cases()


def backward_cases(which: int) -> list:
    if which == 2:
        from heldout2_backward import CASES
    else:
        from heldout.backward_passes import CASES
    return CASES


def rows(cases: list) -> list[dict]:
    out = []
    for case in cases:
        t0 = time.perf_counter()
        try:
            report = run_case(case)
        except Exception as err:  # the checker itself failed: that is a result too
            out.append(
                {
                    "case": case.name,
                    "expected": case.expected or "-",
                    "second": case.second or "",
                    "got": f"checker raised {type(err).__name__}: {err}"[:200],
                    "verdict": "checker-error",
                    "result": "checker error",
                    "seconds": time.perf_counter() - t0,
                    "buggy": case.buggy,
                }
            )
            continue
        codes = [f.code for f in report.findings]
        out.append(
            {
                "case": case.name,
                "expected": case.expected or "-",
                "second": case.second or "",
                "got": ",".join(codes) or "-",
                "verdict": report.verdict,
                "result": judge(case, report),
                "second_found": bool(case.second and case.second in codes),
                "seconds": time.perf_counter() - t0,
                "buggy": case.buggy,
            }
        )
    return out


def backward_rows(cases: list) -> list[dict]:
    """The held-out backward passes (``attnlab check --backward`` / ``check_backward``), as :func:`rows`."""
    from heldout.backward_passes import run_check

    out = []
    for case in cases:
        t0 = time.perf_counter()
        report = run_check(case)
        codes = [f.code for f in report.findings]
        if case.primary:
            result = "pass" if case.primary in codes else ("OK on a bug" if report.ok else "misnamed")
        else:
            result = "pass" if not codes else "false finding"
        out.append(
            {
                "case": case.name,
                "expected": case.primary or "-",
                "second": "",
                "got": ",".join(codes) or "-",
                "verdict": report.verdict,
                "result": result,
                "second_found": False,
                "seconds": time.perf_counter() - t0,
                "buggy": bool(case.primary),
            }
        )
    return out


def file_set_rows(which: int) -> list[dict]:
    """A held-out set of case files (``tests/heldout3/``, ``tests/heldout4/``: forward and backward cases in one
    table), as :func:`rows`: a buggy case passes when its ``EXPECTED`` code (or one of its ``ALSO_OK`` codes) is
    among the findings."""
    import importlib

    import attnlab

    out = []
    for case in importlib.import_module(f"heldout{which}").load_cases():
        t0 = time.perf_counter()
        try:
            report = attnlab.check(case.target, isolate=False, name=case.name, **case.check_options())
            codes = [f.code for f in report.findings]
            verdict = report.verdict
        except Exception as err:  # the checker itself failed: that is a result too
            codes, verdict = [f"checker raised {type(err).__name__}: {err}"[:200]], "checker-error"
        named = {case.expected, *case.also_ok} & set(codes) if case.buggy else set()
        if verdict == "checker-error":
            result = "checker error"
        elif not case.buggy:
            result = "pass" if not codes else "false finding"
        else:
            result = "pass" if named else ("OK on a bug" if verdict == "clean" else "misnamed")
        out.append(
            {
                "case": case.name,
                "kind": case.kind,
                "expected": case.expected or "-",
                "second": "",
                "got": ",".join(codes) or "-",
                "verdict": verdict,
                "result": result,
                "strict": bool(case.buggy and case.expected in codes),
                "second_found": False,
                "seconds": time.perf_counter() - t0,
                "buggy": case.buggy,
            }
        )
    return out


def summary(table: list[dict]) -> dict:
    buggy = [r for r in table if r["buggy"]]
    correct = [r for r in table if not r["buggy"]]
    named = sum(r["result"] == "pass" for r in buggy)
    ok_on_bug = [r["case"] for r in buggy if r["verdict"] == "clean"]
    false = [r["case"] for r in correct if r["result"] != "pass"]
    seconds = [r for r in table if r["second"]]
    return {
        "buggy": len(buggy),
        "correct": len(correct),
        "named": named,
        "named_rate": named / len(buggy) if buggy else 1.0,
        "false_findings": false,
        "ok_on_bug": ok_on_bug,
        "second_bug_found": f"{sum(r.get('second_found', False) for r in seconds)}/{len(seconds)}",
        "accepted": (named >= 0.9 * len(buggy)) and not false and not ok_on_bug,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows and the summary as JSON")
    ap.add_argument("--backward", action="store_true", help="the held-out backward passes instead of the forward set")
    ap.add_argument("--set", type=int, choices=(1, 2, 3, 4), default=1, help="the held-out set: 1 (default) to 4")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.set >= 3:  # one table: its forward and backward cases
        table = file_set_rows(args.set)
    else:
        table = backward_rows(backward_cases(args.set)) if args.backward else rows(forward_cases(args.set))
    s = summary(table)
    if args.json:
        print(json.dumps({"rows": table, "summary": s}, indent=1))
        return 0 if s["accepted"] else 1
    w = max(len(r["case"]) for r in table)
    print(f"{'case':{w}}  {'expected':29} {'got':52} {'verdict':11} result")
    for r in table:
        exp = r["expected"] + (f"+{r['second']}" if r["second"] else "")
        print(f"{r['case']:{w}}  {exp:29} {r['got'][:52]:52} {r['verdict']:11} {r['result']}")
    print()
    print(f"buggy cases named by their primary code: {s['named']}/{s['buggy']} ({s['named_rate']:.0%}; needs >= 90%)")
    print(f"correct cases with a finding: {len(s['false_findings'])}/{s['correct']} {s['false_findings'] or ''}")
    print(f"buggy cases with a clean verdict: {len(s['ok_on_bug'])} {s['ok_on_bug'] or ''}")
    print(f"second planted bug reported too: {s['second_bug_found']}")
    for kind in sorted({r["kind"] for r in table if "kind" in r}):
        mine = [r for r in table if r.get("kind") == kind and r["buggy"]]
        strict = sum(r["strict"] for r in mine)
        named = sum(r["result"] == "pass" for r in mine)
        print(f"  {kind}: {named}/{len(mine)} named ({strict} by EXPECTED itself)")
    print(f"acceptance: {'MET' if s['accepted'] else 'NOT MET'} ({time.perf_counter() - t0:.1f} s)")
    return 0 if s["accepted"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
