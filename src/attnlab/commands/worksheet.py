"""``attnlab worksheet``: a printable worksheet (HTML or Markdown, English or Chinese) of the articles' items and the
lab's prediction questions, the answers after a page break (:mod:`attnlab.lab.worksheet`).

A command of its own rather than ``attnlab explain --worksheet``: it writes one file from every item (and the lab's
questions), not one explanation, and ``explain``'s options (Q, K, V, masks, mistakes) have no meaning for it.
"""

from __future__ import annotations

import argparse
import sys

from ..argtypes import int_or_text

__all__ = ["add_arguments", "check_args", "run"]

NAME = "worksheet"
HELP = "write a printable worksheet (questions, then the answers on a new page)"


def add_arguments(parser: argparse.ArgumentParser, lang: str = "en") -> None:
    """worksheet's options, with their help in ``lang``."""
    from ..i18n import help_for

    h = help_for("help.worksheet", lang)

    parser.add_argument("-o", "--output", required=True, metavar="FILE", help=h("output"))
    parser.add_argument("--lang", choices=("en", "zh"), default=lang, help=h("lang"))
    parser.add_argument("--format", choices=("html", "markdown"), default=None, help=h("format"))
    parser.add_argument("--item", type=int_or_text, action="append", metavar="N", help=h("item"))
    parser.add_argument("--no-questions", action="store_true", help=h("no_questions"))


def check_args(args: argparse.Namespace) -> None:
    """Every option's value, before anything is written (an :class:`~attnlab.errors.OptionError` naming it)."""
    from ..articles import ITEMS
    from ..errors import OptionError
    from ..validate import check_int

    for n in args.item or ():
        check_int("--item", n, minimum=1, maximum=len(ITEMS))
    out = str(args.output)
    fmt = args.format or (
        "markdown" if out.endswith((".md", ".markdown")) else "html" if out.endswith((".html", ".htm")) else None
    )
    if fmt is None:
        raise OptionError(
            f"-o/--output: {out!r} ends in neither .html nor .md; name one or pass --format html|markdown"
        )
    args.format = fmt


def run(args: argparse.Namespace) -> int:
    """Build the worksheet and write it to ``--output``; prints the path."""
    from pathlib import Path

    from ..lab.worksheet import to_html, to_markdown, worksheet

    ws = worksheet(args.lang, items=tuple(args.item) if args.item else None, questions=not args.no_questions)
    text = to_html(ws) if args.format == "html" else to_markdown(ws)
    path = Path(args.output)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        sys.stderr.write(f"attnlab worksheet: error: -o/--output: cannot write {str(path)!r}: {err.strerror}\n")
        return 1
    from ..i18n import tr

    wrote = tr("worksheet.wrote", ws.lang, path=path, items=len(ws.items), questions=len(ws.questions))
    sys.stdout.write(f"attnlab worksheet: {wrote}\n")
    return 0
