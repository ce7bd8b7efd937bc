"""``attnlab check``: run an attention function through the articles' tests and name the bug.

The target's module is imported, and the function called, in a worker process (:mod:`attnlab.checker.isolation`):
what it prints, how it exits and whatever it leaves running cannot reach this process's output or outlive it.

Exit status (:class:`attnlab.checker.ExitStatus`): 0 clean, 1 bug found, 2 usage error (bad target or option),
3 incomplete (no bug, but a core probe could not run), 4 checker failure (a bug in attnlab, or the report could not
be written). A run that takes over a second shows which probe runs on stderr when stderr is a terminal (not with
``NO_COLOR`` or ``--quiet``); ``--json`` prints one document of schema ``attnlab.check/1`` (:mod:`attnlab.schemas`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
from collections.abc import Mapping
from typing import IO, Any

from ..argtypes import float_type, int_type
from ..checker.report import ExitStatus
from ..checker.spec import MAX_TIMEOUT, options
from ..checker.target import TargetError
from ..checker.target import load_target as _load
from ..errors import one_line
from .terminal import is_terminal, stdout_gone, use_color

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
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # the epilog's lines as written
    parser.epilog = "exit status:\n" + ExitStatus.listing()
    parser.add_argument("target", help="path/to/file.py:func or package.module:func")
    for name, default, opt in options():
        if opt.cli is not False:
            parser.add_argument("--" + name.replace("_", "-"), **_flag_kwargs(name, default, opt))
    parser.add_argument("--json", action="store_true", help="print the report as JSON (schema attnlab.check/1)")
    parser.add_argument(
        "--width", type=int_type(minimum=20), default=None, help="columns of the text report (default: terminal)"
    )
    parser.add_argument(
        "--no-color", action="store_true", help="plain text without colour (also NO_COLOR=1; FORCE_COLOR=1 forces it)"
    )
    parser.add_argument(
        "--quiet", "-q", action="store_true", help="no progress display on stderr (shown only on a terminal)"
    )


def show_progress(stream: IO[Any] | Any, *, quiet: bool = False, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``attnlab check`` shows its progress on ``stream``: only on a terminal, never with ``quiet``
    (``--quiet``) or a non-empty ``NO_COLOR``; ``environ`` defaults to ``os.environ``.

    >>> import io
    >>> show_progress(io.StringIO(), environ={})
    False
    """
    env = os.environ if environ is None else environ
    return not (quiet or env.get("NO_COLOR")) and is_terminal(stream)


class CheckProgress:
    """A transient one-line display on ``stream`` (rich's progress bar) of the probe that runs, shown once the run
    has taken ``delay`` seconds (a quick check prints nothing) and erased when it ends. Called as
    ``progress(step, done, total)``; with ``enabled=False`` it does nothing."""

    def __init__(self, stream: IO[Any] | Any, *, enabled: bool, delay: float = 1.0) -> None:
        self.stream, self.enabled, self.delay = stream, enabled, delay
        self.bar: Any = None
        self.task: Any = None
        self.started = False
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None

    def __enter__(self) -> CheckProgress:
        if not self.enabled:
            return self
        try:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress
        except ImportError:  # the check extra is missing: no display (the report says how to install it)
            self.enabled = False
            return self
        console = Console(file=self.stream, stderr=True)
        self.bar = RichProgress(
            SpinnerColumn(),
            TextColumn("attnlab check: {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.task = self.bar.add_task("starting", total=None)
        self.timer = threading.Timer(self.delay, self._start)
        self.timer.daemon = True
        self.timer.start()
        return self

    def _start(self) -> None:
        with self.lock:
            if self.bar is not None and not self.started:
                self.started = True
                self.bar.start()

    def __call__(self, step: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        with self.lock:
            if self.bar is not None:
                self.bar.update(self.task, description=step, completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        if self.timer is not None:
            self.timer.cancel()
        with self.lock:
            if self.started:
                self.bar.stop()
            self.bar = None


def run(args: argparse.Namespace) -> int:
    """Run ``attnlab check`` with the parsed ``args`` and print the report; returns an
    :class:`~attnlab.checker.ExitStatus` (0 no bug, 1 a bug found, 2 usage error, 3 incomplete, 4 checker failure)."""
    from ..checker import UsageError, check

    chosen = {name: getattr(args, name) for name, _, opt in options() if opt.cli is not False}
    try:
        with CheckProgress(sys.stderr, enabled=show_progress(sys.stderr, quiet=args.quiet)) as progress:
            report = check(args.target, name=args.target, progress=progress, **_same_file_backward(args.target, chosen))
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
        color = use_color(sys.stdout, no_color=args.no_color)
        width = args.width or (shutil.get_terminal_size().columns if color else 100)
        try:
            text = report.render(width=width, color=color)
        except ImportError:
            text = report.to_text()
    if not _write(text):
        return ExitStatus.CHECKER_FAILURE
    return report.exit_status


def _same_file_backward(target: str, chosen: dict[str, Any]) -> dict[str, Any]:
    """``--backward NAME`` (``--mask-mod``, ``--score-mod``, ``--claims``) alone names a function in the target's
    file or module (``file.py:NAME``); a rule ``--claims`` names (``causal``) stays as it is."""
    from ..checker.spec import CLAIMS

    out = dict(chosen)
    for key in ("backward", "mask_mod", "score_mod", "claims"):
        b = chosen.get(key)
        if isinstance(b, str) and ":" not in b and b not in CLAIMS:
            out[key] = f"{target.rpartition(':')[0]}:{b}"
    return out


def _write(text: str) -> bool:
    """Write the report to stdout; False (and a line on stderr) when stdout is closed or broken."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except (OSError, ValueError) as err:
        if isinstance(err, BrokenPipeError):
            stdout_gone()  # nothing more reaches the pipe, and the interpreter's flush at exit raises nothing
        try:
            sys.stderr.write(f"attnlab check: could not write the report to stdout: {err}\n")
        except (OSError, ValueError):
            pass
        return False
    return True


def _failure_json(target: str, err: BaseException) -> str:
    import json

    from ..schemas import name

    return json.dumps(
        {
            "schema": name("check"),
            "command": "check",
            "target": target,
            "ok": False,
            "verdict": "checker-failure",
            "exit_status": int(ExitStatus.CHECKER_FAILURE),
            "error": f"{type(err).__name__}: {err}",
        },
        indent=2,
    )
