"""Benchmarks that return data: tiled attention against naive dense attention, the GEMM floor and PyTorch.

By default every method runs on the same inputs in the same process (the tiled kernel and its floor interleaved
repetition by repetition, so a busy moment of the machine hits both alike) and reports the median. With
``isolate=P`` each method is timed in fresh Python processes instead, P per method and cell, the processes of the
methods alternating, each importing only what its method needs (a PyTorch process never shares its OpenMP threads
or allocator with NumPy's BLAS); the median of the processes' medians is reported. The ratio between two libraries
depends on the CPU: OpenBLAS's AVX-512 kernels roughly double the products' rate against its AVX2 ones, while
PyTorch's attention does not gain as much, so every result names the CPU, its instruction set and the kernels each
library picked (:func:`cpu_report`, :func:`~attnlab.kernels.threads.blas_report`). Methods:

* ``naive``: :func:`attnlab.scaled_dot_product_attention` (the whole ``[B, h, n, n]`` score matrix; skipped when
  its estimated memory exceeds ``naive_max_gb``); backward: :func:`attnlab.core.gradients.attention_backward`;
* ``tiled``: :func:`attnlab.kernels.tiled.flash_attention` / ``flash_attention_backward``;
* ``floor``: :func:`gemm_floor`, the tiled kernel's matrix products with no softmax — the
  physical limit of the design;
* ``torch``: ``torch.nn.functional.scaled_dot_product_attention`` on the CPU (its flash backend), backward by
  autograd (when PyTorch is installed).

Effective GFLOP/s count ``4 · B · h · n_q · n_k · d`` (half for causal; the backward counts 2.5× that), the
"% GEMM" column divides by the best rate of one large matrix product measured in the same run, and peak memory is
the larger of the traced NumPy allocations' peak and the process's peak-RSS growth during one call
(:func:`peak_memory`).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from .errors import OptionError
from .kernels.threads import BlasInfo, available_cores, blas_report
from .validate import check_choice, check_float, check_int

__all__ = [
    "BenchOptions",
    "BenchResult",
    "BenchRow",
    "CpuInfo",
    "DecodeRow",
    "LongRun",
    "cpu_report",
    "decode_fit",
    "decode_minimum",
    "decode_scaling",
    "gemm_floor",
    "gemm_rate",
    "long_context",
    "peak_memory",
    "peak_rss_growth",
    "run_bench",
]

METHODS = ("naive", "tiled", "floor", "torch")
Progress = Callable[[str, int, int], None]


# --------------------------------------------------------------------------------------------------------------
# measuring


def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_growth(fn: Callable[[], Any]) -> tuple[Any, float | None]:
    """Run ``fn()`` and return ``(result, MB)``: how far the process's peak RSS rose above its RSS before the call.

    Uses Linux's resettable peak (``/proc/self/clear_refs``); ``None`` when that is not available.
    """
    ok = _reset_peak()
    before = _status_kb("VmRSS:")
    result = fn()
    after = _status_kb("VmHWM:") if ok else None
    if before is None or after is None:
        return result, None
    return result, max(0.0, (after - before) / 1024)


def peak_memory(fn: Callable[[], Any]) -> tuple[Any, float | None]:
    """Run ``fn()`` and return ``(result, MB)``: the larger of the peak of traced allocations during the call
    (``tracemalloc``: every NumPy array, exact even when freed memory is reused) and the peak RSS growth
    (:func:`peak_rss_growth`: what untraced libraries such as PyTorch allocate)."""
    import tracemalloc

    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        result, rss = peak_rss_growth(fn)
        traced = (tracemalloc.get_traced_memory()[1] - base) / 2**20
    finally:
        if started:
            tracemalloc.stop()
    return result, max(traced, rss or 0.0)


def gemm_rate(n: int = 2048, repetitions: int = 5) -> float:
    """GFLOP/s of one float32 ``[n, n] @ [n, n]`` product with BLAS on every core: the best of the repetitions
    (the machine's attainable rate; a busy moment can only slow a repetition down)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b
    times = []
    for _ in range(repetitions):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * n**3 / min(times) / 1e9


def _torch_info() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return f"torch {torch.__version__}, {torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()}"


#: Environment variables that change which instruction set NumPy, numba or PyTorch uses (reported with the CPU).
CPU_ENV = ("NPY_DISABLE_CPU_FEATURES", "NPY_ENABLE_CPU_FEATURES", "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES",
           "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")  # fmt: skip

# The vector ISA of LLVM CPU names numba may be told to compile for with no feature list (NUMBA_CPU_FEATURES="").
_LLVM_CPU_ISA = {"generic": "SSE2", "x86-64": "SSE2", "x86-64-v2": "SSE4.2", "x86-64-v3": "AVX2", "haswell": "AVX2",
                 "broadwell": "AVX2", "skylake": "AVX2", "znver1": "AVX2", "znver2": "AVX2", "znver3": "AVX2",
                 "x86-64-v4": "AVX-512", "skylake-avx512": "AVX-512", "icelake-server": "AVX-512",
                 "sapphirerapids": "AVX-512", "znver4": "AVX-512", "znver5": "AVX-512"}  # fmt: skip


def _isa(flags: set[str]) -> str:
    """The widest vector instruction set in a set of CPU flags (``/proc/cpuinfo``'s or LLVM's feature names)."""
    for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2"),
                       ("sse4.2", "SSE4.2"), ("sse2", "SSE2")):  # fmt: skip
        if flag in flags:
            return name
    return platform.machine() or "unknown"


