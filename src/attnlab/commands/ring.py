"""``attnlab ring``: exact ring (context-parallel) attention over P ranks: time, peak memory, bytes sent, a check.

Without ``torchrun`` it spawns P gloo ranks on 127.0.0.1; under ``torchrun --nproc-per-node P -m attnlab ring ...``
(one or several machines) every rank runs it and rank 0 prints (NCCL when CUDA is available).
"""

from __future__ import annotations

import argparse
import os
import sys

NAME = "ring"
HELP = "exact ring attention across P processes (torch.distributed): time, memory, traffic, check"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-n", "--seq-len", dest="n", type=_positive, default=1024, help="global sequence length n (default 1024)"
    )
    parser.add_argument(
        "-P", "--procs", type=_positive, default=2, help="ranks to spawn (ignored under torchrun; default 2)"
    )
    parser.add_argument("--batch", type=_positive, default=1, help="batch size B (default 1)")
    parser.add_argument("--heads", type=_positive, default=4, help="query heads h (default 4)")
    parser.add_argument("--kv-heads", type=_positive, default=None, help="key/value heads h_kv (GQA; default h)")
    parser.add_argument("--d-k", type=_positive, default=64, help="query/key head size (default 64)")
    parser.add_argument("--d-v", type=_positive, default=None, help="value head size (default d_k)")
    parser.add_argument("--causal", action="store_true", help="causal attention")
    parser.add_argument("--layout", choices=("contiguous", "zigzag"), default=None, help="default: zigzag if causal")
    parser.add_argument("--dtype", choices=("float32", "float64", "float16", "bfloat16"), default="float32")
    parser.add_argument("--backward", action="store_true", help="also run the backward pass in the ring")
    parser.add_argument("--block", type=_positive, default=256, help="tile size block_q = block_k (default 256)")
    parser.add_argument(
        "--check",
        choices=("auto", "yes", "no"),
        default="auto",
        help="compare with the single-process float64 reference on rank 0 (auto: when B·h·n² <= 4M)",
    )
    parser.add_argument("--repeats", type=_positive, default=1, help="passes to time; the fastest is reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before spawned ranks are stopped")


def _under_torchrun() -> bool:
    return all(key in os.environ for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def run(args: argparse.Namespace) -> int:
    from ..distributed.launch import (
        RingRunConfig,
        format_report,
        run_ring_spawned,
        run_ring_torchrun,
        with_check,
    )
    from ..errors import AttnlabError

    cfg = RingRunConfig(
        n=args.n,
        batch=args.batch,
        heads=args.heads,
        kv_heads=args.kv_heads or args.heads,
        d_k=args.d_k,
        d_v=args.d_v or args.d_k,
        causal=args.causal,
        layout=args.layout or ("zigzag" if args.causal else "contiguous"),
        dtype=args.dtype,
        backward=args.backward,
        block=args.block,
        seed=args.seed,
        repeats=args.repeats,
    )
    cfg = with_check(cfg, args.check)
    try:
        if cfg.heads % cfg.kv_heads:
            raise AttnlabError(f"--kv-heads: {cfg.kv_heads} must divide --heads {cfg.heads}")
        report = (
            run_ring_torchrun(cfg) if _under_torchrun() else run_ring_spawned(cfg, args.procs, timeout=args.timeout)
        )
    except AttnlabError as err:
        sys.stderr.write(f"attnlab ring: {err}\n")
        return 1
    if report is None:  # a torchrun rank other than 0
        return 0
    sys.stdout.write(format_report(report))
    return 0 if report.check is None or report.check.passed else 1
