"""Starting P ranks on one machine, and the ``attnlab ring`` run: time, per-rank peak memory, bytes sent, a check.

:func:`spawn` starts ``nprocs`` processes (``torch.multiprocessing``'s spawn context), joins them into a gloo (or
NCCL) process group over ``127.0.0.1`` on a free port, runs a picklable ``fn(rank, world, *args)`` in each and
returns every rank's result. Everything is bounded (``timeout`` for the whole run, ``op_timeout`` for each
collective) and cleaned up: the process group is destroyed in every child, and children still alive after the
deadline or after another rank failed are terminated.

:func:`run_ring` is one measured ring-attention run on the current process group; under ``torchrun`` every rank
calls it directly (:func:`run_ring_torchrun`), on one machine without torchrun :func:`run_ring_spawned` spawns
the ranks. :func:`format_report` renders the result.
"""

from __future__ import annotations

import os
import pickle
import queue as _queue
import socket
import threading
import time
import traceback
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import Any

from ..errors import AttnlabError, ShapeError

__all__ = [
    "RankReport",
    "RingCheck",
    "RingRunConfig",
    "RingRunReport",
    "SpawnError",
    "format_report",
    "free_port",
    "loopback_interface",
    "run_ring",
    "run_ring_spawned",
    "run_ring_torchrun",
    "spawn",
    "with_check",
]


class SpawnError(AttnlabError, RuntimeError):
    """A spawned rank failed or the run passed its deadline; the message holds the failing rank's traceback."""


# --------------------------------------------------------------------------------------------------------------
# spawning ranks on one machine


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def loopback_interface() -> str | None:
    """The name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS), if there is one."""
    try:
        names = [n for _, n in socket.if_nameindex()]
    except OSError:  # pragma: no cover - platforms without if_nameindex
        return None
    for cand in ("lo", "lo0"):
        if cand in names:
            return cand
    return None


def _child(
    rank: int,
    world: int,
    port: int,
    backend: str,
    op_timeout: float,
    threads: int,
    fn: Any,
    args: tuple,
    results: Any,
) -> None:
    import torch
    import torch.distributed as dist

    lo = loopback_interface()
    if backend == "gloo" and lo is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)  # gloo's pairs on loopback only
    torch.set_num_threads(threads)
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=op_timeout),
        )
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        return
    try:
        # plain pickle (tensors by value): torch's queue reductions would share memory with a process that exits
        results.put((rank, True, pickle.dumps(fn(rank, world, *args))))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))  # before the group goes down and the others fail too
    finally:
        dist.destroy_process_group()


def spawn(
    fn: Any,
    nprocs: int,
    args: tuple = (),
    *,
    timeout: float = 120.0,
    op_timeout: float = 60.0,
    backend: str = "gloo",
    threads: int | None = None,
) -> list[Any]:
    """Run ``fn(rank, nprocs, *args)`` on ``nprocs`` new processes joined in one process group; their results.

    Args:
        fn: a module-level (picklable) function; its return value must be picklable.
        nprocs: number of ranks P.
        args: extra positional arguments for ``fn``.
        timeout: seconds for the whole run; afterwards the children are terminated and :class:`SpawnError` raised.
        op_timeout: ``torch.distributed`` timeout of each collective and of the rendezvous, in seconds.
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank).
        threads: intra-op threads per rank (default: CPU cores / P, at least 1).

    Returns:
        ``[result of rank 0, ..., result of rank P-1]``.

    Raises:
        SpawnError: a rank raised (the message carries its traceback) or the deadline passed.
    """
    import torch.multiprocessing as mp

    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ShapeError(f"nprocs: expected a positive int, got {nprocs!r}")
    threads = threads or max(1, (os.cpu_count() or 1) // nprocs)
    for attempt in range(3):
        try:
            return _spawn_once(mp, fn, nprocs, args, timeout, op_timeout, backend, threads)
        except SpawnError as err:
            # the free port was taken between choosing it and binding it: choose another
            if attempt == 2 or "address already in use" not in str(err).lower():
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _spawn_once(
    mp: Any, fn: Any, nprocs: int, args: tuple, timeout: float, op_timeout: float, backend: str, threads: int
) -> list[Any]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_child,
            args=(r, nprocs, port, backend, op_timeout, threads, fn, args, results),
            daemon=True,
        )
        for r in range(nprocs)
    ]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    failure: tuple[int, str] | None = None
    deadline = time.monotonic() + timeout
    try:
        while len(got) < nprocs:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(nprocs)) - set(got))
                raise SpawnError(f"spawn: ranks {missing} of {nprocs} did not finish in time (timeout={timeout:g} s)")
            try:
                rank, ok, value = results.get(timeout=min(left, 0.5))
            except _queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in got and p.exitcode not in (None, 0)]
                if dead and failure is None:
                    failure = (dead[0], f"rank {dead[0]} exited with code {procs[dead[0]].exitcode}")
                    deadline = min(deadline, time.monotonic() + 2.0)
                continue
            if ok:
                got[rank] = pickle.loads(value)
            elif failure is None:
                failure = (rank, value)
                # the others may now wait for this rank until op_timeout; give them a moment to fail cleanly
                deadline = min(deadline, time.monotonic() + 2.0)
            else:
                got[rank] = None
            if failure is not None and len(got) + 1 >= nprocs:
                break
    except SpawnError as err:
        if failure is not None:
            raise SpawnError(f"spawn: rank {failure[0]} of {nprocs} failed:\n{failure[1]}") from err
        raise
    finally:
        # one shared grace period to exit on their own (short once a rank has failed), then SIGTERM
        grace = time.monotonic() + (1.0 if failure is not None else 5.0)
        for p in procs:
            p.join(timeout=max(0.0, grace - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5.0)
            if p.is_alive():  # pragma: no cover - a child that ignores SIGTERM
                p.kill()
                p.join()
        results.close()
        results.join_thread()
    if failure is not None:
        raise SpawnError(f"spawn: rank {failure[0]} of {nprocs} failed:\n{failure[1]}")
    return [got[r] for r in range(nprocs)]


# --------------------------------------------------------------------------------------------------------------
# peak memory of one rank


class _PeakRSS:
    """Sample this process's resident set size every ``interval`` s; ``peak`` is the largest growth seen."""

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def _rss(self) -> int:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * self._page
        except OSError:  # pragma: no cover - no procfs: fall back to the lifetime peak
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss() - self.base)
            time.sleep(self.interval)

    def __enter__(self) -> _PeakRSS:
        self.base = self._rss()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss() - self.base)


