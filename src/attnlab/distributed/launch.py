"""Starting P ranks on one machine, and the ``attnlab ring`` run: time, per-rank peak memory, bytes sent, a check.

:func:`spawn` starts ``nprocs`` processes (``torch.multiprocessing``'s spawn context), joins them into a gloo (or
NCCL) process group over ``127.0.0.1`` on a free port, runs a picklable ``fn(rank, world, *args)`` in each and
returns every rank's result. The launcher watches its ranks the whole time:

* every rank beats a heartbeat (a counter in shared memory, 5 times a second, from a thread) and says which step
  of its work it is at; a rank that dies is reported as ``rank 1 of 2 died at step 3 (pass 1: forward) (killed
  by SIGKILL)``, one that is silent for ``op_timeout`` seconds (stopped, hung) as ``rank 1 of 2 did not answer
  within 60 s at step 3 (...)``, and a rank that raised with its step and traceback;
* a rank that fails because a peer is gone (gloo's "Connection reset by peer", a collective's timeout) is not the
  cause: the launcher names the peer that died or went silent, and otherwise reports the communication error in
  one line, without C++ frames;
* on any failure, on ``timeout`` (the whole run, optional) and when the launcher itself is interrupted
  (``KeyboardInterrupt``; ``attnlab ring`` turns SIGTERM and SIGHUP into one) every rank is stopped (SIGTERM,
  SIGCONT, then SIGKILL); on Linux the ranks are also killed by the kernel if the launcher dies, even by SIGKILL,
  and they ignore SIGINT (a Ctrl-C in the terminal reaches the launcher, which stops them).

``op_timeout`` is also ``torch.distributed``'s timeout for the rendezvous and for each collective, so a rank
waits at most that long for another one.

:func:`run_ring` is one measured ring-attention run on the current process group; under ``torchrun`` every rank
calls it directly (:func:`run_ring_torchrun`), on one machine without torchrun :func:`run_ring_spawned` spawns
the ranks. :func:`check_run` validates a configuration for P ranks before anything starts; :func:`format_report`
renders the result. :class:`Fault` makes one rank fail on purpose at one step (the tests' fault-injection hook).
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..errors import AttnlabError, OptionError, ShapeError
from ..validate import check_choice, check_float, check_int

if TYPE_CHECKING:
    from .layout import Layout
    from .ring import RingStats

__all__ = [
    "DEFAULT_TIMEOUT",
    "FAULT_ACTIONS",
    "MAX_SPAWNED",
    "Fault",
    "RankReport",
    "RingCheck",
    "RingRunConfig",
    "RingRunReport",
    "SpawnError",
    "check_run",
    "format_report",
    "free_port",
    "loopback_interface",
    "ring_steps",
    "run_ring",
    "run_ring_spawned",
    "run_ring_torchrun",
    "spawn",
    "torchrun_environment",
    "with_check",
]

#: Seconds a rank waits for another (rendezvous, each collective) and a silent rank is tolerated: ``--timeout``.
DEFAULT_TIMEOUT = 60.0
#: What a :class:`Fault` does to its rank: SIGKILL itself, SIGSTOP itself, exit with code 3, raise RuntimeError.
FAULT_ACTIONS: tuple[str, ...] = ("kill", "stop", "exit", "raise")

_BEAT_S = 0.2  # heartbeat period of a rank
_BOOT_S = 60.0  # extra allowance for a rank to start (import torch) before its first heartbeat
_BLAME_S = 1.5  # after a communication error: how long to look for the rank that caused it
_SILENT_S = 2.0  # ... and how long a rank must have been silent to be blamed


class SpawnError(AttnlabError, RuntimeError):
    """A rank died, went silent or raised, could not join its peers, or the run passed its deadline; the message
    says which rank, at which step, and why (a rank's own exception comes with its traceback)."""


@dataclass(frozen=True)
class Fault:
    """Make rank ``rank`` fail when it reaches step ``step`` (see :func:`ring_steps`): the fault-injection hook.

    ``action``: ``"kill"`` (the rank SIGKILLs itself), ``"stop"`` (SIGSTOP: alive but silent), ``"exit"``
    (``os._exit(3)``) or ``"raise"`` (a ``RuntimeError``). Pass it to :func:`spawn` / :func:`run_ring_spawned`
    (``fault=``) or to ``attnlab ring --inject-fault RANK:STEP:ACTION``; it exists so tests can check what the
    launcher reports, and is never active unless passed.
    """

    rank: int
    step: int
    action: str = "kill"

    def __post_init__(self) -> None:
        check_int("fault rank", self.rank, minimum=0)
        check_int("fault step", self.step, minimum=0)
        check_choice("fault action", self.action, FAULT_ACTIONS)

    @classmethod
    def parse(cls, text: str) -> Fault:
        """``"1:3:kill"`` -> ``Fault(rank=1, step=3, action="kill")``."""
        parts = str(text).split(":")
        try:
            rank, step = int(parts[0]), int(parts[1])
            if len(parts) != 3:
                raise ValueError
        except (ValueError, IndexError):
            raise OptionError(f"fault: expected RANK:STEP:ACTION (e.g. 1:3:kill), got {text!r}") from None
        return cls(rank, step, parts[2])

    def trigger(self) -> None:
        """Do it, to the calling process."""
        if self.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif self.action == "exit":
            os._exit(3)
        raise RuntimeError(f"fault injected at step {self.step} of rank {self.rank}")


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


def _is_communication_error(err: BaseException) -> bool:
    """A failure to talk to another rank (its death or silence shows up here), not a bug of this rank."""
    try:
        import torch.distributed as dist

        if isinstance(err, dist.DistError):
            return True
    except ImportError:  # pragma: no cover
        pass
    text = str(err)
    return isinstance(err, RuntimeError) and any(
        w in text for w in ("gloo", "Gloo", "NCCL", "c10d", "Connection reset", "Connection closed", "Timed out")
    )


def _first_line(err: BaseException) -> str:
    """``Type: first line of the message`` (torch's messages carry C++ frames after the first line)."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


class _RankSide:
    """What a rank shares with its launcher: a heartbeat counter, its current step, the pipe for its result."""

    def __init__(self, rank: int, beats: Any, steps: Any, conn: Any, fault: Fault | None) -> None:
        self.rank, self.beats, self.steps, self.conn, self.fault = rank, beats, steps, conn, fault

    def beat_forever(self) -> None:
        while True:
            self.beats[self.rank] += 1
            time.sleep(_BEAT_S)

    def progress(self, step: int) -> None:
        """Record that this rank starts ``step`` (and fire the fault if it is meant for this rank and step)."""
        self.steps[self.rank] = step
        if self.fault is not None and self.fault.rank == self.rank and self.fault.step == step:
            self.fault.trigger()

    def send(self, *message: Any) -> None:
        self.conn.send_bytes(pickle.dumps(message))


def _child(
    rank: int,
    world: int,
    port: int,
    backend: str,
    op_timeout: float,
    threads: int,
    fn: Any,
    args: tuple,
    with_progress: bool,
    side: tuple,
    launcher_pid: int,
) -> None:
    from .._process import die_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher handles Ctrl-C and stops every rank
    die_with_parent(launcher_pid)
    me = _RankSide(rank, *side)
    threading.Thread(target=me.beat_forever, daemon=True).start()
    import torch
    import torch.distributed as dist

    lo = loopback_interface()
    if backend == "gloo" and lo is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)  # gloo's pairs on loopback only
    torch.set_num_threads(threads)
    try:
        me.progress(0)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=op_timeout),
        )
    except BaseException as err:
        me.send("comm" if _is_communication_error(err) else "error", 0, _first_line(err), traceback.format_exc())
        return
    try:
        me.progress(1)
        result = fn(rank, world, *args, progress=me.progress) if with_progress else fn(rank, world, *args)
        me.send("ok", me.steps[rank], result)  # plain pickle: tensors by value, not shared memory
    except BaseException as err:  # before the group goes down and the others fail too
        kind = "comm" if _is_communication_error(err) else "error"
        me.send(kind, me.steps[rank], _first_line(err), traceback.format_exc())
    finally:
        dist.destroy_process_group()


def spawn(
    fn: Any,
    nprocs: int,
    args: tuple = (),
    *,
    timeout: float | None = 120.0,
    op_timeout: float = DEFAULT_TIMEOUT,
    backend: str = "gloo",
    threads: int | None = None,
    steps: Sequence[str] | None = None,
    fault: Fault | None = None,
) -> list[Any]:
    """Run ``fn(rank, nprocs, *args)`` on ``nprocs`` new processes joined in one process group; their results.

    Args:
        fn: a module-level (picklable) function; its return value must be picklable.
        nprocs: number of ranks P.
        args: extra positional arguments for ``fn``.
        timeout: seconds for the whole run (None: no limit; dead and silent ranks are caught by the heartbeat);
            afterwards the children are stopped and :class:`SpawnError` raised.
        op_timeout: ``torch.distributed`` timeout of the rendezvous and of each collective, in seconds, and how long
            a rank may stay silent (no heartbeat) before it is reported and every rank stopped.
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank).
        threads: intra-op threads per rank (default: CPU cores / P, at least 1).
        steps: names of ``fn``'s steps 1, 2, ... (step 0, "joining the process group", is the launcher's; step 1
            starts when ``fn`` is called). When given, ``fn`` is called with ``progress=``, a callable it calls with
            each step's number as it starts it, and reports say ``at step 3 (name)``. Without it the steps are
            0 and 1 ("running").
        fault: make one rank fail on purpose (tests; see :class:`Fault`).

    On Linux a rank is killed when the thread that called ``spawn`` ends: call it from a thread that outlives the
    run (the main thread, usually). A ``KeyboardInterrupt`` in that thread stops every rank.

    Returns:
        ``[result of rank 0, ..., result of rank P-1]``.

    Raises:
        SpawnError: a rank died, went silent, raised, or the deadline passed (every rank has been stopped).
    """
    import torch.multiprocessing as mp

    nprocs = check_int("nprocs", nprocs, minimum=1)
    if timeout is not None:
        timeout = check_float("timeout", timeout, positive=True)
    op_timeout = check_float("op_timeout", op_timeout, positive=True)
    backend = check_choice("backend", backend, ("gloo", "nccl"))
    if fault is not None and fault.rank >= nprocs:
        raise OptionError(f"fault: rank {fault.rank} does not exist among {nprocs} ranks")
    names = ("joining the process group", *(("running",) if steps is None else steps))
    threads = threads or max(1, (os.cpu_count() or 1) // nprocs)
    for attempt in range(3):
        try:
            return _spawn_once(mp, fn, nprocs, args, timeout, op_timeout, backend, threads, steps is not None,
                               names, fault)  # fmt: skip
        except SpawnError as err:
            # the free port was taken between choosing it and binding it: choose another
            if attempt == 2 or "address already in use" not in str(err).lower():
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _how(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:  # pragma: no cover
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def _spawn_once(
    mp: Any,
    fn: Any,
    nprocs: int,
    args: tuple,
    timeout: float | None,
    op_timeout: float,
    backend: str,
    threads: int,
    with_progress: bool,
    names: tuple[str, ...],
    fault: Fault | None,
) -> list[Any]:
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    beats, steps = ctx.RawArray("Q", nprocs), ctx.RawArray("i", nprocs)
    pipes = [ctx.Pipe(duplex=False) for _ in range(nprocs)]
    port = free_port()
    procs = [
        ctx.Process(
            target=_child,
            args=(
                r,
                nprocs,
                port,
                backend,
                op_timeout,
                threads,
                fn,
                args,
                with_progress,
                (beats, steps, pipes[r][1], fault),
                os.getpid(),
            ),
            daemon=True,
        )
        for r in range(nprocs)
    ]
    readers = [rd for rd, _ in pipes]

    def at(r: int) -> str:
        k = steps[r]
        return f"at step {k} ({names[k]})" if 0 <= k < len(names) else f"at step {k}"

    results: dict[int, Any] = {}
    reports: dict[int, tuple] = {}  # rank -> (kind, step, one line, traceback) of a rank that raised
    gone: set[int] = set()  # ranks whose pipe closed without a message
    heard = dict.fromkeys(range(nprocs), time.monotonic())
    seen = [0] * nprocs

    def waiting(r: int) -> bool:
        return r not in results and r not in reports

    def read(r: int) -> None:
        """Take rank r's message, if one has arrived."""
        if r in gone or not waiting(r) or not readers[r].poll():
            return
        try:
            msg = pickle.loads(readers[r].recv_bytes())
        except (EOFError, OSError):
            gone.add(r)  # closed without a word: its exit code tells
            return
        if msg[0] == "ok":
            results[r] = msg[2]
        else:
            reports[r] = msg

    def silent(r: int) -> str:
        return f"rank {r} of {nprocs} did not answer within {op_timeout:g} s {at(r)}; every rank was stopped"

    try:
        _start_ignoring_sigint(procs)
        for _, wr in pipes:
            wr.close()  # the children hold them now; a child's end closing means it is gone
        begin = time.monotonic()
        blame_until: float | None = None
        while len(results) < nprocs:
            listen = [readers[r] for r in range(nprocs) if waiting(r) and r not in gone]
            wait(listen + [p.sentinel for p in procs if p.exitcode is None], timeout=_BEAT_S)
            now = time.monotonic()
            for r in range(nprocs):
                read(r)
                if beats[r] != seen[r]:
                    seen[r], heard[r] = beats[r], now
            # 1. a rank that died without a word is the cause
            for r, p in enumerate(procs):
                if waiting(r) and p.exitcode is not None:
                    read(r)  # it may have sent its result just before exiting
                    if waiting(r):
                        raise SpawnError(
                            f"rank {r} of {nprocs} died {at(r)} ({_how(p.exitcode)}); every rank was stopped"
                        )
            # 2. so is one that has been silent for op_timeout (stopped, hung)
            for r in range(nprocs):
                if waiting(r) and now - heard[r] > op_timeout + (0.0 if seen[r] else _BOOT_S):
                    raise SpawnError(silent(r))
            # 3. a rank's own error, with its traceback
            for r, (kind, _, _, tb) in sorted(reports.items()):
                if kind == "error":
                    raise SpawnError(f"rank {r} of {nprocs} failed {at(r)}:\n{tb}")
            # 4. a communication error: look a moment for the peer that died or went silent, else report it
            if reports:
                blame_until = blame_until or now + _BLAME_S
                for r in range(nprocs):  # (not during the rendezvous: torch holds the GIL there, no heartbeat)
                    if waiting(r) and steps[r] > 0 and now - heard[r] > _SILENT_S:
                        raise SpawnError(silent(r))
                if now > blame_until:
                    r = min(reports)
                    raise SpawnError(f"rank {r} of {nprocs} lost contact with the others {at(r)}: {reports[r][2]}")
            if timeout is not None and now - begin > timeout:
                late = ", ".join(f"rank {r} {at(r)}" for r in range(nprocs) if r not in results)
                raise SpawnError(
                    f"spawn: the run did not finish within timeout={timeout:g} s ({late}); every rank was stopped"
                )
    finally:
        _stop_ranks([p for p in procs if p.pid is not None], grace=5.0 if len(results) == nprocs else 0.5)
        for rd in readers:
            rd.close()
    return [results[r] for r in range(nprocs)]