@dataclass(frozen=True)
class CpuInfo:
    """The CPU a benchmark ran on and the instruction set each library used on it.

    ``model``: the CPU's name (``/proc/cpuinfo``); ``isa``: the widest vector instruction set it has (``AVX-512``,
    ``AVX2``, ``AVX``, ``SSE4.2``, ...); ``numpy``: the SIMD target NumPy's float32 ``exp2`` dispatches to here
    (``X86_V4`` is its AVX-512 code, ``baseline(X86_V2)`` SSE); ``numba``: the CPU numba compiles attnlab's fused
    passes for and its instruction set (None without numba); ``env``: the variables of :data:`CPU_ENV` that are set.
    The BLAS kernel is in :class:`~attnlab.kernels.threads.BlasInfo`, PyTorch's in ``BenchResult.torch``.
    """

    model: str
    isa: str
    numpy: str
    numba: str | None
    env: tuple[tuple[str, str], ...] = ()

    def line(self) -> str:
        """One line for benchmark output."""
        env = " ".join(f"{k}={v}" for k, v in self.env) or "none"
        return (
            f"CPU: {self.model}, {self.isa}; NumPy float32 exp2: {self.numpy}; numba: {self.numba or 'not installed'}; "
            f"env: {env}"
        )


def cpu_report() -> CpuInfo:
    """The CPU this process runs on, its widest vector instruction set, and what NumPy and numba use of it."""
    model, flags = "", set[str]()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:  # pragma: no cover - not Linux
        pass
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    isa = _isa(flags) if flags else "unknown"
    try:
        from numpy.lib.introspect import opt_func_info

        numpy_target = opt_func_info(func_name="^exp2$", signature="float32")["exp2"]["ff"]["current"]
    except (ImportError, KeyError):  # pragma: no cover - NumPy without the introspection module or the loop
        numpy_target = "unknown"
    numba_target = None
    if importlib.util.find_spec("numba") is not None:
        try:
            import llvmlite.binding as ll
            import numba
            from numba.core.codegen import get_host_cpu_features

            name = numba.config.CPU_NAME or ll.get_host_cpu_name()  # type: ignore[attr-defined]  # set at run time
            features = numba.config.CPU_FEATURES  # type: ignore[attr-defined]  # numba.config sets it at run time
            if features is None:
                features = get_host_cpu_features()
            on = {f[1:] for f in features.split(",") if f.startswith("+")}
            target_isa = _isa(on) if on else _LLVM_CPU_ISA.get(name, "the CPU name's defaults")
            numba_target = f"{name} ({target_isa})"
        except Exception as err:  # numba installed but broken: say so, the benchmark still runs without it
            numba_target = f"does not load ({type(err).__name__})"
    env = tuple((k, os.environ[k]) for k in CPU_ENV if k in os.environ)
    return CpuInfo(model=model, isa=isa, numpy=numpy_target, numba=numba_target, env=env)


# --------------------------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class BenchRow:
    """One (pass, size, method) cell: repetition times in seconds, median, rates and ratios (None = not run)."""

    pass_: str  # "forward" or "backward"
    method: str
    batch: int
    heads: int
    n: int
    d: int
    causal: bool
    times: tuple[float, ...]
    median_s: float | None
    gflops: float | None
    gemm_fraction: float | None
    vs_torch: float | None
    vs_floor: float | None
    peak_mb: float | None
    note: str = ""
    min_s: float | None = None  # the fastest timed call (with isolate: of every process's calls)


@dataclass(frozen=True)
class DecodeRow:
    """A KV-cache decode step at ``context`` tokens against recomputing causal attention over the context."""

    context: int
    decode_s: float
    full_s: float
    speedup: float
    us_per_1k_tokens: float


@dataclass(frozen=True)
class LongRun:
    """One long-context forward in a fresh process: its time and the whole process's peak RSS."""

    n: int
    d: int
    heads: int
    causal: bool
    seconds: float
    peak_rss_mb: float
    dense_scores_gib: float