# --------------------------------------------------------------------------------------------------------------
# one measured run


@dataclass(frozen=True)
class RingRunConfig:
    """One ``attnlab ring`` run: global sizes, attention options, what to measure.

    Shapes: q ``[batch, heads, n, d_k]``, k ``[batch, kv_heads, n, d_k]``, v ``[batch, kv_heads, n, d_v]``, sharded
    along n with ``layout``. ``check``: gather to rank 0 and compare with the single-process float64 reference.
    """

    n: int = 1024
    batch: int = 1
    heads: int = 4
    kv_heads: int = 4
    d_k: int = 64
    d_v: int = 64
    causal: bool = False
    layout: str = "contiguous"
    dtype: str = "float32"
    backward: bool = False
    block: int = 256
    check: bool = True
    seed: int = 0
    repeats: int = 1


@dataclass(frozen=True)
class RankReport:
    """What one rank measured: wall time of the (fastest) pass, its peak memory, ring traffic, tiles.

    ``peak_bytes`` is how far this rank's memory rose above its level before its shards of q, k, v (, dO) were
    created, up to the end of the first pass: the resident set size sampled every millisecond on CPUs
    (``memory_kind`` "RSS high-water, shards included"), ``torch.cuda.max_memory_allocated`` on GPUs.
    """

    rank: int
    time_s: float
    peak_bytes: int
    memory_kind: str
    bytes_sent: int
    bytes_received: int
    tiles_computed: int
    tiles_skipped: int
    flops: int
    shard: int
    wait_s: float = 0.0


@dataclass(frozen=True)
class RingCheck:
    """Rank 0's comparison with the single-process float64 reference (attnlab's core, PyTorch autograd for grads).

    ``errors[name]`` is the max abs error of the ring's ``name`` vs float64, ``naive[name]`` that of naive
    attention in the run's dtype; ``passed`` applies FlashAttention's rule (2x for the output, 3x for gradients,
    plus a small floor).
    """

    errors: dict[str, float]
    naive: dict[str, float]
    passed: bool


@dataclass(frozen=True)
class RingRunReport:
    config: RingRunConfig
    world_size: int
    backend: str
    device: str
    ranks: tuple[RankReport, ...]
    check: RingCheck | None


_FLOOR = {"float64": 1e-12, "float32": 1e-6, "float16": 1e-3, "bfloat16": 1e-2}


