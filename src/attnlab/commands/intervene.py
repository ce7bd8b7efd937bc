"""``attnlab intervene``: does a token that gets much attention actually matter? Delete or replace it and see.

For each source token, side by side: the attention it receives (per head and averaged) and the effect of deleting
or replacing it. SmolLM2 (default): the query is the target position (default the last token) and the effect is
the change of the predicted next token's log-probability and the KL divergence of the next-token distribution.
MiniLM: the attention each word piece receives from all queries, and the change of the sentence embedding.
Prints a table and a plain-words reading; ``--plot`` draws both as bars plus a heads × tokens map.

Examples::

    attnlab intervene "The capital of France is"
    attnlab intervene "The capital of France is" --method replace --replacement " Germany" --layer 20
    attnlab intervene --model minilm "A cat sat on the warm mat." --plot cat.png
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..argtypes import int_type, output_file, text_type

__all__ = ["add_arguments", "check_args", "run"]

NAME = "intervene"
HELP = "attention received vs. the effect of deleting/replacing each token (SmolLM2 or MiniLM)"


def _index_option(parser: argparse.ArgumentParser, flag: str, help: str) -> None:
    """An optional index from 0 (``--target``, ``--layer``): its upper end is known once the model is loaded and
    has tokenized the text, and :func:`run` checks it then."""
    parser.add_argument(flag, type=int_type(minimum=0), default=None, help=help)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """TEXT and what to intervene on."""
    parser.add_argument("text", type=text_type, help="the prompt (SmolLM2) or sentence (MiniLM)")
    parser.add_argument(
        "--model", choices=("smollm2", "minilm"), default="smollm2", help="the model (default smollm2, a causal LM)"
    )
    target_help = "query position from 0 (SmolLM2 default: the last token; MiniLM default: the mean over all queries)"
    _index_option(parser, "--target", target_help)
    parser.add_argument(
        "--target-token",
        default=None,
        help="SmolLM2: the next token to track (one token of text; default: the model's prediction)",
    )
    parser.add_argument(
        "--method",
        choices=("delete", "replace"),
        default="delete",
        help="delete each token or replace it (default delete)",
    )
    parser.add_argument(
        "--replacement",
        default=None,
        help="SmolLM2: the replacing token (one token of text; default <|endoftext|>); MiniLM: [MASK]",
    )
    _index_option(parser, "--layer", "summarise this layer's heads, from 0 (default: all layers)")
    parser.add_argument(
        "--plot", type=output_file((".png", ".svg", ".pdf")), default=None, metavar="PATH", help="save a plot"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the numbers as JSON instead of the table (schema attnlab.intervene/1)",
    )


def _as_json(r) -> str:
    from ..schemas import name

    return json.dumps(
        {
            "schema": name("intervene"),
            "model": r.model,
            "tokens": list(r.tokens),
            "sources": list(r.sources),
            "target": r.target,
            "target_label": r.target_label,
            "method": r.method,
            "replacement": r.replacement,
            "layer": r.layer,
            "attention_mean": [round(float(x), 6) for x in r.mean_attention()],
            "attention_per_head": [[round(float(x), 6) for x in row] for row in r.per_head()],
            "effect_name": r.effect_name,
            "effect": [round(float(x), 6) for x in r.effect],
            "delta_logprob": None if r.delta_logprob is None else [round(float(x), 6) for x in r.delta_logprob],
            "kl": None if r.kl is None else [round(float(x), 6) for x in r.kl],
            "spearman": None if r.correlation() != r.correlation() else round(r.correlation(), 6),
        },
        ensure_ascii=False,
    )


def check_args(args: argparse.Namespace) -> None:
    """Options that apply to SmolLM2 only, before a model is loaded."""
    from ..errors import OptionError

    if args.model == "minilm":
        for flag, value in (("--target-token", args.target_token), ("--replacement", args.replacement)):
            if value is not None:
                raise OptionError(f"{flag}: applies to --model smollm2 only (MiniLM replaces with [MASK])")
    if args.replacement is not None and args.method != "replace":
        raise OptionError(
            f"--replacement: applies to --method replace only (--method {args.method} removes the token); got "
            f"{args.replacement!r}"
        )


#: :func:`~attnlab.models.interventions.intervene`'s keyword -> the option that sets it (SmolLM2)
FLAGS = {"target": "--target", "target_token": "--target-token", "method": "--method", "replacement": "--replacement",
         "layer": "--layer"}  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Delete or replace each token of TEXT, compare the effect with the attention it received, and print the table
    and its reading (or ``--json``; ``--plot`` also draws it); returns 0."""
    from ..argtypes import index_in, keywords
    from ..errors import OptionError
    from ..models.interventions import intervene, intervene_minilm, plot_intervention

    # the ranges of --target and --layer are known once the model is loaded and has tokenized the text: checked
    # here, before any forward pass
    if args.model == "smollm2":
        from ..models.gguf import load_smollm2

        model: Any = load_smollm2()
        n = len(model.encode(args.text))
        if args.target is not None and n >= 2 and not 1 <= args.target < n:
            raise OptionError(
                f"--target: expected an int in [1, {n - 1}] (a position with earlier tokens; the prompt is {n} "
                f"tokens), got {args.target}"
            )
        index_in("--layer", args.layer, model.config.num_layers, f"layers of {model.config.name}")
        r = intervene(model, args.text, **keywords(args, FLAGS))
    else:
        from ..models.minilm import MiniLM

        model = MiniLM.load()
        ids, _ = model.tokenize([args.text])
        n = ids.shape[1]
        index_in("--target", args.target, n, "tokens with [CLS] and [SEP]")
        index_in("--layer", args.layer, model.config.num_layers, "layers of all-MiniLM-L6-v2")
        r = intervene_minilm(args.text, model=model, target=args.target, method=args.method, layer=args.layer)
    if args.plot:
        try:
            plot_intervention(r, args.plot)
        except OSError as err:  # the folder was checked when parsing; it can still refuse (full disk, read-only)
            raise OptionError(f"--plot: cannot write {args.plot!r}: {err.strerror or err}") from None
    if args.json:
        sys.stdout.write(_as_json(r) + "\n")
    else:
        sys.stdout.write(r.table() + "\n" + r.reading())
    if args.plot:
        sys.stderr.write(f"plot saved to {args.plot}\n")
    return 0
