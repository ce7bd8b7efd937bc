"""``attnlab explain``: attention computed by hand, every step from Q Kᵀ to the output, with the classic mistakes.

Examples::

    attnlab explain 2x2-causal
    attnlab explain --q "1,0;0,1" --k "1,0;0,1" --v "10,0;0,20" --causal --temperature 2
    attnlab explain mask-order --mistake softmax-then-mask
    attnlab explain causal-4 --mistake all --format markdown
    attnlab explain --positions        # why attention needs positions: permutation with and without RoPE
    attnlab explain causal-4 --tiled 2 # FlashAttention's online softmax, keys in blocks of 2
    attnlab explain 2x2 --backward     # article 001 §9: dV, dA, dS, dQ, dK by hand, checked
    attnlab explain causal-4 --dropout 0.5 --seed 0
    attnlab explain variance --lang zh # a lesson, in Chinese
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..argtypes import int_type, probability
from ..explain.args import add_input_arguments, add_lang_argument, examples_listing

NAME = "explain"
HELP = "compute attention by hand, step by step (named examples or your matrices)"

_MISTAKES = ("softmax-then-mask", "no-scale", "sqrt-d-model", "query-axis", "inverted-mask")


def add_arguments(parser: argparse.ArgumentParser, lang: str = "en") -> None:
    """explain's options, with their help in ``lang`` (the command line's language: :func:`attnlab.i18n.cli_lang`)."""
    from ..explain.i18n import tr
    from ..i18n import localize_type

    def h(key: str, **fields: object) -> str:
        return tr(f"help.{key}", lang, **fields)

    def mv(key: str) -> str | None:  # argparse's default metavar (the option's name) in English
        return None if lang == "en" else h(f"metavar.{key}")

    add_input_arguments(parser, lang)
    o = parser.add_argument_group(h("group.output"))
    names = (*_MISTAKES, "all")
    o.add_argument(
        "--mistake",
        action="append",
        choices=names,
        type=localize_type(None, lang, "argtype.choice", choices=names),
        metavar=h("metavar.name"),
        help=h("mistake", names=", ".join(_MISTAKES)),
    )
    heads = localize_type(int_type(minimum=1, maximum=2**20), lang, "argtype.int_range", lo=1, hi=2**20)
    o.add_argument("--heads", type=heads, default=8, metavar=mv("heads"), help=h("heads"))
    formats = ("auto", "rich", "text", "markdown", "json")
    fmt = localize_type(None, lang, "argtype.choice", choices=formats)
    o.add_argument("--format", choices=formats, type=fmt, default="auto", help=h("format"))
    width = localize_type(int_type(minimum=20), lang, "argtype.int", lo=20)
    o.add_argument("--width", type=width, default=100, metavar=mv("width"), help=h("width"))
    o.add_argument(
        "--tiled", type=localize_type(int_type(minimum=1), lang, "argtype.int", lo=1), metavar="B", help=h("tiled")
    )
    add_lang_argument(o, lang)
    o.add_argument("--backward", action="store_true", help=h("backward"))
    o.add_argument("--grad-out", metavar="G", help=h("grad_out"))
    o.add_argument(
        "--dropout", type=localize_type(probability, lang, "argtype.probability"), metavar="P", help=h("dropout")
    )
    seed = localize_type(int_type(minimum=0), lang, "argtype.int", lo=0)
    o.add_argument("--seed", type=seed, default=0, metavar=mv("seed"), help=h("seed"))
    o.add_argument("--positions", action="store_true", help=h("positions"))


def _lang(args: argparse.Namespace) -> str:
    return getattr(args, "lang", "en") or "en"


def _modes(args: argparse.Namespace) -> list[str]:
    flags = (
        ("--tiled", args.tiled is not None),
        ("--mistake", bool(args.mistake)),
        ("--backward", bool(args.backward)),
        ("--dropout", args.dropout is not None),
    )
    return [f for f, on in flags if on]


def _error(msg: str, lang: str) -> int:
    from ..explain.i18n import tr

    sys.stdout.flush()
    line = " ".join(part.strip() for part in msg.splitlines() if part.strip())
    sys.stderr.write(tr("cli.error", lang, prog="attnlab explain", msg=line) + "\n")
    return 2


def run(args: argparse.Namespace) -> int:
    from ..errors import AttnlabError, MaskedRowError
    from ..explain import compare, explain_example, explain_online, explain_setup, to_dict, to_markdown, to_text
    from ..explain.args import setup_from_args
    from ..explain.i18n import tr
    from ..explain.steps import causal_align_error
    from ..i18n import error_message

    lang = _lang(args)
    if args.list:
        sys.stdout.write(examples_listing(lang))
        return 0
    if args.positions:
        from ..explain.permutation import permutation_demo

        sys.stdout.write(permutation_demo().text(lang) + "\n")
        return 0
    if args.example is None and not any((args.q, args.k, args.v, args.inputs)):
        return _error(tr("cli.need_input", lang), lang)
    modes = _modes(args)
    if len(modes) > 1:
        return _error(tr("cli.one_of", lang, a=modes[0], b=modes[1]), lang)
    try:
        setup = setup_from_args(args)
        names = list(dict.fromkeys(n for m in (args.mistake or ()) for n in (_MISTAKES if m == "all" else (m,))))
        if isinstance(setup, str):
            if modes:
                return _error(tr("cli.needs_qk", lang, flag=modes[0], name=setup), lang)
            e = explain_example(setup, lang=lang)
            mistakes: list[Any] = []
        elif args.tiled is not None:
            e = explain_online(setup, args.tiled, lang=lang)
            mistakes = []
        elif args.backward:
            from ..explain.inputs import load_matrix
            from ..explain.lessons import explain_backward

            g = None if args.grad_out is None else load_matrix(args.grad_out, "--grad-out")
            e = explain_backward(setup, g, lang=lang)
            mistakes = []
        elif args.dropout is not None:
            from ..explain.lessons import explain_dropout

            e = explain_dropout(setup, args.dropout, seed=args.seed, lang=lang)
            mistakes = []
        else:
            e = explain_setup(setup, lang=lang)
            mistakes = [compare(setup, n, heads=args.heads, lang=lang) for n in names]
    except AttnlabError as err:  # one line, exit 2 (cli.main's convention), in the user's language
        if getattr(err, "i18n_key", None) == "input.causal_align":  # the CLI spelling, not Python's
            f = err.i18n_fields
            err = causal_align_error(f["n_q"], f["n_k"], how="cli.causal_hint")
        msg = error_message(err, lang)
        if isinstance(err, MaskedRowError):
            msg += tr("cli.masked_rows_hint", lang)
        return _error(msg, lang)
    fmt = args.format
    if fmt == "auto":
        fmt = "text"
        if sys.stdout.isatty():
            try:
                import rich  # noqa: F401  # only whether rich is installed

                fmt = "rich"
            except ImportError:
                pass
    if fmt == "json":
        sys.stdout.write(json.dumps(to_dict(e, mistakes), indent=2, ensure_ascii=False) + "\n")
    elif fmt == "markdown":
        sys.stdout.write(to_markdown(e, mistakes))
    elif fmt == "rich":
        from ..explain import print_rich

        print_rich(e, mistakes)
    else:
        sys.stdout.write(to_text(e, mistakes, width=args.width))
    return 0
