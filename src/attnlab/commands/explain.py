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

from ..explain.args import add_explain_arguments

__all__ = ["add_arguments", "run"]

NAME = "explain"
HELP = "compute attention by hand, step by step (named examples or your matrices)"


def add_arguments(parser: argparse.ArgumentParser, lang: str = "en") -> None:
    """explain's options, with their help in ``lang`` (the command line's language: :func:`attnlab.i18n.cli_lang`)."""
    add_explain_arguments(parser, lang)


def run(args: argparse.Namespace) -> int:
    """Print the explanation the parsed ``args`` ask for (a named example, the user's matrices, a lesson, or the
    list of names) in the chosen format; returns 0, or 2 (one line on stderr) for input that does not fit."""
    from ..errors import AttnlabError
    from ..explain import print_rich, to_dict, to_markdown
    from ..explain.request import error_text, explain_args

    lang = getattr(args, "lang", "en") or "en"
    try:
        shown = explain_args(args)
    except AttnlabError as err:  # one line, exit 2 (cli.main's convention), in the user's language
        sys.stdout.flush()
        sys.stderr.write(error_text(err, lang) + "\n")
        return 2
    fmt = args.format
    if fmt == "auto":
        from .terminal import use_color

        fmt = "text"  # rich on a terminal (rich itself drops colour with NO_COLOR) or with FORCE_COLOR
        if sys.stdout.isatty() or use_color(sys.stdout):
            try:
                import rich  # noqa: F401  # only whether rich is installed

                fmt = "rich"
            except ImportError:
                pass
    e, mistakes = shown.explanation, list(shown.mistakes)
    if shown.text is not None or fmt == "text":
        sys.stdout.write(shown.to_text(args.width))
    elif fmt == "json":
        from ..schemas import name as schema_name

        doc = {"schema": schema_name("explain"), **to_dict(e, mistakes)}
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    elif fmt == "markdown":
        sys.stdout.write(to_markdown(e, mistakes))
    else:
        print_rich(e, mistakes)
    return 0