def _reference(cfg: RingRunConfig, q: Any, k: Any, v: Any, dO: Any, dtype: Any) -> dict[str, Any]:
    """Dense attention through attnlab's core in ``dtype`` (autograd for the gradients), GQA by repeating k, v."""
    import torch

    from ..core import scaled_dot_product_attention

    g = cfg.heads // cfg.kv_heads
    leaves = [x.detach().to(dtype).requires_grad_(cfg.backward) for x in (q, k, v)]
    qq, kk, vv = leaves
    out = scaled_dot_product_attention(
        qq, kk.repeat_interleave(g, dim=-3), vv.repeat_interleave(g, dim=-3), causal=cfg.causal
    )
    res = {"output": out.detach()}
    if cfg.backward:
        out.backward(dO.to(out.dtype))
        res.update(dq=qq.grad, dk=kk.grad, dv=vv.grad)
    return {name: x.to(torch.float64) for name, x in res.items()}


def run_ring(cfg: RingRunConfig, *, group: Any = None) -> RingRunReport | None:
    """One measured ring-attention run on the initialized process group; the report on rank 0, None elsewhere."""
    import torch
    import torch.distributed as dist

    from .layout import RingLayout
    from .ring import ring_attention_backward, ring_attention_forward

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    dtype = getattr(torch, cfg.dtype)
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if dist.get_backend(group) == "nccl" else None
    device = device or torch.device("cpu")
    lay = RingLayout(cfg.n, world, cfg.layout)
    shapes = {
        "q": (cfg.batch, cfg.heads, cfg.n, cfg.d_k),
        "k": (cfg.batch, cfg.kv_heads, cfg.n, cfg.d_k),
        "v": (cfg.batch, cfg.kv_heads, cfg.n, cfg.d_v),
        "dO": (cfg.batch, cfg.heads, cfg.n, cfg.d_v),
    }
    names = ("q", "k", "v", "dO") if cfg.backward else ("q", "k", "v")
    full: dict[str, Any] = {}
    if cfg.check:  # every rank draws the same global tensors (outside the measured window) and keeps its shard
        gen = torch.Generator().manual_seed(cfg.seed)
        full = {name: torch.randn(s, generator=gen, dtype=torch.float64) for name, s in shapes.items()}

    def make_local() -> dict[str, Any]:
        if cfg.check:
            return {name: lay.shard(full[name], rank).to(dtype).to(device) for name in names}
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + rank)  # only the local shard is ever materialized
        return {
            name: torch.randn((*shapes[name][:2], lay.size(rank), shapes[name][3]), generator=gen, dtype=dtype).to(
                device
            )
            for name in names
        }

    opts = {"causal": cfg.causal, "layout": cfg.layout, "block_q": cfg.block, "block_k": cfg.block, "group": group}

    def one_pass(local: dict[str, Any]) -> tuple[Any, Any]:
        fwd = ring_attention_forward(local["q"], local["k"], local["v"], **opts)
        grads = None
        if cfg.backward:
            grads = ring_attention_backward(
                local["dO"], local["q"], local["k"], local["v"], fwd.output, fwd.lse, **opts
            )
        if device.type == "cuda":
            torch.cuda.synchronize()
        return fwd, grads

    # warm-up on a tiny problem: thread pools, communication buffers and caches are not the algorithm's memory
    tiny = RingLayout(2 * world, world, cfg.layout).size(rank)
    x = torch.randn(1, cfg.kv_heads, tiny, cfg.d_k, dtype=dtype, device=device)
    ring_attention_forward(x, x, x, layout=cfg.layout, group=group)
    # peak memory: from before this rank's shards exist to the end of one forward (+ backward)
    dist.barrier(group)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    with _PeakRSS() as rss:
        local = make_local()
        dist.barrier(group)
        t0 = time.perf_counter()
        fwd, grads = one_pass(local)
        best = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else rss.peak
    for _ in range(max(1, cfg.repeats) - 1):  # more timed passes: the fastest counts
        dist.barrier(group)
        t0 = time.perf_counter()
        fwd, grads = one_pass(local)
        best = min(best, time.perf_counter() - t0)
    sent = fwd.stats.bytes_sent + (grads.stats.bytes_sent if grads else 0)
    recv = fwd.stats.bytes_received + (grads.stats.bytes_received if grads else 0)
    computed = fwd.stats.tiles_computed + (grads.stats.tiles_computed if grads else 0)
    skipped = fwd.stats.tiles_skipped + (grads.stats.tiles_skipped if grads else 0)
    flops = fwd.stats.flops + (grads.stats.flops if grads else 0)
    mine = RankReport(
        rank, best, int(peak), "CUDA allocated" if device.type == "cuda" else "RSS high-water, shards included",
        sent, recv, computed, skipped, flops, lay.size(rank), fwd.stats.wait_s + (grads.stats.wait_s if grads else 0.0),
    )  # fmt: skip
    shards = {"output": fwd.output}
    if grads is not None:
        shards.update(dq=grads.dq, dk=grads.dk, dv=grads.dv)
    payload = (asdict(mine), {n: x.detach().cpu() for n, x in shards.items()} if cfg.check else None)
    gathered: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(payload, gathered, dst=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    if rank != 0:
        return None
    assert gathered is not None
    ranks = tuple(RankReport(**g[0]) for g in gathered)
    check = None
    if cfg.check:
        got = {n: lay.unshard([g[1][n] for g in gathered]).to(torch.float64) for n in shards}
        ref = _reference(cfg, full["q"], full["k"], full["v"], full["dO"], torch.float64)
        naive = _reference(cfg, full["q"], full["k"], full["v"], full["dO"], dtype)
        errors = {n: float((got[n] - ref[n]).abs().max()) for n in got}
        naive_err = {n: float((naive[n] - ref[n]).abs().max()) for n in got}
        floor = _FLOOR.get(cfg.dtype, 1e-6)
        passed = all(errors[n] <= (2 if n == "output" else 3) * naive_err[n] + floor for n in got)
        check = RingCheck(errors, naive_err, passed)
    return RingRunReport(cfg, world, dist.get_backend(group), str(device), ranks, check)


def _spawned_worker(rank: int, world: int, cfg: RingRunConfig) -> RingRunReport | None:
    return run_ring(cfg)


def run_ring_spawned(
    cfg: RingRunConfig, nprocs: int, *, timeout: float = 600.0, threads: int | None = None
) -> RingRunReport:
    """:func:`run_ring` on ``nprocs`` gloo ranks spawned on this machine; rank 0's report."""
    return spawn(_spawned_worker, nprocs, (cfg,), timeout=timeout, op_timeout=timeout, threads=threads)[0]


def run_ring_torchrun(cfg: RingRunConfig) -> RingRunReport | None:
    """:func:`run_ring` inside ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set):
    NCCL when CUDA is available, gloo otherwise; rank 0's report, None on the other ranks."""
    import torch
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    try:
        return run_ring(cfg)
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------------------------------
# rendering


def _mib(b: float) -> str:
    """Bytes in binary units: ``512 B``, ``3.0 KiB``, ``12.5 MiB``, ``1.2 GiB``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(b) >= size:
            return f"{b / size:.1f} {unit}"
    return f"{int(b)} B"


def format_report(report: RingRunReport) -> str:
    """The report as text: the configuration, one line per rank, totals and the check's verdict."""
    c = report.config
    lines = [
        f"ring attention: n={c.n} P={report.world_size} ({report.backend}, {report.device}) layout={c.layout} "
        f"causal={c.causal} batch={c.batch} heads={c.heads} kv_heads={c.kv_heads} d_k={c.d_k} d_v={c.d_v} "
        f"{c.dtype} block={c.block} {'forward+backward' if c.backward else 'forward'}",
        f"{'rank':>4} {'shard':>7} {'time':>9} {'waiting':>9} {'peak mem':>12} {'sent':>12} {'received':>12} "
        f"{'tiles':>7} {'skipped':>7} {'GFLOP':>8}",
    ]
    for r in report.ranks:
        lines.append(
            f"{r.rank:>4} {r.shard:>7} {r.time_s * 1e3:>7.1f}ms {r.wait_s * 1e3:>7.1f}ms {_mib(r.peak_bytes):>12} "
            f"{_mib(r.bytes_sent):>12} "
            f"{_mib(r.bytes_received):>12} {r.tiles_computed:>7} {r.tiles_skipped:>7} {r.flops / 1e9:>8.3f}"
        )
    slowest = max(r.time_s for r in report.ranks)
    lines.append(
        f"time (slowest rank): {slowest * 1e3:.1f} ms; peak memory ({report.ranks[0].memory_kind}) max "
        f"{_mib(max(r.peak_bytes for r in report.ranks))}; "
        f"sent in total {_mib(sum(r.bytes_sent for r in report.ranks))}"
    )
    if report.check is None:
        lines.append("check: skipped (n too large for the single-process reference; pass --check to force)")
    else:
        chk = report.check
        parts = [f"{n} {chk.errors[n]:.2e} (naive {c.dtype} {chk.naive[n]:.2e})" for n in chk.errors]
        verdict = "PASS" if chk.passed else "FAIL"
        lines.append(f"check vs float64 single-process reference: {verdict}: max abs error " + ", ".join(parts))
    return "\n".join(lines) + "\n"


def with_check(cfg: RingRunConfig, check: str, limit: int = 1 << 22) -> RingRunConfig:
    """``check`` "yes" / "no" / "auto" (check when ``batch · heads · n²`` is at most ``limit``)."""
    if check == "auto":
        return replace(cfg, check=cfg.batch * cfg.heads * cfg.n * cfg.n <= limit)
    return replace(cfg, check=check == "yes")
