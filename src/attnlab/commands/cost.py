"""``attnlab cost``: FLOPs, score-matrix memory and KV-cache bytes of attention for the sizes you give."""

from __future__ import annotations

import argparse
import inspect
import sys
from typing import Any

from ..argtypes import int_type

__all__ = ["add_arguments", "check_args", "cost_options", "cost_text", "run"]

NAME = "cost"
HELP = "FLOPs, score memory and KV-cache bytes for given sizes (article 001 §13-15)"

#: The largest size any option takes: 10^30 (counts stay exact ints; their ratios stay within a float's range).
MAX_SIZE = 10**30


def _ratio(a: int, b: int, spec: str) -> str:
    """``a / b`` of two exact ints (Python's int division rounds once, exactly), formatted with ``spec``."""
    return format(a / b, spec)


def _bytes(n: int) -> str:
    for unit, size in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{_ratio(n, size, '.4g')} {unit}"
    return f"{n} B"


def _flops(n: int) -> str:
    for unit, size in (
        ("EFLOP", 10**18),
        ("PFLOP", 10**15),
        ("TFLOP", 10**12),
        ("GFLOP", 10**9),
        ("MFLOP", 10**6),
        ("kFLOP", 10**3),
    ):
        if n >= size:
            return f"{_ratio(n, size, '.4g')} {unit}"
    return f"{n} FLOP"


def cost_options() -> tuple[str, ...]:
    """The keywords of :func:`attnlab.cost.attention_cost` after ``n_q`` (``n_k``, ``batch`` ... ``causal``): the
    options ``attnlab cost`` passes on, read from its signature so that the two cannot drift apart."""
    from ..cost import attention_cost

    return tuple(inspect.signature(attention_cost).parameters)[1:]


