"""Both cores, no oversubscription: a shared thread pool for the kernels, BLAS pinned to one thread per worker.

The tiled kernels split their work into independent tasks (one per batch·head and query block) and run them on
``num_threads`` Python threads. NumPy releases the GIL inside matrix products and large element-wise operations, so
the threads run truly in parallel. While they run, the BLAS library (OpenBLAS, MKL, ...) is limited to one thread
with `threadpoolctl <https://github.com/joblib/threadpoolctl>`_; otherwise each worker's matrix product would start
its own BLAS threads and the two cores would be oversubscribed.

All calls share **one** pool of worker threads. It grows to the largest thread count asked for (capped at
:func:`max_threads`, four per available core) and is never multiplied: a call that wants fewer threads runs that many
worker loops in it, the calling thread being one of them. So after calls with ``num_threads`` 2, 3, ..., 64 the
process holds at most ``max_threads() - 1`` idle kernel threads, not one pool per distinct count.

``threadpoolctl`` is optional (``pip install 'attnlab[fast]'``). Without it the kernels run their tasks on the
calling thread only and leave BLAS with its own threads (correct, and never oversubscribed, but slower on small
blocks). :func:`blas_report` says which BLAS library, kernel ("architecture") and thread count are in use, or
why that is unknown.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..validate import check_optional_int
from .config import current as current_config

__all__ = [
    "BlasInfo",
    "available_cores",
    "blas_report",
    "max_threads",
    "pinned_blas",
    "pool_size",
    "resolve_threads",
    "run_tasks",
]

_lock = threading.Lock()
_shared: ThreadPoolExecutor | None = None  # the one pool (None until a call needs threads)
_shared_size = 0  # its max_workers
_controller: Any = None


def available_cores() -> int:
    """The number of cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _has_threadpoolctl() -> bool:
    """threadpoolctl is installed and not turned off (:mod:`attnlab.kernels.config`, ``use_threadpoolctl``)."""
    if not current_config().use_threadpoolctl:
        return False
    try:
        import threadpoolctl  # noqa: F401  # only whether it imports
    except ImportError:
        return False
    return True


def max_threads() -> int:
    """The most worker threads a call runs: four per available core (more would only oversubscribe the cores)."""
    return 4 * available_cores()


def resolve_threads(num_threads: Any) -> int:
    """``None`` -> every available core (1 without threadpoolctl); otherwise an int >= 1 (an
    :class:`~attnlab.errors.OptionError` if not), capped at :func:`max_threads`."""
    n = check_optional_int("num_threads", num_threads, minimum=1)
    if n is None:
        return available_cores() if _has_threadpoolctl() else 1
    return min(n, max_threads())


def _get_controller() -> Any:
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    return _controller


@contextmanager
def pinned_blas(threads: int = 1) -> Iterator[None]:
    """Limit BLAS to ``threads`` threads inside the block (a no-op without threadpoolctl)."""
    if not _has_threadpoolctl():
        yield
        return
    with _get_controller().limit(limits=threads, user_api="blas"):
        yield


def _submit(fn: Callable[[], None], count: int) -> list[Any]:
    """``count`` futures of ``fn`` in the shared pool, which is first replaced by a larger one if it has room for
    fewer than ``count`` threads (the old one is shut down: its threads finish what they run, then exit). Under the
    lock, so that no call submits to a pool another call has just shut down."""
    global _shared, _shared_size
    with _lock:
        if _shared is None or _shared_size < count:
            old = _shared
            _shared_size = min(max(count, _shared_size), max_threads())
            _shared = ThreadPoolExecutor(max_workers=_shared_size, thread_name_prefix="attnlab-kernel")
            if old is not None:
                old.shutdown(wait=False)
        return [_shared.submit(fn) for _ in range(count)]


def pool_size() -> int:
    """How many threads the shared pool may hold (0 before any call used threads)."""
    return _shared_size


def run_tasks(fn: Callable[[Any], Any], tasks: Iterable[Any], num_threads: int) -> list[Any]:
    """``[fn(t) for t in tasks]``, on ``num_threads`` threads with BLAS pinned to one thread each.

    ``num_threads - 1`` worker loops run in the shared pool and one on the calling thread; each takes the next task
    until none is left, so exactly ``num_threads`` tasks run at a time, whatever the pool's size, and the calling
    thread alone finishes the work if the pool is busy. Tasks should be listed from the most expensive to the
    cheapest (they are handed out in order, so the last ones fill the gaps). With one thread, or one task,
    everything runs on the calling thread and BLAS keeps its own threads. The first exception in a task is
    re-raised here (the other tasks are not started once one has failed).
    """
    tasks = list(tasks)
    n = min(num_threads, len(tasks), max_threads())
    if n <= 1 or not _has_threadpoolctl():
        return [fn(t) for t in tasks]
    results: list[Any] = [None] * len(tasks)
    failed: list[BaseException] = []
    order = iter(range(len(tasks)))
    take = threading.Lock()

    def work() -> None:
        while not failed:
            with take:
                i = next(order, None)
            if i is None:
                return
            try:
                results[i] = fn(tasks[i])
            except BaseException as err:
                failed.append(err)
                return

    with pinned_blas(1):
        futures = _submit(work, n - 1)
        work()
        for f in futures:
            f.result()
    if failed:
        raise failed[0]
    return results


@dataclass(frozen=True)
class BlasInfo:
    """Which BLAS NumPy uses: library (``openblas``, ``mkl``, ...), version, kernel ("architecture"), threads.

    ``env`` holds the environment variables that steer OpenBLAS's kernel choice (``OPENBLAS_CORETYPE``,
    ``OPENBLAS_L2_SIZE``, ``OPENBLAS_NUM_THREADS``, ...) as they are set in this process.
    """

    library: str
    version: str
    architecture: str
    num_threads: int | None
    threading_layer: str
    env: tuple[tuple[str, str], ...]

    def line(self) -> str:
        """One line for benchmark output."""
        env = " ".join(f"{k}={v}" for k, v in self.env) or "none"
        threads = "?" if self.num_threads is None else str(self.num_threads)
        return (
            f"BLAS: {self.library} {self.version}, kernel {self.architecture}, {threads} thread(s) "
            f"({self.threading_layer}); env: {env}"
        )


def blas_report() -> BlasInfo:
    """The BLAS library and kernel NumPy's matrix products run on (via threadpoolctl when installed)."""

    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(("OPENBLAS_", "MKL_", "OMP_NUM"))))
    if not _has_threadpoolctl():
        return BlasInfo("unknown (install attnlab[fast] for threadpoolctl)", "?", "?", None, "?", env)
    from threadpoolctl import threadpool_info

    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    numpy_blas = [i for i in blas if "numpy" in i.get("filepath", "")] or blas
    if not numpy_blas:
        return BlasInfo("none found", "?", "?", None, "?", env)
    i = numpy_blas[0]
    return BlasInfo(
        library=str(i.get("internal_api", "?")),
        version=str(i.get("version") or "?"),
        architecture=str(i.get("architecture") or "?"),
        num_threads=i.get("num_threads"),
        threading_layer=str(i.get("threading_layer") or "?"),
        env=env,
    )
