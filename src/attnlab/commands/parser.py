"""The ``attnlab`` argument parser: every subcommand of :data:`attnlab.commands.COMMANDS` with its options.

:func:`attnlab.cli.main` parses with it; ``attnlab completion`` generates the shell's completion script from it.
"""

from __future__ import annotations

import argparse
import importlib
from typing import NoReturn

from . import COMMANDS

__all__ = ["build_parser"]


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


def build_parser(lang: str = "en") -> tuple[argparse.ArgumentParser, dict, dict]:
    """``(parser, modules, parsers)``: the ``attnlab`` parser, each subcommand's module and its subparser, by
    name; a command whose ``add_arguments`` takes ``lang`` writes its help in that language."""
    import inspect

    from .. import __version__
    from ..i18n import localize_parser

    parser = _Parser(prog="attnlab", description="Attention that is exact, checkable and visible.")
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules, parsers = {}, {}
    for name in COMMANDS:
        mod = importlib.import_module(f".{name}", __package__)
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
