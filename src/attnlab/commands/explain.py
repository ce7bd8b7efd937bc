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
    o.add_argument("--heads", type=int, default=8, help="heads for --mistake sqrt-d-model: d_model = heads·d_k (8)")
    o.add_argument(
        "--format",
        choices=("auto", "rich", "text", "markdown", "json"),
        default="auto",
        help="auto: rich tables in a terminal, plain text in a pipe",
    )
    o.add_argument("--width", type=int, default=100, help="line width of the text format (default 100)")
    o.add_argument(
        "--tiled",
        type=int,
        metavar="B",
        help="FlashAttention's online softmax instead: the keys in blocks of B, a running max, sum and accumulator",
    )
    o.add_argument(
        "--positions",
        action="store_true",
        help="article 001 §16: permuting the tokens permutes the outputs, unless positions (RoPE) are added",
    )


def _error(msg: str, code: int = 1) -> int:
    sys.stderr.write(f"attnlab explain: error: {msg}\n")
    return code


def run(args: argparse.Namespace) -> int:
    from ..errors import AttnlabError, MaskedRowError
    from ..explain import compare, explain_example, explain_online, explain_setup, to_dict, to_markdown, to_text
    from ..explain.args import setup_from_args

    if args.list:
        sys.stdout.write(examples_listing())
        return 0
    if args.positions:
        from ..core.rope import permutation_demo

        sys.stdout.write(permutation_demo().text() + "\n")
        return 0
    if args.example is None and not any((args.q, args.k, args.v, args.inputs)):
        return _error("give a named example (see --list) or your matrices with --q, --k and --v", 2)
    try:
        setup = setup_from_args(args)
        names = list(dict.fromkeys(n for m in (args.mistake or ()) for n in (_MISTAKES if m == "all" else (m,))))
        if isinstance(setup, str):
            if names or args.tiled is not None:
                flag = "--mistake" if names else "--tiled"
                return _error(f"{flag} needs Q and K; the example {setup!r} does not start from them", 2)
            e = explain_example(setup)
            mistakes = []
        elif args.tiled is not None:
            if names:
                return _error("--tiled and --mistake: give one of them", 2)
            e = explain_online(setup, args.tiled)
            mistakes = []
        else:
            e = explain_setup(setup)
            mistakes = [compare(setup, n, heads=args.heads) for n in names]
    except (AttnlabError, ValueError, KeyError, FileNotFoundError) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        if isinstance(err, MaskedRowError):
            msg += " (on the command line: --masked-rows zero or --masked-rows nan)"
        return _error(msg)
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
