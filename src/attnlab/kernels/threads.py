"""Both cores, no oversubscription: a shared thread pool for the kernels, BLAS pinned to one thread per worker.

The tiled kernels split their work into independent tasks (one per batch·head and query block) and run them on
``num_threads`` Python threads. NumPy releases the GIL inside matrix products and large element-wise operations, so
the threads run truly in parallel. While they run, the BLAS library (OpenBLAS, MKL, ...) is limited to one thread
with `threadpoolctl <https://github.com/joblib/threadpoolctl>`_; otherwise each worker's matrix product would start
its own BLAS threads and the two cores would be oversubscribed.

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

__all__ = ["BlasInfo", "available_cores", "blas_report", "pinned_blas", "resolve_threads", "run_tasks"]

_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}
_controller: Any = None


def available_cores() -> int:
    """The number of cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _has_threadpoolctl() -> bool:
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_threads(num_threads: Any) -> int:
    """``None`` -> every available core (1 without threadpoolctl); otherwise a positive int, checked."""
    if num_threads is None:
        return available_cores() if _has_threadpoolctl() else 1
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        from ..errors import ShapeError

        raise ShapeError(f"num_threads: expected None or an int >= 1, got {num_threads!r}")
    return num_threads


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


def _pool(n: int) -> ThreadPoolExecutor:
    with _lock:
        pool = _pools.get(n)
        if pool is None:
            pool = _pools[n] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="attnlab-kernel")
        return pool


def run_tasks(fn: Callable[[Any], Any], tasks: Iterable[Any], num_threads: int) -> list[Any]:
    """``[fn(t) for t in tasks]``, on ``num_threads`` worker threads with BLAS pinned to one thread each.

    Tasks should be listed from the most expensive to the cheapest (the pool hands them out in order, so the
    last ones fill the gaps). With one thread, or one task, everything runs on the calling thread and BLAS keeps
    its own threads. An exception in a task is re-raised here.
    """
    tasks = list(tasks)
    if num_threads <= 1 or len(tasks) <= 1 or not _has_threadpoolctl():
        return [fn(t) for t in tasks]
    with pinned_blas(1):
        return list(_pool(min(num_threads, len(tasks))).map(fn, tasks))


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
    import numpy as np  # noqa: F401  (load NumPy's BLAS before inspecting)

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
