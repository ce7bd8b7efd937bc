"""The ``attnlab`` command: parse, call library functions that return data, print.

Each subcommand lives in its own module of :mod:`attnlab.commands`; this file only wires them together.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

from .commands import COMMANDS

__all__ = ["main"]


def _build_parser() -> tuple[argparse.ArgumentParser, dict]:
    from . import __version__

    parser = argparse.ArgumentParser(prog="attnlab", description="Attention that is exact, checkable and visible.")
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name in COMMANDS:
        mod = importlib.import_module(f".commands.{name}", __package__)
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=(mod.__doc__ or "").strip().splitlines()[0])
        mod.add_arguments(p)
        modules[mod.NAME] = mod
    return parser, modules


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    Usage errors exit with 2 (argparse's convention).
    """
    parser, modules = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    return modules[args.command].run(args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
