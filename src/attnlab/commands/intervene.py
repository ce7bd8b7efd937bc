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

NAME = "intervene"
HELP = "attention received vs. the effect of deleting/replacing each token (SmolLM2 or MiniLM)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """TEXT and what to intervene on."""
    parser.add_argument("text", help="the prompt (SmolLM2) or sentence (MiniLM)")
    parser.add_argument("--model", choices=("smollm2", "minilm"), default="smollm2")
    parser.add_argument(
        "--target",
        type=int,
        default=None,
        help="query position (SmolLM2 default: last token; MiniLM default: mean over all queries)",
    )
    parser.add_argument(
        "--target-token",
        default=None,
        help="SmolLM2: the next token to track (one token of text; default: the model's prediction)",
    )
    parser.add_argument("--method", choices=("delete", "replace"), default="delete")
    parser.add_argument(
        "--replacement",
        default=None,
        help="SmolLM2: the replacing token (one token of text; default <|endoftext|>); MiniLM: [MASK]",
    )
    parser.add_argument("--layer", type=int, default=None, help="summarise this layer's heads (default: all layers)")
    parser.add_argument("--plot", default=None, metavar="PATH", help="save a plot (.png, .svg or .pdf)")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON instead of the table")


def _as_json(r) -> str:
    return json.dumps(
        {
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


def run(args: argparse.Namespace) -> int:
    from ..errors import AttnlabError, MissingExtraError
    from ..models.interventions import intervene, intervene_minilm, plot_intervention

    try:
        if args.model == "smollm2":
            from ..models.gguf import load_smollm2

            r = intervene(
                load_smollm2(),
                args.text,
                target=args.target,
                target_token=args.target_token,
                method=args.method,
                replacement=args.replacement,
                layer=args.layer,
            )
        else:
            if args.target_token is not None or args.replacement is not None:
                sys.stderr.write("attnlab intervene: --target-token and --replacement apply to --model smollm2 only\n")
                return 2
            r = intervene_minilm(args.text, target=args.target, method=args.method, layer=args.layer)
        if args.plot:
            plot_intervention(r, args.plot)
    except (MissingExtraError, AttnlabError) as err:
        sys.stderr.write(f"attnlab intervene: {err}\n")
        return 2
    if args.json:
        sys.stdout.write(_as_json(r) + "\n")
    else:
        sys.stdout.write(r.table() + "\n" + r.reading())
    if args.plot:
        sys.stderr.write(f"plot saved to {args.plot}\n")
    return 0