@dataclass(frozen=True)
class BenchResult:
    """Everything one benchmark run measured, with the machine it ran on."""

    rows: tuple[BenchRow, ...]
    gemm_gflops: float
    blas: BlasInfo
    torch: str | None
    cores: int
    config: dict[str, Any]
    decode: tuple[DecodeRow, ...] = ()
    long: LongRun | None = None
    cpu: CpuInfo | None = None
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))

    def to_json(self) -> dict[str, Any]:
        """The JSON document ``attnlab bench --json PATH`` writes (schema ``attnlab.bench/1``,
        :mod:`attnlab.schemas`)."""
        from .schemas import name

        d = {"schema": name("bench"), **asdict(self)}
        d["blas_line"] = self.blas.line()
        d["cpu_line"] = self.cpu.line() if self.cpu is not None else None
        d["timing"] = self.timing()
        return d

    def timing(self) -> str:
        """How the times were taken (one process, or each method in fresh processes)."""
        p = self.config.get("isolate")
        if p:
            return (
                f"timing: each method in fresh processes, {p} per method and cell, alternating; one untimed call, "
                f"then {self.config['repetitions']} timed calls per process; median of the processes' medians"
            )
        return "timing: every method in this process (tiled and floor interleaved); median of the repetitions"

    def write_json(self, path: str) -> None:
        """Write :meth:`to_json` to ``path`` (indented JSON)."""
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)

    def table(self) -> str:
        """The table ``attnlab bench`` prints."""
        lines = [
            f"attnlab bench  {self.created}  cores={self.cores}  GEMM rate {self.gemm_gflops:.0f} GFLOP/s (float32)",
            self.cpu.line() if self.cpu is not None else "CPU: not recorded",
            self.blas.line() + (f"; tiled: {self.config['kernel']}" if self.config.get("kernel") else ""),
            f"PyTorch: {self.torch or 'not installed'}",
            self.timing(),
            "",
            f"{'pass':<8} {'n':>6} {'d':>4} {'causal':>6} {'method':<6} {'median ms':>10} {'min ms':>9} {'GFLOP/s':>8} "
            f"{'%GEMM':>6} {'×torch':>7} {'×floor':>7} {'peak MB':>8}",
        ]

        def f(x: float | None, fmt: str) -> str:
            return "-" if x is None else format(x, fmt)

        for r in self.rows:
            lines.append(
                f"{r.pass_:<8} {r.n:>6} {r.d:>4} {'yes' if r.causal else 'no':>6} {r.method:<6} "
                f"{f(None if r.median_s is None else r.median_s * 1e3, '.1f'):>10} "
                f"{f(r.min_s * 1e3 if r.min_s is not None else None, '.1f'):>9} {f(r.gflops, '.1f'):>8} "
                f"{f(None if r.gemm_fraction is None else 100 * r.gemm_fraction, '.0f'):>6} "
                f"{f(r.vs_torch, '.2f'):>7} {f(r.vs_floor, '.2f'):>7} {f(r.peak_mb, '.1f'):>8}"
                + (f"  {r.note}" if r.note else "")
            )
        if self.decode:
            lines += [
                "",
                f"{'context':>8} {'decode ms':>10} {'full causal ms':>15} {'speedup':>8} {'µs/1k tokens':>13}",
            ]
            for dr in self.decode:
                lines.append(
                    f"{dr.context:>8} {dr.decode_s * 1e3:>10.3f} {dr.full_s * 1e3:>15.1f} {dr.speedup:>8.0f} "
                    f"{dr.us_per_1k_tokens:>13.1f}"
                )
            fit = decode_fit(self.decode)
            if fit is not None:
                a, b, worst = fit
                lines.append(
                    f"decode step ≈ {a * 1e6:.0f} µs + {b * 1e9:.1f} µs per 1k context tokens (least squares; "
                    f"largest deviation from the line {100 * worst:.0f}%)"
                )
        if self.long is not None:
            lr = self.long
            lines += [
                "",
                f"long context: n={lr.n}, d={lr.d}, {lr.heads} head(s), causal={lr.causal}: {lr.seconds:.2f} s, "
                f"peak RSS of the whole process {lr.peak_rss_mb:.0f} MB (the dense score matrix alone: "
                f"{lr.dense_scores_gib:.0f} GiB)",
            ]
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------------
# the methods


def _flops(batch: int, heads: int, n: int, d: int, causal: bool, backward: bool) -> float:
    f = 4.0 * batch * heads * n * n * d / (2 if causal else 1)
    return 2.5 * f if backward else f


def _naive_bytes(batch: int, heads: int, n: int) -> int:
    return 6 * batch * heads * n * n * 4  # scores, scaled, allowed, masked logits, exp, weights (roughly)


# --------------------------------------------------------------------------------------------------------------
# the GEMM floor: the tiled forward's matrix products alone


def _floor_task(plan: Any, out: np.ndarray, task: tuple[tuple[int, ...], int, int]) -> None:
    """One query block's products against its key blocks, ``sum_j (Q_i K_jᵀ) V_j``, with no softmax."""
    from .kernels.tiled.plan import scratch

    idx, i0, i1 = task
    dt = plan.q.dtype
    qs = plan.q[idx][i0:i1] * dt.type(plan.scale)
    K, V = plan.k[idx], plan.v[idx]
    acc = np.zeros((i1 - i0, plan.d_v), dtype=dt)
    pv = np.empty_like(acc)
    buf = scratch((i1 - i0) * plan.block_k, dt)
    for j0, j1, _ in plan.key_blocks(idx, i0, i1):
        s = buf[: (i1 - i0) * (j1 - j0)].reshape(i1 - i0, j1 - j0)
        np.matmul(qs, K[j0:j1].T, out=s)
        np.matmul(s, V[j0:j1], out=pv)
        acc += pv
    out[idx][i0:i1] = acc


def gemm_floor(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    block_q: int | None = None,
    block_k: int | None = None,
    num_threads: int | None = None,
) -> np.ndarray:
    """The tiled forward's matrix products alone, ``sum_j (Q_i K_jᵀ) V_j`` with no softmax: NOT attention.

    The same plan, tasks, blocks, block skipping and threads as :func:`attnlab.kernels.flash_attention`; its time is
    the physical limit of this design, which ``attnlab bench`` reports as the "GEMM floor". Shapes as in
    :func:`~attnlab.kernels.flash_attention`.
    """
    from .kernels.threads import run_tasks
    from .kernels.tiled.plan import forward_tasks, make_plan, options

    opts = options(causal=causal, masked_rows="zero", block_q=block_q, block_k=block_k, num_threads=num_threads)
    plan = make_plan(q, k, v, None, opts)
    out = np.empty((*plan.batch, plan.n_q, plan.d_v), dtype=plan.q.dtype)
    run_tasks(lambda t: _floor_task(plan, out, t), forward_tasks(plan), plan.threads)
    return out.reshape((*plan.out_batch, plan.n_q, plan.d_v))


