"""``attnlab cost``: FLOPs, score-matrix memory and KV-cache bytes of attention for the sizes you give."""

from __future__ import annotations

import argparse
import sys

NAME = "cost"
HELP = "FLOPs, score memory and KV-cache bytes for given sizes (article 001 §13-15)"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{int(n)} B"


def _flops(n: float) -> str:
    for unit, size in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{int(n)} FLOP"


def cost_text(
    lengths: list[int],
    *,
    n_k: int | None = None,
    batch: int = 1,
    d_model: int = 512,
    heads: int = 8,
    kv_heads: int | None = None,
    layers: int = 1,
    dtype: str = "float16",
    causal: bool = False,
) -> str:
    """The table ``attnlab cost`` prints: one row per sequence length, then growth and crossover."""
    from ..cost import attention_cost, crossover_length

    costs = [
        attention_cost(
            n,
            n_k,
            batch=batch,
            d_model=d_model,
            heads=heads,
            kv_heads=kv_heads,
            layers=layers,
            dtype=dtype,
            causal=causal,
        )
        for n in lengths
    ]
    c0 = costs[0]
    lines = [
        f"attention cost: B={batch}, d_model={d_model}, h={heads} (d_head={c0.d_head}), h_kv={c0.kv_heads} "
        f"({c0.kind}), layers={layers}, {dtype} ({c0.bytes_per_element} B/element){', causal' if causal else ''}",
        "",
        f"{'n_q':>8} {'n_k':>8} {'projections':>13} {'QKᵀ + AV':>13} {'attn/proj':>9} {'score elements':>15} "
        f"{'score memory':>13} {'KV cache':>11}",
    ]
    for c in costs:
        lines.append(
            f"{c.n_q:>8} {c.n_k:>8} {_flops(c.projection_flops):>13} {_flops(c.attention_flops):>13} "
            f"{c.attention_flops / c.projection_flops:>9.3g} {c.score_elements:>15,} {_bytes(c.score_bytes):>13} "
            f"{_bytes(c.kv_cache_bytes):>11}"
        )
    lines.append("")
    lines.append(
        "projections O(B n d_model²); QKᵀ + AV O(B n_q n_k d_model); score memory O(B h n_q n_k) per layer; "
        "KV cache B·L·layers·h_kv·d_head·2·bytes (K, V projected for all n_k keys: no cache)"
    )
    for c in costs[1:]:
        lines.append(
            f"n_q {c0.n_q} -> {c.n_q}: ×{c.n_q / c0.n_q:g} tokens, ×{c.score_elements / c0.score_elements:g} score "
            f"elements, ×{c.attention_flops / c0.attention_flops:g} QKᵀ + AV FLOPs"
        )
    x = crossover_length(d_model, heads=heads, kv_heads=kv_heads)
    lines.append(
        f"self-attention: QKᵀ + AV exceed the projections beyond n = {x:g} tokens (projections dominate below)"
    )
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("n", type=int, nargs="+", metavar="N", help="sequence length(s) n_q (several: growth)")
    parser.add_argument("--n-k", type=int, default=None, help="keys / cached tokens L (default: n)")
    parser.add_argument("--batch", "-B", type=int, default=1)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=None, help="key/value heads (GQA/MQA; default: heads)")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--dtype", default="float16", help="float16, bfloat16, float32, float64, int8 ...")
    parser.add_argument("--causal", action="store_true", help="count only causal pairs in the FLOPs")


def run(args: argparse.Namespace) -> int:
    from ..errors import AttnlabError

    try:
        text = cost_text(
            args.n,
            n_k=args.n_k,
            batch=args.batch,
            d_model=args.d_model,
            heads=args.heads,
            kv_heads=args.kv_heads,
            layers=args.layers,
            dtype=args.dtype,
            causal=args.causal,
        )
    except AttnlabError as err:
        sys.stderr.write(f"attnlab cost: error: {err}\n")
        return 2
    sys.stdout.write(text)
    return 0
