"""The ``attnlab`` command: parse, call library functions that return data, print.

Each subcommand lives in its own module of :mod:`attnlab.commands`; this file only wires them together.

Exit status: 0 on success (for ``check`` and ``check-model``: no bug found), 1 when ``check``/``check-model`` find a
bug, 2 for a usage error; ``check`` also exits 3 when a core probe could not run and 4 when the checker itself failed
(:class:`attnlab.checker.ExitStatus`). A usage error is one line on stderr, ``attnlab COMMAND: error: --flag: what was
expected, got what``: a bad value (checked by the option's ``type=`` before anything runs), options that do not
fit together (the command's ``check_args(args)``, also before anything runs), a value outside a range that is
only known once a model or an example is loaded, or an :class:`~attnlab.errors.AttnlabError` raised by the work
itself. Any other exception is a bug in attnlab and keeps its traceback.

Standard output closed (``attnlab cost 8 >&-``) is one line on stderr and status 2 before anything runs; a reader
that goes away (``attnlab cost 8 16 | head -0``, a broken pipe) ends the command quietly with status 1, as
Python's documentation of ``SIGPIPE`` recommends. Colour follows ``--no-color``, then ``NO_COLOR``, then
``FORCE_COLOR``, then whether the stream is a terminal (:func:`use_color`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import IO, Any

from .commands import COMMANDS
from .errors import AttnlabError

__all__ = ["build_parser", "main", "one_line", "stdout_gone", "use_color"]


def _flag(names: str) -> str:
    """The long name among argparse's ``--batch/-B`` (else the first)."""
    parts = names.split("/")
    return next((p for p in parts if p.startswith("--")), parts[0])


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``attnlab cost: error: --batch: expected an int >= 1, got 0`` (no usage)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("argument ") and ": " in message:  # "argument --batch/-B: ..." -> "--batch: ..."
            names, rest = message[len("argument ") :].split(": ", 1)
            message = f"{_flag(names)}: {rest}"
        self.exit(2, f"{self.prog}: error: {message}\n")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> object:
        # Python 3.11's argparse drops the value of ``--flag=--`` and stores [] without calling the type
        if action.nargs is None and arg_strings == ["--"]:
            self.error(f"argument {'/'.join(action.option_strings) or action.dest}: expected a value, got '--'")
        return super()._get_values(action, arg_strings)


def build_parser(lang: str = "en") -> tuple[argparse.ArgumentParser, dict, dict]:
    """``(parser, modules, parsers)``: the ``attnlab`` parser, each subcommand's module and its subparser, by
    name; a command whose ``add_arguments`` takes ``lang`` writes its help in that language."""
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
    if sys.stdout is None:  # the process was started with standard output closed (``>&-``)
        if sys.stderr is not None:
            sys.stderr.write("attnlab: error: standard output is closed; redirect it to a file or /dev/null\n")
        return 2
    try:
        return _main(argv)
    except BrokenPipeError:  # the reader went away (``| head -0``): stop quietly
        stdout_gone()
        return 1


def stdout_gone() -> None:
    """Point standard output at ``os.devnull`` after a broken pipe, so that the interpreter's last flush at exit
    raises nothing more (the recipe of Python's documentation, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no file descriptor (a captured stream in tests)
        pass


def _main(argv: Sequence[str] | None) -> int:
    from .i18n import cli_lang

    parser, modules, parsers = build_parser(cli_lang(sys.argv[1:] if argv is None else argv))
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
        status = mod.run(args)
        sys.stdout.flush()  # a broken pipe shows here, not in the interpreter's flush at exit
        return status
    except AttnlabError as err:
        from .i18n import error_message, tr

        sys.stdout.flush()
        lang = getattr(args, "lang", "en")  # a command with --lang: its errors in that language
        msg = one_line(error_message(err, lang)) if lang != "en" else one_line(err)
        sys.stderr.write(tr("cli.error", lang, prog=f"attnlab {mod.NAME}", msg=msg) + "\n")
        return 2


def use_color(stream: IO[Any] | Any, *, no_color: bool = False, environ: Mapping[str, str] | None = None) -> bool:
    """Whether output to ``stream`` is coloured: never with ``no_color`` (``--no-color``) or a non-empty
    ``NO_COLOR`` (no-color.org); always with a non-empty ``FORCE_COLOR``; otherwise when ``stream`` is a terminal.
    ``environ`` defaults to ``os.environ``.

    >>> import io
    >>> use_color(io.StringIO(), environ={}), use_color(io.StringIO(), environ={"FORCE_COLOR": "1"})
    (False, True)
    >>> use_color(io.StringIO(), environ={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    False
    """
    env = os.environ if environ is None else environ
    if no_color or env.get("NO_COLOR"):
        return False
    if env.get("FORCE_COLOR"):
        return True
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except ValueError:  # a closed stream
        return False


def one_line(err: BaseException) -> str:
    """The message of ``err`` on one line (a library message that draws a mask has several)."""
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip())


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
