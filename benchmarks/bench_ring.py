"""Ring attention at a fixed n over P = 1, 2, 4 ranks: per-rank peak memory (~1/P) and wall time, honestly.

Run: ``python benchmarks/bench_ring.py`` (defaults: n=16384, 8 heads, d=64, causal zig-zag, float32, forward,
block 128, one thread per rank), or e.g. ``python benchmarks/bench_ring.py --n 8192 --procs 1,2,4 --backward``.

Every P gets fresh gloo processes on 127.0.0.1 (so each rank's memory high-water mark starts clean). Memory is the
resident set size of each rank sampled every millisecond, from before its shards of q, k, v exist to the end of the
pass: inputs, outputs, accumulators, the ring's receive buffers and the tiles' scratch. Time is the slowest rank's
wall time of the fastest of ``--repeats`` passes. On a machine with fewer cores than ranks the ranks share cores,
so the time shows the communication and scheduling overhead, not a speed-up; on P machines or GPUs each rank has
its own hardware and the compute part divides by P. The load average is printed because other jobs on the machine
change the times (not the memory or the traffic).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

from attnlab.distributed.launch import RingRunConfig, format_report, run_ring_spawned


def _mib(b: float) -> str:
    return f"{b / 2**20:8.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--procs", default="1,2,4", help="comma-separated world sizes (default 1,2,4)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--d", type=int, default=64, help="d_k = d_v")
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--layout", choices=("contiguous", "zigzag"), default=None)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads per rank (default 1: every P gets the same per-rank hardware; 0 = cores / P)",
    )
    ap.add_argument("--verbose", action="store_true", help="also print every run's per-rank table")
    args = ap.parse_args(argv)

    causal = not args.no_causal
    base = RingRunConfig(
        n=args.n,
        batch=args.batch,
        heads=args.heads,
        kv_heads=args.kv_heads or args.heads,
        d_k=args.d,
        d_v=args.d,
        causal=causal,
        layout=args.layout or ("zigzag" if causal else "contiguous"),
        dtype=args.dtype,
        backward=args.backward,
        block=args.block,
        check=False,
        repeats=args.repeats,
    )
    worlds = [int(p) for p in args.procs.split(",")]
    cores = os.cpu_count() or 1
    print(
        f"bench_ring: n={base.n} B={base.batch} h={base.heads} h_kv={base.kv_heads} d={args.d} {base.dtype} "
        f"causal={causal} layout={base.layout} block={base.block} {'fwd+bwd' if base.backward else 'fwd'}; "
        f"{cores} CPU cores, load average {os.getloadavg()[0]:.1f} (python {sys.version.split()[0]})"
    )
    item = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}[base.dtype]
    rows = []
    for world in worlds:
        threads = args.threads or max(1, cores // world)
        report = run_ring_spawned(replace(base, repeats=args.repeats), world, threads=threads)
        if args.verbose:
            print(format_report(report), end="")
        rows.append((world, threads, report))
    t1 = rows[0][2]
    ref_time = max(r.time_s for r in t1.ranks)
    ref_mem = max(r.peak_bytes for r in t1.ranks) * t1.world_size
    print(
        f"{'P':>2} {'thr/rank':>8} {'time':>10} {'vs P=1':>7} {'waiting':>9} {'peak mem/rank':>14} {'x P':>6} "
        f"{'model k,v/step':>15} {'sent/rank':>12} {'GFLOP/rank':>10}"
    )
    for world, threads, report in rows:
        slow = max(r.time_s for r in report.ranks)
        waiting = max(r.wait_s for r in report.ranks)
        mem = max(r.peak_bytes for r in report.ranks)
        # cost model: each of the P - 1 forward steps moves one shard of k and v per rank
        per_step = base.batch * base.kv_heads * (base.n / world) * (base.d_k + base.d_v) * item
        sent = max(r.bytes_sent for r in report.ranks)
        gflop = max(r.flops for r in report.ranks) / 1e9
        vs = slow / ref_time
        print(
            f"{world:>2} {threads:>8} {slow:>9.2f}s {vs:>6.2f}x {waiting:>8.2f}s {_mib(mem):>14} "
            f"{mem * world / ref_mem:>6.2f} "
            f"{_mib(per_step):>15} {_mib(sent):>12} {gflop:>10.2f}"
        )
    print(
        "x P = per-rank peak memory times P over the first row's (1.00 = memory falls exactly as 1/P); "
        "'vs P=1' = slowest rank's time over P=1's (on one machine the ranks share its cores); 'waiting' = the "
        "longest time a rank sat blocked on a transfer after finishing its compute (communication not hidden)."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
