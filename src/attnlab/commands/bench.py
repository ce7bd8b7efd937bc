"""``attnlab bench``: time tiled attention against naive dense attention, the GEMM floor and PyTorch SDPA.

The output starts with the CPU (model, widest vector instruction set, what NumPy and numba use of it), the BLAS
kernel and PyTorch's CPU capability: a ratio between two libraries holds for that CPU only (OpenBLAS's AVX-512
kernels roughly double the rate of its AVX2 ones; ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` in the
environment change which kernel runs). ``--isolate`` times each method in fresh processes, alternating, for a
ratio no library's threads or allocator can tilt. Every option is checked before any work: a bad one is one line
on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..bench import BenchOptions

__all__ = ["add_arguments", "run"]

NAME = "bench"
HELP = "time and peak memory of naive, tiled, GEMM floor and torch attention against n"


def _bools(text: str) -> list[bool]:
    return {"no": [False], "yes": [True], "both": [False, True]}[text]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The sizes, head dims, block sizes, threads and modes to time, and the files to write (``--json``, ``--plot``)."""
    parser.add_argument("--sizes", "-n", type=int, nargs="+", default=[1024, 2048, 4096], help="sequence lengths")
    parser.add_argument("--d", type=int, nargs="+", default=[64], help="head dims")
    parser.add_argument("--heads", type=int, default=8, help="attention heads h (default 8)")
    parser.add_argument("--batch", "-B", type=int, default=1, help="batch size B (default 1)")
    parser.add_argument(
        "--causal", choices=["no", "yes", "both"], default="both", help="time without, with or both (default both)"
    )
    parser.add_argument("--repetitions", "-r", type=int, default=3, help="timed runs per cell (median reported)")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["naive", "tiled", "floor", "torch"],
        choices=["naive", "tiled", "floor", "torch"],
        help="what to time: naive dense, attnlab's tiled kernel, the GEMM floor, PyTorch SDPA (default all)",
    )
    parser.add_argument("--backward", action="store_true", help="also time the backward pass")
    parser.add_argument("--block-q", type=int, default=None, help="tiled kernel: query rows per block")
    parser.add_argument("--block-k", type=int, default=None, help="tiled kernel: keys per block")
    parser.add_argument("--threads", type=int, default=None, help="kernel threads (default: every core)")
    parser.add_argument("--naive-max-gb", type=float, default=4.0, help="skip naive above this score memory")
    decode_help = "also time KV-cache decode steps at these contexts (default 1024 2048 4096 8192)"
    parser.add_argument("--decode", type=int, nargs="*", default=None, metavar="CONTEXT", help=decode_help)
    long_help = "also run a causal 1-head d=64 forward at N tokens in a fresh process (peak RSS)"
    parser.add_argument("--long", type=int, default=None, metavar="N", help=long_help)
    isolate_help = "time each method in P fresh processes per cell (default 3), alternating; medians of their medians"
    parser.add_argument("--isolate", type=int, nargs="?", const=3, default=None, metavar="P", help=isolate_help)
    parser.add_argument("--json", default=None, metavar="PATH", help="write every measurement as JSON")
    parser.add_argument("--plot", default=None, metavar="PATH", help="write a PNG of time and memory against n")
    parser.add_argument("--no-progress", action="store_true", help="no progress display on stderr")


class _PlainProgress:
    def __init__(self, stream) -> None:
        self.stream = stream

    def __call__(self, desc: str, done: int, total: int) -> None:
        self.stream.write(f"[{done}/{total}] {desc}\n")
        self.stream.flush()


#: BenchOptions' field -> the option that sets it: the options are read by this table, and an error names what the
#: user typed (``causal`` and ``decode_contexts`` are converted from ``--causal`` and ``--decode`` below)
FLAGS = {"sizes": "--sizes", "d": "--d", "heads": "--heads", "batch": "--batch", "repetitions": "--repetitions",
         "methods": "--methods", "backward": "--backward", "block_q": "--block-q", "block_k": "--block-k",
         "num_threads": "--threads", "naive_max_gb": "--naive-max-gb", "decode_contexts": "--decode",
         "long_n": "--long", "isolate": "--isolate"}  # fmt: skip


def _check_output(option: str, path: str) -> None:
    """An output file that can be written: its folder exists and is writable, and it is not a folder itself."""
    from ..errors import OptionError

    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise OptionError(f"{option}: {path!r} is a directory; expected a file path")
    if not os.path.isdir(folder):
        raise OptionError(f"{option}: the folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise OptionError(f"{option}: {path!r} is not writable")


def _options(args: argparse.Namespace) -> BenchOptions:
    """The command line as a checked :class:`~attnlab.bench.BenchOptions` (an OptionError names the first bad one)."""
    from ..argtypes import keywords
    from ..bench import BenchOptions, decode_minimum
    from ..errors import OptionError

    if args.decode is not None:
        short = [c for c in args.decode if c < decode_minimum(args.repetitions)]
        if short:  # named as the option the user typed, not the library's argument
            raise OptionError(
                f"--decode: each context must be >= {decode_minimum(args.repetitions)} tokens (the timed steps need "
                f"them), got {short[0]}"
            )
    decode = None if args.decode is None else (args.decode or [1024, 2048, 4096, 8192])
    return BenchOptions(**{**keywords(args, FLAGS), "causal": _bools(args.causal), "decode_contexts": decode or ()})


def run(args: argparse.Namespace) -> int:
    """Run ``attnlab bench`` with the parsed ``args`` and print its table; returns the exit status (0; 1 when the
    benchmark or writing a file fails; 2 for options that do not fit together)."""
    from ..bench import plot, run_bench
    from ..errors import OptionError

    try:  # every option, before any work
        options = _options(args)
        if args.json:
            _check_output("--json", args.json)
        if args.plot:
            _check_output("--plot", args.plot)
            if importlib.util.find_spec("matplotlib") is None:
                raise OptionError("--plot: needs matplotlib: pip install 'attnlab[plot]'")
    except OptionError as err:
        name, sep, rest = str(err).partition(": ")
        sys.stderr.write(f"attnlab bench: error: {FLAGS.get(name, name)}{sep}{rest}\n")
        return 2
    try:
        if args.no_progress:
            result = run_bench(options)
        else:
            try:
                from rich.progress import Progress
            except ImportError:
                result = run_bench(options, progress=_PlainProgress(sys.stderr))
            else:
                with Progress(transient=True) as bar:
                    task = bar.add_task("bench", total=None)

                    def update(desc: str, done: int, total: int) -> None:
                        bar.update(task, description=desc, completed=done, total=total)

                    result = run_bench(options, progress=update)
    except (ValueError, RuntimeError, MemoryError) as err:  # MemoryLimitError, or an allocation that failed
        sys.stderr.write(f"attnlab bench: error: {err}\n")
        return 1
    sys.stdout.write(result.table())
    for option, path, write in (
        ("--json", args.json, result.write_json),
        ("--plot", args.plot, lambda p: plot(result, p)),
    ):
        if path:
            try:
                write(path)
            except OSError as err:  # the folder went away or filled up during the run
                sys.stderr.write(f"attnlab bench: error: {option}: could not write {path!r}: {err.strerror or err}\n")
                return 1
            sys.stdout.write(f"wrote {path}\n")
    return 0