def _kernel_line(kw: dict[str, Any]) -> str:
    """The tiled kernel's block sizes and the exponential it uses in this process
    (:func:`attnlab.kernels.exponential`)."""
    from .kernels import exponential, fused, tiled

    bq = kw.get("block_q") or tiled.DEFAULT_BLOCK_Q
    bk = kw.get("block_k") or tiled.DEFAULT_BLOCK_K
    e = exponential("float32")
    if e.fused:
        return f"blocks {bq}x{bk}, fused exp2 + row sums (numba {fused.version()})"
    return f"blocks {bq}x{bk}, np.{e.name} ({e.reason})"


def _make_methods(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    causal: bool,
    backward: bool,
    methods: Sequence[str],
    kw: dict[str, Any],
    naive_ok: bool,
) -> dict[str, Callable[[], Any] | str]:
    """name -> a zero-argument callable that runs one repetition, or a string saying why it is skipped."""
    from .core import attention_trace, scaled_dot_product_attention
    from .kernels.tiled import flash_attention, flash_attention_backward

    out: dict[str, Callable[[], Any] | str] = {}
    rng = np.random.default_rng(1)
    d_o = rng.standard_normal((*q.shape[:-1], v.shape[-1]), dtype=np.float32)
    torch_mod: Any = None
    if "torch" in methods:
        try:
            import torch as torch_mod
        except ImportError:
            out["torch"] = "skipped: PyTorch not installed"
    for name in methods:
        if name in out:
            continue
        if name == "naive":
            if not naive_ok:
                out[name] = "skipped: the dense score matrices exceed --naive-max-gb"
            elif not backward:
                out[name] = lambda: scaled_dot_product_attention(q, k, v, causal=causal)
            else:
                from .core.gradients import attention_backward

                trace = attention_trace(q, k, v, causal=causal)
                out[name] = functools.partial(attention_backward, trace, d_o)
        elif name == "tiled":
            if not backward:
                out[name] = lambda: flash_attention(q, k, v, causal=causal, **kw)
            else:
                fwd = flash_attention(q, k, v, causal=causal, **kw)
                out[name] = functools.partial(flash_attention_backward, fwd, d_o)
        elif name == "floor":
            if backward:
                out[name] = "skipped: the floor is measured for the forward"
            else:
                out[name] = lambda: gemm_floor(q, k, v, causal=causal, **kw)
        elif name == "torch":
            tq, tk, tv = (torch_mod.from_numpy(x) for x in (q, k, v))
            sdpa = torch_mod.nn.functional.scaled_dot_product_attention
            if not backward:

                def run_torch(tq=tq, tk=tk, tv=tv, sdpa=sdpa) -> Any:
                    with torch_mod.no_grad():
                        return sdpa(tq, tk, tv, is_causal=causal)

                out[name] = run_torch
            else:
                tdo = torch_mod.from_numpy(d_o)

                def run_torch_bwd(tq=tq, tk=tk, tv=tv, tdo=tdo, sdpa=sdpa) -> Any:
                    # forward outside the timed region is not possible with autograd's graph freed on backward,
                    # so time the backward alone: build the graph, then time .backward()
                    a, b, c = (x.detach().requires_grad_(True) for x in (tq, tk, tv))
                    o = sdpa(a, b, c, is_causal=causal)
                    t = time.perf_counter()
                    o.backward(tdo)
                    return time.perf_counter() - t

                out[name] = run_torch_bwd
        else:
            raise OptionError(f"methods: unknown method {name!r}; expected some of {', '.join(METHODS)}")
    return out


def _warm_up_tiled(kw: dict[str, Any]) -> None:
    """One small forward and backward, so that the first cell's memory figure does not include what the first call
    of a process loads once (numba and the fused passes, ~150 MB of RSS; the threads and their buffers)."""
    from .kernels import tiled

    x = np.zeros((2, 64, 8), dtype=np.float32)
    for causal in (False, True):
        f = tiled.flash_attention(x, x, x, causal=causal, **kw)
        tiled.flash_attention_backward(f, x)


def _groups(names: list[str]) -> list[list[str]]:
    """The timing schedule: the tiled kernel and its GEMM floor interleaved (their ratio is the one that must not
    drift with the machine's load), every other method in a group of its own (see :data:`SETTLE_S`)."""
    paired = [name for name in names if name in ("tiled", "floor")]
    return ([paired] if paired else []) + [[name] for name in names if name not in paired]


#: Seconds of idle before every timed call. Each method group (:func:`_groups`) starts with one untimed call of
#: each of its methods: whatever runs first after a large PyTorch call, or after the naive method has freed
#: gigabytes, is slowed for that whole call, by more than any pause undoes (at n = 8192, d = 128 the GEMM floor
#: took 756-884 ms as the first call after SDPA, even after a 1 s pause, and 657-684 ms in the call after it:
#: ``python benchmarks/bench_blocks.py --only after-torch``); with every
#: method interleaved, the one timed after PyTorch took that penalty in most repetitions. The pause itself absorbs
#: the ~10 ms that PyTorch's OpenMP threads spin after a call.
SETTLE_S = 0.05


