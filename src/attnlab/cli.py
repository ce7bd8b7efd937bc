"""The ``attnlab`` command: parse, call library functions that return data, print.

Each subcommand lives in its own module of :mod:`attnlab.commands`; this file only wires them together.

Exit status: 0 on success (for ``check`` and ``check-model``: no bug found), 1 when ``check``/``check-model`` find a
bug, 2 for a usage error; ``check`` also exits 3 when a core probe could not run and 4 when the checker itself failed
(:class:`attnlab.checker.ExitStatus`). A usage error is one line on stderr, ``attnlab COMMAND: error: --flag: what was
expected, got what``: a bad value (checked by the option's ``type=`` before anything runs), options that do not
fit together (the command's ``check_args(args)``, also before anything runs), a value outside a range that is
only known once a model or an example is loaded, or an :class:`~attnlab.errors.AttnlabError` raised by the work
itself. Any other exception is a bug in attnlab and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from .commands import COMMANDS
from .errors import AttnlabError

__all__ = ["main", "one_line"]


def _flag(names: str) -> str:
    """The long name among argparse's ``--batch/-B`` (else the first)."""
    parts = names.split("/")
    return next((p for p in parts if p.startswith("--")), parts[0])


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``attnlab cost: error: --batch: expected an int >= 1, got 0`` (no usage)."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("argument ") and ": " in message:  # "argument --batch/-B: ..." -> "--batch: ..."
            names, rest = message[len("argument ") :].split(": ", 1)
            message = f"{_flag(names)}: {rest}"
        self.exit(2, f"{self.prog}: error: {message}\n")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> object:
        # Python 3.11's argparse drops the value of ``--flag=--`` and stores [] without calling the type
        if action.nargs is None and arg_strings == ["--"]:
            self.error(f"argument {'/'.join(action.option_strings) or action.dest}: expected a value, got '--'")
        return super()._get_values(action, arg_strings)


def _build_parser(lang: str = "en") -> tuple[argparse.ArgumentParser, dict, dict]:
    """The parser; a command whose ``add_arguments`` takes ``lang`` writes its help in that language."""
    import inspect

    from . import __version__
    from .i18n import localize_parser

    parser = _Parser(prog="attnlab", description="Attention that is exact, checkable and visible.")
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules, parsers = {}, {}
    for name in COMMANDS:
        mod = importlib.import_module(f".commands.{name}", __package__)
        localized = "lang" in inspect.signature(mod.add_arguments).parameters
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=(mod.__doc__ or "").strip().splitlines()[0])
        if localized:
            mod.add_arguments(p, lang=lang)
            localize_parser(p, lang, command=mod.NAME)
        else:
            mod.add_arguments(p)
        modules[mod.NAME] = mod
        parsers[mod.NAME] = p
    return parser, modules, parsers


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status (see the module)."""
    from .i18n import cli_lang

    parser, modules, parsers = _build_parser(cli_lang(sys.argv[1:] if argv is None else argv))
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            (parsers[args.command] if args.command else parser).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # --help, --version and usage errors
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    mod = modules[args.command]
    try:
        check_args = getattr(mod, "check_args", None)
        if check_args is not None:
            check_args(args)
        return mod.run(args)
    except AttnlabError as err:
        from .i18n import error_message, tr

        sys.stdout.flush()
        lang = getattr(args, "lang", "en")  # a command with --lang: its errors in that language
        msg = one_line(error_message(err, lang)) if lang != "en" else one_line(err)
        sys.stderr.write(tr("cli.error", lang, prog=f"attnlab {mod.NAME}", msg=msg) + "\n")
        return 2


def one_line(err: BaseException | str) -> str:
    """The message of ``err`` on one line (a library message that draws a mask has several)."""
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip())


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
