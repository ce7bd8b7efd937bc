"""``attnlab check``: run an attention function through the articles' tests and name the bug.

The target's module is imported, and the function called, in a worker process (:mod:`attnlab.checker.isolation`):
what it prints, how it exits and whatever it leaves running cannot reach this process's output or outlive it.

Exit status (:class:`attnlab.checker.ExitStatus`): 0 clean, 1 bug found, 2 usage error (bad target or option),
3 incomplete (no bug, but a core probe could not run), 4 checker failure (a bug in attnlab).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import Any

from ..argtypes import float_type, int_type
from ..checker.spec import MAX_TIMEOUT, options
from ..checker.target import TargetError
from ..checker.target import load_target as _load
from ..errors import one_line

__all__ = ["add_arguments", "load_target", "run"]

NAME = "check"
HELP = "check an attention function (file.py:func or package.module:func) and name its bugs"


def load_target(target: str) -> Any:
    """The callable named by ``path/to/file.py:func`` or ``package.module:func``, imported in this process
    (``check-model`` uses it); any failure while importing is a :class:`TargetError`."""
    try:
        return _load(target)
    except TargetError:
        raise
    except Exception as err:
        where = target.rpartition(":")[0]
        raise TargetError(f"target {target!r}: importing {where} failed: {type(err).__name__}: {err}") from err


def _csv(value: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in value.split(",") if x.strip())


def _flag_kwargs(name: str, default: Any, opt: Any) -> dict[str, Any]:
    """``argparse.add_argument`` keywords of one :class:`~attnlab.checker.Spec` option, from its declaration."""
    help_text = opt.doc.replace("``", "").replace("%", "%%")
    kw: dict[str, Any] = {"dest": name, "help": help_text}
    if isinstance(opt.cli, dict):
        return {"default": default, **kw, **opt.cli}
    if opt.kind == "flag":
        return {**kw, "action": "store_true"}
    kw["default"] = default
    if opt.metavar:
        kw["metavar"] = opt.metavar
    if opt.kind == "choice":
        kw["choices"] = [c for c in opt.choices if c is not None]
    elif opt.kind == "names" or (opt.metavar or "").endswith(",..."):
        kw["type"] = _csv
    elif opt.kind == "seconds":
        expected = f"a number of seconds in (0, {MAX_TIMEOUT}]"
        kw["type"] = float_type(positive=True, maximum=MAX_TIMEOUT, expected=expected)
    elif opt.kind == "count":
        kw["type"] = int_type(minimum=0)
    return kw


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The target, one flag per :class:`~attnlab.checker.Spec` option (``mask_form`` -> ``--mask-form``; generated
    from the options' declarations, with their documentation as help), and how the report is printed."""
    parser.add_argument("target", help="path/to/file.py:func or package.module:func")
    for name, default, opt in options():
        if opt.cli is not False:
            parser.add_argument("--" + name.replace("_", "-"), **_flag_kwargs(name, default, opt))
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--width", type=int_type(minimum=20), default=None, help="columns of the text report (default: terminal)"
    )
    parser.add_argument("--no-color", action="store_true", help="plain text without colour")


def run(args: argparse.Namespace) -> int:
    """Run ``attnlab check`` with the parsed ``args`` and print the report; returns an
    :class:`~attnlab.checker.ExitStatus` (0 no bug, 1 a bug found, 2 usage error, 3 incomplete, 4 checker failure)."""
    from ..checker import ExitStatus, UsageError, check

    chosen = {name: getattr(args, name) for name, _, opt in options() if opt.cli is not False}
    try:
        report = check(args.target, name=args.target, **_same_file_backward(args.target, chosen))
    except UsageError as err:
        sys.stderr.write(f"attnlab check: error: {one_line(err)}\n")
        return ExitStatus.USAGE
    except Exception as err:  # a bug in the checker itself: say so, with a distinct status
        import traceback

        sys.stderr.write(f"attnlab check: checker failure (a bug in attnlab): {type(err).__name__}: {err}\n")
        sys.stderr.write(traceback.format_exc(limit=-4))
        if args.json:
            _write(_failure_json(args.target, err) + "\n")
        return ExitStatus.CHECKER_FAILURE
    if args.json:
        text = report.to_json() + "\n"  # built whole, then written once: stdout holds one JSON document
    else:
        color = not args.no_color and sys.stdout.isatty()
        width = args.width or (shutil.get_terminal_size().columns if color else 100)
        try:
            text = report.render(width=width, color=color)
        except ImportError:
            text = report.to_text()
    if not _write(text):
        return ExitStatus.CHECKER_FAILURE
    return report.exit_status


def _same_file_backward(target: str, chosen: dict[str, Any]) -> dict[str, Any]:
    """``--backward NAME`` alone names a function in the target's file or module (``file.py:NAME``)."""
    b = chosen.get("backward")
    if isinstance(b, str) and ":" not in b:
        return {**chosen, "backward": f"{target.rpartition(':')[0]}:{b}"}
    return chosen


def _write(text: str) -> bool:
    """Write the report to stdout; False (and a line on stderr) when stdout is closed or broken."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except (OSError, ValueError) as err:
        try:
            sys.stderr.write(f"attnlab check: could not write the report to stdout: {err}\n")
        except (OSError, ValueError):
            pass
        return False
    return True


def _failure_json(target: str, err: BaseException) -> str:
    import json

    from ..checker import ExitStatus

    return json.dumps(
        {
            "command": "check",
            "target": target,
            "ok": False,
            "verdict": "checker-failure",
            "exit_status": int(ExitStatus.CHECKER_FAILURE),
            "error": f"{type(err).__name__}: {err}",
        },
        indent=2,
    )