def _ints(name: str, values: Any, minimum: int) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise OptionError(f"{name}: expected a non-empty list of ints >= {minimum}, got {values!r}")
    out = tuple(check_int(name, v, minimum=minimum) for v in values)
    if not out:
        raise OptionError(f"{name}: expected a non-empty list of ints >= {minimum}, got []")
    return out


def decode_minimum(repetitions: int) -> int:
    """The shortest context :func:`decode_scaling` can time with ``max(9, repetitions)`` steps: one step's worth
    of warm-up, the timed steps and one token before them."""
    return max(9, repetitions) + 2


def _bools(name: str, values: Any) -> tuple[bool, ...]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise OptionError(f"{name}: expected a non-empty list of bools, got {values!r}")
    out = tuple(values)
    if not out or not all(isinstance(c, bool) for c in out):
        raise OptionError(f"{name}: expected a non-empty list of bools, got {values!r}")
    return out


def _methods(values: Any) -> tuple[str, ...]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__") or not list(values):
        raise OptionError(f"methods: expected a non-empty list of {', '.join(METHODS)}, got {values!r}")
    for name in values:
        if name not in METHODS:
            raise OptionError(f"methods: unknown method {name!r}; expected some of {', '.join(METHODS)}")
    return tuple(values)


def _optional_int(name: str, value: Any, minimum: int) -> int | None:
    return None if value is None else check_int(name, value, minimum=minimum)


@dataclass(frozen=True)
class BenchOptions:
    """What :func:`run_bench` measures, checked once on construction (an :class:`~attnlab.errors.OptionError` names
    the first option that cannot run, before any work). Sequences are kept as tuples, numbers as Python ints.

    Attributes:
        sizes, d, heads, batch, causal: the grid: float32 inputs ``[batch, heads, n, d]`` for each ``n`` in
            ``sizes``, each ``d`` and each causal flag.
        repetitions: timed runs per method and cell (the median is reported): tiled and floor interleaved, every
            other method in a block of its own after one untimed call, each timed call after :data:`SETTLE_S` of
            idle. One more untimed run per cell measures peak memory. With ``isolate``: the timed calls in each
            process.
        methods: some of ``naive``, ``tiled``, ``floor``, ``torch``.
        backward: also time the backward pass (tiled, naive analytic and torch autograd).
        block_q, block_k, num_threads: passed to the tiled kernel (:meth:`kernel_options`).
        naive_max_gb: skip the naive method where its score matrices would need more memory than this.
        decode_contexts: also time a KV-cache decode step at these context lengths (:func:`decode_scaling`; each
            at least :func:`decode_minimum` tokens).
        long_n: also run one causal single-head d=64 forward at this n in a fresh process (:func:`long_context`).
        isolate: time each method in ``isolate`` fresh Python processes per cell instead of this one (the methods'
            processes alternating; each process makes one untimed call, then ``repetitions`` timed ones): the
            median of the processes' medians is reported, and the ratios are computed from those medians.

    >>> BenchOptions(sizes=[512], methods=["tiled"]).sizes
    (512,)
    >>> BenchOptions(heads=0)
    Traceback (most recent call last):
    ...
    attnlab.errors.OptionError: heads: expected an int >= 1, got 0
    """

    sizes: Sequence[int] = (1024, 2048, 4096)
    d: Sequence[int] = (64,)
    heads: int = 8
    batch: int = 1
    causal: Sequence[bool] = (False, True)
    repetitions: int = 3
    methods: Sequence[str] = METHODS
    backward: bool = False
    block_q: int | None = None
    block_k: int | None = None
    num_threads: int | None = None
    naive_max_gb: float = 4.0
    decode_contexts: Sequence[int] = ()
    long_n: int | None = None
    isolate: int | None = None

    def __post_init__(self) -> None:
        repetitions = check_int("repetitions", self.repetitions, minimum=1)
        checked = {
            "sizes": _ints("sizes", self.sizes, 1),
            "d": _ints("d", self.d, 1),
            "heads": check_int("heads", self.heads, minimum=1),
            "batch": check_int("batch", self.batch, minimum=1),
            "causal": _bools("causal", self.causal),
            "repetitions": repetitions,
            "methods": _methods(self.methods),
            "backward": check_choice("backward", self.backward, (False, True)),
            "block_q": _optional_int("block_q", self.block_q, 1),
            "block_k": _optional_int("block_k", self.block_k, 1),
            "num_threads": _optional_int("num_threads", self.num_threads, 1),
            "naive_max_gb": check_float("naive_max_gb", self.naive_max_gb, minimum=0.0, finite=False),
            "decode_contexts": _ints("decode_contexts", self.decode_contexts, decode_minimum(repetitions))
            if self.decode_contexts
            else (),
            "long_n": _optional_int("long_n", self.long_n, 1),
            "isolate": _optional_int("isolate", self.isolate, 1),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def to_json(self) -> dict[str, Any]:
        """Every option by name, sequences as lists (what :attr:`BenchResult.config` holds besides the kernel)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def kernel_options(self) -> dict[str, int | None]:
        """The tiled kernel's keywords: ``block_q``, ``block_k``, ``num_threads``."""
        return {"block_q": self.block_q, "block_k": self.block_k, "num_threads": self.num_threads}


def _time_in_process(
    fns: dict[str, Callable[[], Any] | str], backward: bool, repetitions: int, tick: Callable[[], None]
) -> tuple[dict[str, list[float]], dict[str, float | None]]:
    """Peak memory of one untimed call each, then the schedule of :func:`_groups`; ``(times, peaks)``."""
    peaks: dict[str, float | None] = {}
    for name, fn in fns.items():
        if callable(fn):
            _, peaks[name] = peak_memory(fn)
    tick()
    calls = {name: fn for name, fn in fns.items() if callable(fn)}
    times: dict[str, list[float]] = {name: [] for name in calls}
    groups = _groups(list(times))
    step = 0
    for group in groups:
        for name in group:  # untimed: absorbs what the previous group left behind (see SETTLE_S)
            calls[name]()
        for _ in range(repetitions):
            for name in group:
                time.sleep(SETTLE_S)
                t = time.perf_counter()
                r = calls[name]()
                elapsed = time.perf_counter() - t
                if name == "torch" and backward:
                    elapsed = float(r)  # the backward alone
                times[name].append(elapsed)
            step += 1
            if step % len(groups) == 0:  # `repetitions` ticks per cell, whatever the number of groups
                tick()
    return times, peaks


def _isolated_child(spec: str) -> None:  # pragma: no cover - runs in a subprocess (tested through run_bench)
    """One method, one cell, in a fresh process: one untimed call (its peak memory), then the timed calls; prints
    one JSON line."""
    a = json.loads(spec)
    rng = np.random.default_rng(a["seed"])
    shape = (a["batch"], a["heads"], a["n"], a["d"])
    q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
    if a["method"] in ("tiled", "floor"):
        _warm_up_tiled(a["kw"])
    fn = _make_methods(q, k, v, a["causal"], a["backward"], [a["method"]], a["kw"], True)[a["method"]]
    assert callable(fn)
    _, peak = peak_memory(fn)
    times = []
    for _ in range(a["repetitions"]):
        time.sleep(SETTLE_S)
        t = time.perf_counter()
        r = fn()
        elapsed = time.perf_counter() - t
        times.append(float(r) if a["method"] == "torch" and a["backward"] else elapsed)
    print(json.dumps({"times": times, "peak_mb": peak}))


def _run_isolated(spec: dict[str, Any], timeout: float = 1800) -> dict[str, Any]:
    code = f"from attnlab.bench import _isolated_child; _isolated_child({json.dumps(json.dumps(spec))})"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=_child_env(), check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"isolated {spec['method']} run failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _time_isolated(
    fns: dict[str, Callable[[], Any] | str],
    spec: dict[str, Any],
    processes: int,
    tick: Callable[[], None],
) -> tuple[dict[str, list[float]], dict[str, float | None], dict[str, float]]:
    """``processes`` fresh processes per method, the methods alternating (the first method of each round rotates);
    ``(per-process medians, peak MB of the first process, fastest call)``."""
    names = [name for name, fn in fns.items() if callable(fn)]
    times: dict[str, list[float]] = {name: [] for name in names}
    peaks: dict[str, float | None] = {}
    fastest: dict[str, float] = {}
    for p in range(processes):
        order = names[p % len(names) :] + names[: p % len(names)] if names else []
        for name in order:
            got = _run_isolated({**spec, "method": name})
            times[name].append(statistics.median(got["times"]))
            peaks.setdefault(name, got["peak_mb"])
            fastest[name] = min(fastest.get(name, float("inf")), *got["times"])
        tick()
    return times, peaks, fastest


