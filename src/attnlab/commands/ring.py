"""``attnlab ring``: exact ring (context-parallel) attention over P ranks: time, peak memory, bytes sent, a check.

Without ``torchrun`` it spawns P gloo ranks on 127.0.0.1; under ``torchrun --nproc-per-node P -m attnlab ring ...``
(one or several machines) every rank runs it and rank 0 prints (NCCL when CUDA is available). Every option and
the layout are checked before any rank starts (exit status 2); a rank that dies, stops answering for ``--timeout``
seconds or cannot reach its peers is reported in one line (exit status 1), and every rank is stopped with it.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..argtypes import float_or_text, int_or_text

__all__ = ["add_arguments", "run"]

NAME = "ring"
HELP = "exact ring attention across P processes (torch.distributed): time, memory, traffic, check"

_SIZES = ("n", "procs", "batch", "heads", "kv_heads", "d_k", "d_v", "block", "repeats")
_FLAGS = {"n": "-n/--seq-len", "procs": "-P/--procs", "kv_heads": "--kv-heads", "d_k": "--d-k", "d_v": "--d-v"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The global sizes, the number of ranks (``-P``), the layout, dtype and block size, the backward and fault
    injection."""
    parser.add_argument(
        "-n", "--seq-len", dest="n", type=int_or_text, default=1024, help="global sequence length n (1024)"
    )
    parser.add_argument(
        "-P", "--procs", type=int_or_text, default=2, help="ranks to spawn (ignored under torchrun; default 2)"
    )
    parser.add_argument("--batch", type=int_or_text, default=1, help="batch size B (default 1)")
    parser.add_argument("--heads", type=int_or_text, default=4, help="query heads h (default 4)")
    parser.add_argument(
        "--kv-heads", type=int_or_text, default=None, help="key/value heads h_kv, a divisor of h (default h)"
    )
    parser.add_argument("--d-k", type=int_or_text, default=64, help="query/key head size (default 64)")
    parser.add_argument("--d-v", type=int_or_text, default=None, help="value head size (default d_k)")
    parser.add_argument("--causal", action="store_true", help="causal attention (zig-zag needs n >= 2P)")
    parser.add_argument("--layout", choices=("contiguous", "zigzag"), default=None, help="default: zigzag if causal")
    parser.add_argument(
        "--dtype",
        choices=("float32", "float64", "float16", "bfloat16"),
        default="float32",
        help="dtype of Q, K, V (default float32)",
    )
    parser.add_argument("--backward", action="store_true", help="also run the backward pass in the ring")
    parser.add_argument("--block", type=int_or_text, default=256, help="tile size block_q = block_k (default 256)")
    parser.add_argument(
        "--check",
        choices=("auto", "yes", "no"),
        default="auto",
        help="compare with the single-process float64 reference on rank 0 (auto: when B·h·n² <= 4M)",
    )
    parser.add_argument("--repeats", type=int_or_text, default=1, help="passes to time; the fastest is reported")
    parser.add_argument("--seed", type=int_or_text, default=0, help="seed of the random Q, K, V, >= 0 (default 0)")
    parser.add_argument(
        "--timeout",
        type=float_or_text,
        default=60.0,
        help="seconds a rank waits for another (rendezvous, each step) before the run is stopped (default 60)",
    )
    parser.add_argument("--inject-fault", metavar="RANK:STEP:ACTION", default=None, help=argparse.SUPPRESS)


def _under_torchrun() -> bool:
    return all(key in os.environ for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def run(args: argparse.Namespace) -> int:
    """Run exact ring attention on ``-P`` spawned local ranks (or under ``torchrun``) and print the report (time,
    peak memory, bytes sent, the check); returns 0, 1 when the run fails, 2 for options that do not fit, 128 + the
    signal number when interrupted."""
    # c10d's C++ log lines (socket retries, frames) would bury the one-line report; TORCH_CPP_LOG_LEVEL=INFO shows them
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # before torch is imported (with attnlab.distributed)
    from .._process import signals_raise
    from ..errors import AttnlabError
    from ..validate import check_float, check_int

    try:  # everything is checked here, before any rank starts
        for name in _SIZES:
            if getattr(args, name) is not None:
                check_int(_FLAGS.get(name, f"--{name}"), getattr(args, name), minimum=1)
        check_int("--seed", args.seed, minimum=0, maximum=2**53)
        timeout = check_float("--timeout", args.timeout, positive=True)
        from ..distributed.launch import MAX_SPAWNED, Fault, RingRunConfig, check_run, torchrun_environment, with_check

        torchrun = _under_torchrun()
        world = torchrun_environment()[1] if torchrun else check_int("-P/--procs", args.procs, maximum=MAX_SPAWNED)
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
        check_run(cfg, world)
        fault = Fault.parse(args.inject_fault) if args.inject_fault else None
        if fault is not None and (torchrun or fault.rank >= args.procs):
            raise AttnlabError(f"--inject-fault: rank {fault.rank} is not one of the {args.procs} spawned ranks")
    except AttnlabError as err:
        sys.stderr.write(f"attnlab ring: error: {err}\n")
        return 2
    from ..distributed.launch import format_report, run_ring_spawned, run_ring_torchrun

    try:
        with signals_raise():  # SIGTERM, SIGHUP -> Terminated (a KeyboardInterrupt): every rank is stopped
            if torchrun:
                report = run_ring_torchrun(cfg, timeout=timeout)
            else:
                report = run_ring_spawned(cfg, args.procs, timeout=timeout, fault=fault)
    except AttnlabError as err:
        sys.stderr.write(f"attnlab ring: error: {err}\n")
        return 1
    except KeyboardInterrupt as stop:
        sys.stderr.write(f"attnlab ring: {str(stop) or 'interrupted by Ctrl-C'}; every rank was stopped\n")
        return 128 + getattr(stop, "signum", 2)
    if report is None:  # a torchrun rank other than 0
        return 0
    sys.stdout.write(format_report(report))
    return 0 if report.check is None or report.check.passed else 1
