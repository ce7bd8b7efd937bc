"""``attnlab explain``: attention computed by hand, every step from Q Kᵀ to the output, with the classic mistakes.

Examples::

    attnlab explain 2x2-causal
    attnlab explain --q "1,0;0,1" --k "1,0;0,1" --v "10,0;0,20" --causal --temperature 2
    attnlab explain mask-order --mistake softmax-then-mask
    attnlab explain causal-4 --mistake all --format markdown
    attnlab explain --positions        # why attention needs positions: permutation with and without RoPE
    attnlab explain causal-4 --tiled 2 # FlashAttention's online softmax, keys in blocks of 2
"""

from __future__ import annotations

import argparse
import json
import sys

from ..argtypes import int_type
from ..explain.args import add_input_arguments, examples_listing

NAME = "explain"
HELP = "compute attention by hand, step by step (named examples or your matrices)"

_MISTAKES = ("softmax-then-mask", "no-scale", "sqrt-d-model", "query-axis", "inverted-mask")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser)
    o = parser.add_argument_group("output")
    o.add_argument(
        "--mistake",
        action="append",
        choices=(*_MISTAKES, "all"),
        metavar="NAME",
        help=f"show a classic mistake next to the right computation: {', '.join(_MISTAKES)}, or all (repeatable)",
    )
    o.add_argument(
        "--heads",
        type=int_type(minimum=1, maximum=2**20),
        default=8,
        help="heads for --mistake sqrt-d-model: d_model = heads·d_k (8)",
    )
    o.add_argument(
        "--format",
        choices=("auto", "rich", "text", "markdown", "json"),
        default="auto",
        help="auto: rich tables in a terminal, plain text in a pipe",
    )
    o.add_argument(
        "--width", type=int_type(minimum=20), default=100, help="line width of the text format (>= 20, default 100)"
    )
    o.add_argument(
        "--tiled",
        type=int_type(minimum=1),
        metavar="B",
        help="FlashAttention's online softmax instead: the keys in blocks of B, a running max, sum and accumulator",
    )
    o.add_argument(
        "--positions",
        action="store_true",
        help="article 001 §16: permuting the tokens permutes the outputs, unless positions (RoPE) are added",
    )


def check_args(args: argparse.Namespace) -> None:
    """Options that do not fit together, before anything is computed."""
    from ..errors import OptionError

    if args.list or args.positions:
        return
    if args.example is None and not any((args.q, args.k, args.v, args.inputs)):
        raise OptionError("give a named example (see --list) or your matrices with --q, --k and --v")
    if args.tiled is not None and args.mistake:
        raise OptionError("--tiled and --mistake: give one of them")


def run(args: argparse.Namespace) -> int:
    from ..errors import MaskedRowError
    from ..explain import compare, explain_example, explain_online, explain_setup, to_dict, to_markdown, to_text
    from ..explain.args import setup_from_args

    if args.list:
        sys.stdout.write(examples_listing())
        return 0
    if args.positions:
        from ..core.rope import permutation_demo

        sys.stdout.write(permutation_demo().text() + "\n")
        return 0
    setup = setup_from_args(args)
    names = list(dict.fromkeys(n for m in (args.mistake or ()) for n in (_MISTAKES if m == "all" else (m,))))
    try:
        if isinstance(setup, str):
            if names or args.tiled is not None:
                from ..errors import OptionError

                flag = "--mistake" if names else "--tiled"
                raise OptionError(f"{flag} needs Q and K; the example {setup!r} does not start from them")
            e = explain_example(setup)
            mistakes = []
        elif args.tiled is not None:
            e = explain_online(setup, args.tiled)
            mistakes = []
        else:
            e = explain_setup(setup)
            mistakes = [compare(setup, n, heads=args.heads) for n in names]
    except MaskedRowError as err:
        raise type(err)(f"{err} (on the command line: --masked-rows zero or --masked-rows nan)", err.rows) from None
    fmt = args.format
    if fmt == "auto":
        fmt = "text"
        if sys.stdout.isatty():
            try:
                import rich  # noqa: F401

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