def _physical_memory() -> int | None:
    """Bytes of RAM on this machine (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def _check_memory(o: BenchOptions) -> None:
    """A :class:`~attnlab.errors.MemoryLimitError` before any work when the largest cell's float32 arrays (q, k, v,
    the output, and with ``backward`` its four gradients) cannot fit in this machine's memory."""
    from .errors import MemoryLimitError

    ram = _physical_memory()
    if ram is None:
        return
    n, dd = max(o.sizes), max(o.d)
    arrays = 4 + (4 if o.backward else 0)
    need = arrays * o.batch * o.heads * n * dd * 4
    if need > ram:
        raise MemoryLimitError(
            f"--sizes: n={n} needs {need / 2**30:.3g} GiB for its float32 arrays alone ({arrays} of [batch={o.batch}, "
            f"heads={o.heads}, n={n}, d={dd}]), more than this machine's {ram / 2**30:.3g} GiB of memory; pass "
            f"smaller --sizes"
        )


def run_bench(
    options: BenchOptions | None = None,
    /,
    *,
    progress: Progress | None = None,
    seed: int = 0,
    **fields: Any,
) -> BenchResult:
    """Time every method on float32 inputs ``[batch, heads, n, d]`` for each size, d and causal flag.

    Args:
        options: what to measure, a :class:`BenchOptions` (default ``BenchOptions()``).
        progress: called as ``progress(description, done, total)`` after every step.
        seed: the inputs' random seed (cell ``i`` uses ``seed + i``).
        **fields: :class:`BenchOptions` fields, the keyword spelling: ``run_bench(sizes=(512,), heads=4)`` is
            ``run_bench(BenchOptions(sizes=(512,), heads=4))``; given with ``options``, they replace its fields.

    Raises:
        OptionError: an option that cannot run, before any work.
        MemoryLimitError: the largest size's arrays cannot fit in this machine's memory, before any work.

    Returns:
        :class:`BenchResult`; ``result.table()`` is what ``attnlab bench`` prints.
    """
    if options is None:
        o = BenchOptions(**fields)
    elif isinstance(options, BenchOptions):
        o = replace(options, **fields) if fields else options
    else:
        raise OptionError(f"options: expected a BenchOptions, got {type(options).__name__}")
    kw = o.kernel_options()
    passes = ("forward", "backward") if o.backward else ("forward",)
    cells = [(p, n, dd, c) for p in passes for dd in o.d for c in o.causal for n in o.sizes]
    _check_memory(o)
    per_cell = o.isolate if o.isolate else o.repetitions + 1
    total = len(cells) * per_cell + 1 + len(o.decode_contexts) + (1 if o.long_n else 0)
    done = 0

    def tick(desc: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(desc, done, total)

    gemm = gemm_rate(1024 if max(o.sizes) < 1024 else 2048)
    _warm_up_tiled(kw)
    tick("GEMM rate")
    rng = np.random.default_rng(seed)
    rows: list[BenchRow] = []
    for index, (pass_, n, dd, c) in enumerate(cells):
        label = f"{pass_} n={n} d={dd} causal={c}"
        naive_ok = _naive_bytes(o.batch, o.heads, n) <= o.naive_max_gb * 2**30
        fastest: dict[str, float] = {}
        if o.isolate:
            # the processes make their own inputs: no arrays here, only what is skipped and why
            fns: dict[str, Callable[[], Any] | str] = {}
            for name in o.methods:
                if name == "naive" and not naive_ok:
                    fns[name] = "skipped: the dense score matrices exceed --naive-max-gb"
                elif name == "floor" and pass_ == "backward":
                    fns[name] = "skipped: the floor is measured for the forward"
                elif name == "torch" and importlib.util.find_spec("torch") is None:
                    fns[name] = "skipped: PyTorch not installed"
                else:
                    fns[name] = _no_call
            spec = {"seed": seed + index, "batch": o.batch, "heads": o.heads, "n": n, "d": dd, "causal": c,
                    "backward": pass_ == "backward", "kw": kw, "repetitions": o.repetitions}  # fmt: skip
            times, peaks, fastest = _time_isolated(
                fns, spec, o.isolate, functools.partial(tick, f"{label}: one process of each method")
            )
        else:
            q, k, v = (rng.standard_normal((o.batch, o.heads, n, dd), dtype=np.float32) for _ in range(3))
            fns = _make_methods(q, k, v, c, pass_ == "backward", o.methods, kw, naive_ok)
            steps = iter(["warm-up", *(f"{i + 1}/{o.repetitions} of the repetitions" for i in range(o.repetitions))])

            def step_done(label: str = label, steps: Iterator[str] = steps) -> None:
                tick(f"{label}: {next(steps)}")

            times, peaks = _time_in_process(fns, pass_ == "backward", o.repetitions, step_done)
        med = {name: statistics.median(ts) for name, ts in times.items()}
        fl = _flops(o.batch, o.heads, n, dd, c, pass_ == "backward")
        for name in o.methods:
            fn = fns.get(name)
            if not callable(fn):
                rows.append(
                    BenchRow(
                        pass_, name, o.batch, o.heads, n, dd, c, (), None, None, None, None, None, None, str(fn or "")
                    )
                )
                continue
            m = med[name]
            rows.append(
                BenchRow(
                    pass_=pass_,
                    method=name,
                    batch=o.batch,
                    heads=o.heads,
                    n=n,
                    d=dd,
                    causal=c,
                    times=tuple(times[name]),
                    median_s=m,
                    gflops=fl / m / 1e9,
                    gemm_fraction=fl / m / 1e9 / gemm,
                    vs_torch=m / med["torch"] if "torch" in med else None,
                    vs_floor=m / med["floor"] if "floor" in med else None,
                    peak_mb=peaks.get(name),
                    min_s=fastest.get(name, min(times[name])),
                )
            )
    decode: list[DecodeRow] = []
    if o.decode_contexts:
        decode = list(decode_scaling(o.decode_contexts, heads=o.heads, d=o.d[0], repetitions=max(9, o.repetitions)))
        for _ in o.decode_contexts:
            tick("decode")
    long = None
    if o.long_n:
        long = long_context(o.long_n)
        tick("long context")
    return BenchResult(
        rows=tuple(rows),
        gemm_gflops=gemm,
        blas=blas_report(),
        torch=_torch_info() if "torch" in o.methods else None,
        cores=available_cores(),
        config={"kernel": _kernel_line(kw), **o.to_json(), "dtype": "float32"},
        decode=tuple(decode),
        long=long,
        cpu=cpu_report(),
    )


def _no_call() -> None:  # pragma: no cover - a placeholder: isolated methods run in their own processes
    raise RuntimeError("isolated methods run in their own processes")


# --------------------------------------------------------------------------------------------------------------
# decoding and long context


def decode_scaling(
    contexts: Sequence[int] = (1024, 2048, 4096, 8192),
    *,
    heads: int = 8,
    d: int = 64,
    repetitions: int = 9,
    seed: int = 0,
) -> list[DecodeRow]:
    """Time one KV-cache decode step (append one token, attend) at each context length, against recomputing
    causal attention over the whole context with the tiled kernel (what generation without a cache repeats).

    Each context needs at least :func:`decode_minimum` ``(repetitions)`` tokens (an OptionError otherwise).
    """
    repetitions = check_int("repetitions", repetitions, minimum=1)
    contexts = _ints("contexts", contexts, decode_minimum(repetitions))
    heads, d = check_int("heads", heads, minimum=1), check_int("d", d, minimum=1)
    from .kernels.kv_cache import KVCache, cached_attention
    from .kernels.tiled import flash_attention

    rng = np.random.default_rng(seed)
    warm = KVCache(1, heads, d)  # the first call of a process pays for imports and page faults
    warm.append(np.zeros((1, heads, 2, d), np.float32), np.zeros((1, heads, 2, d), np.float32))
    cached_attention(np.zeros((1, heads, 1, d), np.float32), warm)
    out = []
    for ctx in contexts:
        k = rng.standard_normal((1, heads, ctx, d), dtype=np.float32)
        v = rng.standard_normal((1, heads, ctx, d), dtype=np.float32)
        q = rng.standard_normal((1, heads, ctx, d), dtype=np.float32)
        cache = KVCache(1, heads, d, capacity=ctx + 64)
        cache.append(k[:, :, : ctx - repetitions - 1], v[:, :, : ctx - repetitions - 1])
        steps = []
        for i in range(ctx - repetitions - 1, ctx):
            t = time.perf_counter()
            cache.append(k[:, :, i : i + 1], v[:, :, i : i + 1])
            cached_attention(q[:, :, i : i + 1], cache)
            steps.append(time.perf_counter() - t)
        decode_s = statistics.median(steps[1:])
        fulls = []
        for _ in range(max(1, min(3, repetitions // 2))):
            t = time.perf_counter()
            flash_attention(q, k, v, causal=True)
            fulls.append(time.perf_counter() - t)
        full_s = statistics.median(fulls)
        out.append(DecodeRow(ctx, decode_s, full_s, full_s / decode_s, decode_s / ctx * 1e3 * 1e6))
    return out


def decode_fit(rows: Sequence[DecodeRow]) -> tuple[float, float, float] | None:
    """Least-squares line ``decode_s = a + b · context`` through the rows: ``(a, b, largest relative deviation)``.

    A linear cost shows as a small deviation; ``None`` with fewer than two contexts.
    """
    if len(rows) < 2:
        return None
    x = np.array([r.context for r in rows], dtype=np.float64)
    y = np.array([r.decode_s for r in rows], dtype=np.float64)
    b, a = np.polyfit(x, y, 1)
    worst = float(np.max(np.abs(a + b * x - y) / y))
    return float(a), float(b), worst


def _child_env() -> dict[str, str]:
    """This process's environment, with this copy of attnlab first on the child's path."""
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _long_child(n: int, d: int, heads: int) -> None:  # pragma: no cover - runs in a subprocess
    from .kernels.tiled import flash_attention

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, heads, n, d), dtype=np.float32) for _ in range(3))
    t = time.perf_counter()
    r = flash_attention(q, k, v, causal=True)
    seconds = time.perf_counter() - t
    assert np.isfinite(r.output).all()
    # VmHWM belongs to this process image (ru_maxrss may carry the parent's peak across fork + exec)
    peak_kb = _status_kb("VmHWM:")
    if peak_kb is None:  # pragma: no cover - not Linux
        import resource

        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "peak_rss_mb": peak_kb / 1024}))


