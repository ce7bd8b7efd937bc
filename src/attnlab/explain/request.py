"""What ``attnlab explain`` shows for one command line, as values: the command line and the lab both call these.

>>> from attnlab.explain.args import parse_explain_args
>>> shown = explain_args(parse_explain_args(["2x2", "--mistake", "no-scale"]))
>>> [m.name for m in shown.mistakes]
['no-scale']
>>> "no-scale" in shown.to_text() or "scale" in shown.to_text()
True
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

__all__ = ["Shown", "error_text", "explain_args", "explain_argv"]


@dataclass(frozen=True)
class Shown:
    """What ``attnlab explain`` shows: an ``explanation`` (:class:`~attnlab.explain.Explanation`) with the
    ``mistakes`` asked for (:class:`~attnlab.explain.Mistake`), or a plain ``text`` (``--list``, ``--positions``)."""

    explanation: Any = None
    mistakes: tuple[Any, ...] = ()
    text: str | None = None

    def to_text(self, width: int = 100) -> str:
        """The plain-text form (``--format text``)."""
        from .render import to_text

        return self.text if self.text is not None else to_text(self.explanation, list(self.mistakes), width=width)


def _modes(args: argparse.Namespace) -> list[str]:
    flags = (
        ("--tiled", args.tiled is not None),
        ("--mistake", bool(args.mistake)),
        ("--backward", bool(args.backward)),
        ("--dropout", args.dropout is not None),
    )
    return [f for f, on in flags if on]


def explain_args(args: argparse.Namespace) -> Shown:
    """What ``attnlab explain`` shows for ``args`` (its parsed options: :func:`~attnlab.explain.args.parse_explain_args`
    or the command line's parser), in ``args.lang``. Bad input raises the library's error
    (:class:`~attnlab.errors.AttnlabError`; :func:`error_text` is its line in the user's language)."""
    from ..errors import OptionError
    from ..i18n import localized
    from .args import MISTAKE_NAMES, examples_listing, setup_from_args

    lang = getattr(args, "lang", "en") or "en"
    if args.list:
        return Shown(text=examples_listing(lang))
    if args.positions:
        from .permutation import permutation_demo

        return Shown(text=permutation_demo().text(lang) + "\n")
    if args.example is None and not any((args.q, args.k, args.v, args.inputs)):
        raise localized(OptionError, "cli.need_input")
    modes = _modes(args)
    if len(modes) > 1:
        raise localized(OptionError, "cli.one_of", a=modes[0], b=modes[1])
    setup = setup_from_args(args)
    if isinstance(setup, str):
        if modes:
            raise localized(OptionError, "cli.needs_qk", flag=modes[0], name=setup)
        from . import explain_example

        return Shown(explain_example(setup, lang=lang))
    if args.tiled is not None:
        from .online import explain_online

        return Shown(explain_online(setup, args.tiled, lang=lang))
    if args.backward:
        from .inputs import load_matrix
        from .lessons import explain_backward

        g = None if args.grad_out is None else load_matrix(args.grad_out, "--grad-out")
        return Shown(explain_backward(setup, g, lang=lang))
    if args.dropout is not None:
        from .lessons import explain_dropout

        return Shown(explain_dropout(setup, args.dropout, seed=args.seed, lang=lang))
    from .mistakes import compare
    from .steps import explain_setup

    names = dict.fromkeys(n for m in (args.mistake or ()) for n in (MISTAKE_NAMES if m == "all" else (m,)))
    mistakes = tuple(compare(setup, n, heads=args.heads, lang=lang) for n in names)
    return Shown(explain_setup(setup, lang=lang), mistakes)


def error_text(err: BaseException, lang: str = "en") -> str:
    """``err`` (raised by :func:`explain_args`) as ``attnlab explain`` prints it: one line in ``lang``, with the
    command line's spelling of a causal alignment and a hint for fully masked rows."""
    from ..errors import AttnlabError, MaskedRowError
    from ..i18n import error_message
    from .i18n import tr
    from .steps import causal_align_error

    # the CLI spelling, not Python's (i18n.localized built the error: an AttnlabError with its i18n_fields)
    if isinstance(err, AttnlabError) and getattr(err, "i18n_key", None) == "input.causal_align":
        f = err.i18n_fields
        err = causal_align_error(f["n_q"], f["n_k"], how="cli.causal_hint")
    msg = error_message(err, lang)
    if isinstance(err, MaskedRowError):
        msg += tr("cli.masked_rows_hint", lang)
    line = " ".join(part.strip() for part in msg.splitlines() if part.strip())
    return tr("cli.error", lang, prog="attnlab explain", msg=line)


def explain_argv(argv: Any, lang: str = "en") -> tuple[int, str]:
    """``attnlab explain ARGV --format text --lang LANG`` as values: ``(exit status, text)``, the text being what
    it prints (its error line and status 2 for bad input). What the lab shows next to an article's item.

    >>> code, text = explain_argv(["2x2", "--tiled", "1", "--backward"])
    >>> code, text
    (2, 'attnlab explain: error: --tiled and --backward: give one of them\\n')
    """
    from ..errors import AttnlabError
    from .args import parse_explain_args

    try:
        args = parse_explain_args(argv, lang)
        args.lang = lang
        return 0, explain_args(args).to_text(args.width)
    except AttnlabError as err:
        return 2, error_text(err, lang) + "\n"