def cost_text(lengths: list[int], **options: Any) -> str:
    """The table ``attnlab cost`` prints: one row per sequence length, then growth and crossover.

    ``options`` are :func:`attnlab.cost.attention_cost`'s keywords (``n_k``, ``batch``, ``d_model``, ``heads``,
    ``kv_heads``, ``layers``, ``dtype``, ``causal``; its defaults where left out). Every count is an exact int (any
    size: ``attnlab cost 1000000000000000000 --causal`` works); with ``causal`` a column gives the exact number of
    allowed (query, key) pairs per sequence and head.
    """
    from ..cost import attention_cost, crossover_length

    dtype = options.get("dtype", inspect.signature(attention_cost).parameters["dtype"].default)  # its name
    costs = [attention_cost(n, **options) for n in lengths]
    c0 = costs[0]
    causal, batch, d_model, heads, layers = c0.causal, c0.batch, c0.d_model, c0.heads, c0.layers
    header = ["n_q", "n_k", *(["causal pairs"] if causal else []), "projections", "QKᵀ + AV", "attn/proj"]
    header += ["score elements", "score memory", "KV cache"]
    rows = [
        [
            str(c.n_q),
            str(c.n_k),
            *([f"{c.pairs:,}"] if causal else []),
            _flops(c.projection_flops),
            _flops(c.attention_flops),
            _ratio(c.attention_flops, c.projection_flops, ".3g"),
            f"{c.score_elements:,}",
            _bytes(c.score_bytes),
            _bytes(c.kv_cache_bytes),
        ]
        for c in costs
    ]
    least = {"n_q": 8, "n_k": 8, "projections": 13, "QKᵀ + AV": 13, "attn/proj": 9, "score elements": 15}
    least |= {"score memory": 13, "KV cache": 11}
    widths = [max(least.get(h, 0), len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = [
        f"attention cost: B={batch}, d_model={d_model}, h={heads} (d_head={c0.d_head}), h_kv={c0.kv_heads} "
        f"({c0.kind}), layers={layers}, {dtype} ({c0.bytes_per_element} B/element){', causal' if causal else ''}",
        "",
        " ".join(f"{h:>{w}}" for h, w in zip(header, widths, strict=True)),
    ]
    lines += [" ".join(f"{x:>{w}}" for x, w in zip(r, widths, strict=True)) for r in rows]
    lines.append("")
    lines.append(
        "projections O(B n d_model²); QKᵀ + AV O(B n_q n_k d_model); score memory O(B h n_q n_k) per layer; "
        "KV cache B·L·layers·h_kv·d_head·2·bytes (K, V projected for all n_k keys: no cache)"
    )
    for c in costs[1:]:
        lines.append(
            f"n_q {c0.n_q} -> {c.n_q}: ×{_ratio(c.n_q, c0.n_q, '.6g')} tokens, "
            f"×{_ratio(c.score_elements, c0.score_elements, '.6g')} score elements, "
            f"×{_ratio(c.attention_flops, c0.attention_flops, '.6g')} QKᵀ + AV FLOPs"
        )
    x = crossover_length(d_model, heads=heads, kv_heads=c0.kv_heads)
    lines.append(f"self-attention: QKᵀ + AV exceed the projections beyond n = {x} tokens (projections dominate below)")
    return "\n".join(lines) + "\n"


def cost_json(lengths: list[int], **options: Any) -> dict[str, Any]:
    """What ``attnlab cost --json`` prints (schema ``attnlab.cost/1``): every field of
    :class:`~attnlab.cost.AttentionCost` per length (exact ints), its ``attention_flops`` and ``kind``, and the
    self-attention crossover length. ``options`` as in :func:`cost_text`."""
    import dataclasses

    from ..cost import attention_cost, crossover_length
    from ..schemas import name

    dtype = options.get("dtype", inspect.signature(attention_cost).parameters["dtype"].default)
    costs = [attention_cost(n, **options) for n in lengths]
    rows = [{**dataclasses.asdict(c), "attention_flops": c.attention_flops, "kind": c.kind} for c in costs]
    c0 = costs[0]
    return {
        "schema": name("cost"),
        "dtype": dtype,
        "rows": rows,
        "crossover": crossover_length(c0.d_model, heads=c0.heads, kv_heads=c0.kv_heads),
    }


def _dtype(text: str) -> str:
    from ..cost import bytes_per_element
    from ..errors import DTypeError

    try:
        bytes_per_element(text)
    except DTypeError as err:
        raise argparse.ArgumentTypeError(str(err).split(": ", 1)[1]) from None
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """N (one sequence length, or several to show growth) and the layer's sizes."""
    size = int_type(minimum=1, maximum=MAX_SIZE)
    parser.add_argument("n", type=size, nargs="+", metavar="N", help="sequence length(s) n_q (several: growth)")
    parser.add_argument("--n-k", type=size, default=None, help="keys / cached tokens L (default: n)")
    parser.add_argument("--batch", "-B", type=size, default=1, help="sequences in the batch B (default 1)")
    parser.add_argument("--d-model", type=size, default=512, help="model width d_model (default 512)")
    parser.add_argument("--heads", type=size, default=8, help="query heads h; must divide --d-model (default 8)")
    parser.add_argument("--kv-heads", type=size, default=None, help="key/value heads (GQA/MQA; default: heads)")
    parser.add_argument("--layers", type=size, default=1, help="attention layers counted (default 1)")
    parser.add_argument("--dtype", type=_dtype, default="float16", help="float16, bfloat16, float32, float64, int8 ...")
    parser.add_argument("--causal", action="store_true", help="count only causal pairs in the FLOPs")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON (schema attnlab.cost/1)")


def check_args(args: argparse.Namespace) -> None:
    """--heads must divide --d-model and --kv-heads must divide --heads."""
    from ..errors import OptionError

    if args.d_model % args.heads:
        raise OptionError(
            f"--heads: {args.heads} heads do not divide --d-model={args.d_model} (d_head = d_model / heads must be "
            "an int)"
        )
    if args.kv_heads is not None and args.heads % args.kv_heads:
        raise OptionError(
            f"--kv-heads: {args.kv_heads} does not divide --heads={args.heads} (GQA needs heads % kv_heads == 0)"
        )


def run(args: argparse.Namespace) -> int:
    """Print :func:`cost_text` (or, with ``--json``, :func:`cost_json`) for the parsed ``args``; returns 0."""
    options = {name: getattr(args, name) for name in cost_options()}
    if args.json:
        import json

        sys.stdout.write(json.dumps(cost_json(args.n, **options), indent=2) + "\n")
    else:
        sys.stdout.write(cost_text(args.n, **options))
    return 0