def long_context(n: int = 65536, *, d: int = 64, heads: int = 1, timeout: float = 600) -> LongRun:
    """Run one causal forward at ``n`` tokens in a fresh Python process (NumPy and attnlab only) and report its
    time and the whole process's peak RSS."""
    n, d, heads = (check_int(name, x, minimum=1) for name, x in (("n", n), ("d", d), ("heads", heads)))
    timeout = check_float("timeout", timeout, positive=True)
    code = f"from attnlab.bench import _long_child; _long_child({n}, {d}, {heads})"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=_child_env(), check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"long-context run failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return LongRun(
        n=n,
        d=d,
        heads=heads,
        causal=True,
        seconds=data["seconds"],
        peak_rss_mb=data["peak_rss_mb"],
        dense_scores_gib=heads * n * n * 4 / 2**30,
    )


def plot(result: BenchResult, path: str) -> None:
    """A PNG of median time and peak memory against n (log-log) for every forward method, with an n² slope."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from .errors import missing_extra

        raise missing_extra("matplotlib", "plot") from None
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 5))
    groups: dict[tuple, list[BenchRow]] = {}
    for r in result.rows:
        if r.median_s is not None:
            groups.setdefault((r.pass_, r.method, r.d, r.causal), []).append(r)
    ref_done = False
    for (pass_, method, dd, c), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r.n)
        ns = [r.n for r in rs]
        label = f"{method} {pass_} d={dd}{' causal' if c else ''}"
        style = "--" if pass_ == "backward" else "-"
        ax_t.plot(ns, [r.median_s for r in rs], style, marker="o", label=label)
        mem = [(r.n, r.peak_mb) for r in rs if r.peak_mb]
        if mem:
            ax_m.plot([m[0] for m in mem], [m[1] for m in mem], style, marker="o", label=label)
        if not ref_done and len(ns) > 1:
            n0, t0 = ns[0], rs[0].median_s
            assert t0 is not None  # the rows plotted were timed
            ax_t.plot(ns, [t0 * (x / n0) ** 2 for x in ns], ":", color="gray", label="n² slope")
            ref_done = True
    for ax, ylabel in ((ax_t, "median time (s)"), (ax_m, "peak memory during one call (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("n (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"attnlab bench, float32, B={result.config['batch']}, h={result.config['heads']} — {result.blas.line()}",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
