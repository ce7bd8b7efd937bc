"""``attnlab bench``: time tiled attention against naive dense attention, the GEMM floor and PyTorch SDPA.

For reproducible numbers on OpenBLAS machines, note the kernel line it prints: ``OPENBLAS_CORETYPE`` and
``OPENBLAS_L2_SIZE`` in the environment change which GEMM kernel runs.
"""

from __future__ import annotations

import argparse
import sys

NAME = "bench"
HELP = "time and peak memory of naive, tiled, GEMM floor and torch attention against n"


def _bools(text: str) -> list[bool]:
    return {"no": [False], "yes": [True], "both": [False, True]}[text]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", "-n", type=int, nargs="+", default=[1024, 2048, 4096], help="sequence lengths")
    parser.add_argument("--d", type=int, nargs="+", default=[64], help="head dims")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--batch", "-B", type=int, default=1)
    parser.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    parser.add_argument("--repetitions", "-r", type=int, default=3, help="timed runs per cell (median reported)")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["naive", "tiled", "floor", "torch"],
        choices=["naive", "tiled", "floor", "torch"],
    )
    parser.add_argument("--backward", action="store_true", help="also time the backward pass")
    parser.add_argument("--block-q", type=int, default=None)
    parser.add_argument("--block-k", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="kernel threads (default: every core)")
    parser.add_argument("--naive-max-gb", type=float, default=4.0, help="skip naive above this score memory")
    decode_help = "also time KV-cache decode steps at these contexts (default 1024 2048 4096 8192)"
    parser.add_argument("--decode", type=int, nargs="*", default=None, metavar="CONTEXT", help=decode_help)
    long_help = "also run a causal 1-head d=64 forward at N tokens in a fresh process (peak RSS)"
    parser.add_argument("--long", type=int, default=None, metavar="N", help=long_help)
    parser.add_argument("--json", default=None, metavar="PATH", help="write every measurement as JSON")
    parser.add_argument("--plot", default=None, metavar="PATH", help="write a PNG of time and memory against n")
    parser.add_argument("--no-progress", action="store_true")


class _PlainProgress:
    def __init__(self, stream) -> None:
        self.stream = stream

    def __call__(self, desc: str, done: int, total: int) -> None:
        self.stream.write(f"[{done}/{total}] {desc}\n")
        self.stream.flush()


def run(args: argparse.Namespace) -> int:
    from ..bench import plot, run_bench

    decode = None if args.decode is None else (args.decode or [1024, 2048, 4096, 8192])
    kwargs = dict(
        sizes=args.sizes,
        d=args.d,
        heads=args.heads,
        batch=args.batch,
        causal=_bools(args.causal),
        repetitions=args.repetitions,
        methods=args.methods,
        backward=args.backward,
        block_q=args.block_q,
        block_k=args.block_k,
        num_threads=args.threads,
        naive_max_gb=args.naive_max_gb,
        decode_contexts=decode or (),
        long_n=args.long,
    )
    try:
        if args.no_progress:
            result = run_bench(**kwargs)
        else:
            try:
                from rich.progress import Progress
            except ImportError:
                result = run_bench(progress=_PlainProgress(sys.stderr), **kwargs)
            else:
                with Progress(transient=True) as bar:
                    task = bar.add_task("bench", total=None)

                    def update(desc: str, done: int, total: int) -> None:
                        bar.update(task, description=desc, completed=done, total=total)

                    result = run_bench(progress=update, **kwargs)
    except (ValueError, RuntimeError) as err:
        sys.stderr.write(f"attnlab bench: error: {err}\n")
        return 2
    sys.stdout.write(result.table())
    if args.json:
        result.write_json(args.json)
        sys.stdout.write(f"wrote {args.json}\n")
    if args.plot:
        plot(result, args.plot)
        sys.stdout.write(f"wrote {args.plot}\n")
    return 0