def _start_ignoring_sigint(procs: list[Any]) -> None:
    """Start ``procs`` with SIGINT ignored from birth (inherited through exec), so a Ctrl-C during their start-up
    does not print a traceback in every rank; the launcher handles it."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        for p in procs:
            p.start()
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)


def _stop_ranks(procs: list[Any], grace: float) -> None:
    """Let the ranks exit on their own for ``grace`` seconds, then SIGTERM (+ SIGCONT), then SIGKILL."""
    end = time.monotonic() + grace
    for p in procs:
        p.join(timeout=max(0.0, end - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.terminate()
        try:
            os.kill(p.pid, signal.SIGCONT)  # a stopped rank handles SIGTERM only once continued
        except ProcessLookupError:
            pass
    end = time.monotonic() + 2.0
    for p in alive:
        p.join(timeout=max(0.0, end - time.monotonic()))
    for p in alive:
        if p.is_alive():
            p.kill()
            p.join()


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
    layout: Layout = "contiguous"
    dtype: str = "float32"
    backward: bool = False
    block: int = 256
    check: bool = True
    seed: int = 0
    repeats: int = 1

    def __post_init__(self) -> None:
        for name in ("n", "batch", "heads", "kv_heads", "d_k", "d_v", "block", "repeats"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("seed", self.seed, minimum=0, maximum=2**53)
        for name in ("causal", "backward", "check"):
            check_choice(name, getattr(self, name), (False, True))
        check_choice("layout", self.layout, ("contiguous", "zigzag"))
        check_choice("dtype", self.dtype, tuple(_FLOOR))
        if self.heads % self.kv_heads:
            raise ShapeError(f"kv_heads: {self.kv_heads} key/value heads must divide heads={self.heads}")


#: Most ranks :func:`run_ring_spawned` starts on one machine (more: use torchrun).
MAX_SPAWNED = 64


def check_run(cfg: RingRunConfig, world_size: int) -> None:
    """Raise (``ShapeError``/``OptionError``, naming the value) unless ``cfg`` can run on ``world_size`` ranks.

    The ranks would refuse the same things, but only after starting: this runs in the launcher, before any.

    >>> try:
    ...     check_run(RingRunConfig(n=3, causal=True, layout="zigzag"), 2)
    ... except ShapeError as err:
    ...     print(str(err).split(",")[0])
    n: a 'zigzag' layout over P=2 ranks cuts the sequence into 4 chunks
    """
    from .layout import RingLayout

    if not isinstance(cfg, RingRunConfig):
        raise OptionError(f"cfg: expected a RingRunConfig, got {type(cfg).__name__}")
    check_int("world_size", world_size, minimum=1)
    RingLayout(cfg.n, world_size, cfg.layout)


def ring_steps(cfg: RingRunConfig) -> tuple[str, ...]:
    """The names of :func:`run_ring`'s steps 1, 2, ... (step 0 is joining the process group).

    >>> ring_steps(RingRunConfig(backward=True))
    ('warm-up', 'making the shards', 'pass 1: forward', 'pass 1: backward', 'gathering on rank 0', 'checking on rank 0')
    """
    names = ["warm-up", "making the shards"]
    for i in range(1, cfg.repeats + 1):
        names += [f"pass {i}: forward"] + ([f"pass {i}: backward"] if cfg.backward else [])
    return (*names, "gathering on rank 0", *(["checking on rank 0"] if cfg.check else []))


@dataclass(frozen=True)
class RankReport:
    """What one rank measured: wall time of the (fastest) pass, its peak memory, the length of its shard, and
    ``traffic``: the :class:`~attnlab.distributed.RingStats` of a pass, forward and backward together (bytes sent
    and received, tiles computed and skipped, flops, time spent waiting).

    ``peak_bytes`` is how far this rank's memory rose above its level before its shards of q, k, v (, dO) were
    created, up to the end of the first pass: the resident set size sampled every millisecond on CPUs
    (``memory_kind`` "RSS high-water, shards included"), ``torch.cuda.max_memory_allocated`` on GPUs.
    """

    rank: int
    time_s: float
    peak_bytes: int
    memory_kind: str
    shard: int
    traffic: RingStats


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
    """What :func:`run_ring` returns for one ``attnlab ring`` run: its config, the world size, backend and device,
    every rank's :class:`RankReport`, and rank 0's :class:`RingCheck` (None when the check was not asked for)."""

    config: RingRunConfig
    world_size: int
    backend: str
    device: str
    ranks: tuple[RankReport, ...]
    check: RingCheck | None


_FLOOR = {"float64": 1e-12, "float32": 1e-6, "float16": 1e-3, "bfloat16": 1e-2}

#: The :class:`RingStats` fields that add up over the passes of one rank (its rank and the world size stay).
_ADDED = ("steps", "tiles_computed", "tiles_skipped", "flops", "bytes_sent", "bytes_received", "wait_s")


def _both(forward: RingStats, backward: RingStats) -> RingStats:
    """One rank's stats of a forward and its backward as one pass: the counts and the waiting add."""
    return replace(forward, **{name: getattr(forward, name) + getattr(backward, name) for name in _ADDED})


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


def run_ring(
    cfg: RingRunConfig, *, group: Any = None, progress: Callable[[int], None] | None = None
) -> RingRunReport | None:
    """One measured ring-attention run on the initialized process group; the report on rank 0, None elsewhere.

    ``progress(k)`` (optional) is called as step ``k`` of :func:`ring_steps` starts (1 = the warm-up).
    """
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
    step = progress or (lambda k: None)
    per_pass = 2 if cfg.backward else 1

    def one_pass(local: dict[str, Any], i: int) -> tuple[Any, Any]:
        step(3 + i * per_pass)
        fwd = ring_attention_forward(local["q"], local["k"], local["v"], **opts)
        grads = None
        if cfg.backward:
            step(4 + i * per_pass)
            grads = ring_attention_backward(fwd, local["dO"])
        if device.type == "cuda":
            torch.cuda.synchronize()
        return fwd, grads

    # warm-up on a tiny problem: thread pools, communication buffers and caches are not the algorithm's memory
    step(1)
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
        step(2)
        local = make_local()
        dist.barrier(group)
        t0 = time.perf_counter()
        fwd, grads = one_pass(local, 0)
        best = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else rss.peak
    for i in range(1, cfg.repeats):  # more timed passes: the fastest counts
        dist.barrier(group)
        t0 = time.perf_counter()
        fwd, grads = one_pass(local, i)
        best = min(best, time.perf_counter() - t0)
    memory_kind = "CUDA allocated" if device.type == "cuda" else "RSS high-water, shards included"
    traffic = fwd.stats if grads is None else _both(fwd.stats, grads.stats)
    mine = RankReport(rank, best, int(peak), memory_kind, lay.size(rank), traffic)
    shards = {"output": fwd.output}
    if grads is not None:
        shards.update(dq=grads.dq, dk=grads.dk, dv=grads.dv)
    payload = (mine, {n: x.detach().cpu() for n, x in shards.items()} if cfg.check else None)
    gathered: list[Any] | None = [None] * world if rank == 0 else None
    step(3 + cfg.repeats * per_pass)
    dist.gather_object(payload, gathered, dst=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    if rank != 0:
        return None
    assert gathered is not None
    ranks = tuple(g[0] for g in gathered)
    check = None
    if cfg.check:
        step(4 + cfg.repeats * per_pass)
        got = {n: lay.unshard([g[1][n] for g in gathered]).to(torch.float64) for n in shards}
        ref = _reference(cfg, full["q"], full["k"], full["v"], full["dO"], torch.float64)
        naive = _reference(cfg, full["q"], full["k"], full["v"], full["dO"], dtype)
        errors = {n: float((got[n] - ref[n]).abs().max()) for n in got}
        naive_err = {n: float((naive[n] - ref[n]).abs().max()) for n in got}
        floor = _FLOOR.get(cfg.dtype, 1e-6)
        passed = all(errors[n] <= (2 if n == "output" else 3) * naive_err[n] + floor for n in got)
        check = RingCheck(errors, naive_err, passed)
    return RingRunReport(cfg, world, dist.get_backend(group), str(device), ranks, check)


def _spawned_worker(
    rank: int, world: int, cfg: RingRunConfig, *, progress: Callable[[int], None]
) -> RingRunReport | None:
    return run_ring(cfg, progress=progress)


def run_ring_spawned(
    cfg: RingRunConfig,
    nprocs: int,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    threads: int | None = None,
    fault: Fault | None = None,
) -> RingRunReport:
    """:func:`run_ring` on ``nprocs`` gloo ranks spawned on this machine; rank 0's report.

    ``timeout``: seconds a rank waits for another (the rendezvous, each collective) and may stay silent; there is
    no limit on the whole run. The configuration is checked (:func:`check_run`) before any rank starts. ``fault``:
    see :class:`Fault`.
    """
    check_run(cfg, check_int("nprocs", nprocs, minimum=1, maximum=MAX_SPAWNED))
    steps = ring_steps(cfg)
    return spawn(_spawned_worker, nprocs, (cfg,), timeout=None, op_timeout=timeout, threads=threads, steps=steps,
                 fault=fault)[0]  # fmt: skip


def torchrun_environment() -> tuple[int, int, str, int]:
    """``(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)`` as torchrun sets them, checked (``OptionError`` naming the
    variable otherwise)."""
    values: list[int] = []
    for name, low in (("WORLD_SIZE", 1), ("RANK", 0), ("MASTER_PORT", 1)):
        text = os.environ.get(name, "")
        try:
            value = int(text)
        except ValueError:
            raise OptionError(f"{name}: expected an int, got {text!r} (torchrun sets it)") from None
        high = {"RANK": values[0] - 1 if values else None, "MASTER_PORT": 65535}.get(name)
        values.append(check_int(name, value, minimum=low, maximum=high))
    world, rank, port = values
    addr = os.environ.get("MASTER_ADDR", "")
    if not addr:
        raise OptionError("MASTER_ADDR: expected a host name or address, got '' (torchrun sets it)")
    return rank, world, addr, port


class _RendezvousSilent(Exception):
    """``init_process_group`` did not return within its own timeout (and a grace period)."""


#: Seconds beyond ``timeout`` that joining may take before it counts as hung (torch's own retries overrun a little).
_JOIN_GRACE_S = 5.0


def _join_bounded(dist: Any, backend: str, timeout: float) -> None:
    """``dist.init_process_group(backend, timeout=timeout)``, given up after ``timeout`` (+ a grace period).

    torch's TCPStore client waits without a limit for a server that accepts the connection but never answers (any
    other program on MASTER_PORT), whatever ``timeout`` says, and in C++, where no signal reaches it. So it runs on a
    daemon thread that the caller stops waiting for (:class:`_RendezvousSilent`); that thread ends when the other
    side closes the connection, or with the process."""
    outcome: dict[str, BaseException | None] = {}

    def join() -> None:
        try:
            if backend == "nccl":  # the current CUDA device is per thread
                import torch

                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
            outcome["error"] = None
        except BaseException as err:  # handed to the caller's thread, re-raised there
            outcome["error"] = err

    worker = threading.Thread(target=join, name="attnlab-rendezvous", daemon=True)
    worker.start()
    worker.join(timeout + _JOIN_GRACE_S)
    if "error" not in outcome:
        raise _RendezvousSilent
    if outcome["error"] is not None:
        raise outcome["error"]


def run_ring_torchrun(cfg: RingRunConfig, *, timeout: float = DEFAULT_TIMEOUT) -> RingRunReport | None:
    """:func:`run_ring` inside ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set):
    NCCL when CUDA is available, gloo otherwise; rank 0's report, None on the other ranks.

    The environment (:func:`torchrun_environment`) and ``cfg`` (:func:`check_run`) are checked before joining.
    ``timeout`` is ``torch.distributed``'s timeout for the rendezvous and each collective: a rank whose peers do
    not come (or stop answering) raises :class:`SpawnError` after that long, naming itself, the address and the
    port it waited on, instead of waiting silently.
    """
    timeout = check_float("timeout", timeout, positive=True)
    rank, world, addr, port = torchrun_environment()
    check_run(cfg, world)
    import torch
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    try:
        _join_bounded(dist, backend, timeout)
    except _RendezvousSilent:
        raise SpawnError(
            f"rank {rank} of {world} waited {timeout:g} s for the other ranks at {addr}:{port} (MASTER_ADDR:"
            f"MASTER_PORT) and gave up: something accepts connections there but does not answer as torch.distributed's "
            f"TCPStore (is MASTER_PORT another program's port?)"
        ) from None
    except Exception as err:
        if not _is_communication_error(err):
            raise
        raise SpawnError(
            f"rank {rank} of {world} waited {timeout:g} s for the other ranks at {addr}:{port} (MASTER_ADDR:"
            f"MASTER_PORT) and gave up: {_first_line(err)}"
        ) from None
    names = ("joining the process group", *ring_steps(cfg))
    now = [0]

    def progress(k: int) -> None:
        now[0] = k

    try:
        return run_ring(cfg, progress=progress)
    except Exception as err:
        if not _is_communication_error(err):
            raise
        raise SpawnError(
            f"rank {rank} of {world} lost contact with the others at step {now[0]} ({names[now[0]]}): "
            f"{_first_line(err)}"
        ) from None
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
        t = r.traffic
        lines.append(
            f"{r.rank:>4} {r.shard:>7} {r.time_s * 1e3:>7.1f}ms {t.wait_s * 1e3:>7.1f}ms {_mib(r.peak_bytes):>12} "
            f"{_mib(t.bytes_sent):>12} "
            f"{_mib(t.bytes_received):>12} {t.tiles_computed:>7} {t.tiles_skipped:>7} {t.flops / 1e9:>8.3f}"
        )
    slowest = max(r.time_s for r in report.ranks)
    lines.append(
        f"time (slowest rank): {slowest * 1e3:.1f} ms; peak memory ({report.ranks[0].memory_kind}) max "
        f"{_mib(max(r.peak_bytes for r in report.ranks))}; "
        f"sent in total {_mib(sum(r.traffic.bytes_sent for r in report.ranks))}"
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
    check_choice("check", check, ("auto", "yes", "no"))
    if check == "auto":
        return replace(cfg, check=cfg.batch * cfg.heads * cfg.n * cfg.n <= limit)
    return replace(cfg, check=check == "yes")
