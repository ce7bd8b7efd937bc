"""The kernels' private configuration: which code path they take where more than one gives the same result.

By default the kernels choose for themselves (the fastest exponential on this machine, the fast path when the scores
are bounded, the dense path for small decoding steps). Tests, benchmarks and anyone comparing paths can force a
choice for a block of code, explicitly::

    from attnlab.kernels import config

    with config.override(exp="exp", force_online=True):
        flash_attention(q, k, v)  # NumPy's exp, the online softmax on every query block

The state is one :class:`contextvars.ContextVar` holding a frozen :class:`KernelConfig`: :func:`override` sets it
for the current thread (or asyncio task) until the block ends; other threads keep theirs. Each call reads it once,
on the calling thread, into its plan; the worker threads only read the plan. Every setting changes speed only,
never a result beyond float rounding (each exponential is exact to about one float32 ulp).

This module is private to the kernels: it is not re-exported by :mod:`attnlab` and may change between releases.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import OptionError
from ..validate import check_choice, check_int

__all__ = ["EXPS", "KernelConfig", "current", "override"]

#: The exponentials the tiled kernels can use: ``"auto"`` (their own choice, see
#: :func:`attnlab.kernels.exponential`), ``"fused"`` (numba's compiled passes, float32; ``"exp2"`` without numba),
#: ``"exp2"`` (NumPy's ``exp2`` in log2 units), ``"exp"`` (NumPy's ``exp`` in nats).
EXPS = ("auto", "fused", "exp2", "exp")


@dataclass(frozen=True)
class KernelConfig:
    """What the kernels are told to do instead of choosing.

    Attributes:
        exp: one of :data:`EXPS`.
        force_online: run the tiled forward's online softmax (running maximum) even where the scores are bounded
            and the fast path would apply.
        dense_limit: :func:`~attnlab.kernels.cached_attention` computes the whole ``[B, h, t, L]`` score tensor at
            once when it has at most this many entries, and runs the tiled kernel otherwise (0: always tiled).
        use_numba: False runs the NumPy passes as though numba were not installed (True: numba's passes when it is
            installed and loads).
        use_threadpoolctl: False makes :mod:`attnlab.kernels.threads` act as though threadpoolctl were not
            installed: one thread by default, BLAS left as it is, an "unknown" BLAS report.
        observe: None, or a callable that the tiled forward calls with ``"bounded"`` or ``"online"`` for each
            query block, saying which path it took (from the worker threads: it must be thread-safe, as
            ``list.append`` is). For tests and benchmarks that check which path runs; it changes nothing else.
    """

    exp: Literal["auto", "fused", "exp2", "exp"] = "auto"
    force_online: bool = False
    dense_limit: int = 1 << 22
    use_numba: bool = True
    use_threadpoolctl: bool = True
    observe: Callable[[str], Any] | None = None

    def __post_init__(self) -> None:
        check_choice("exp", self.exp, EXPS)
        check_int("dense_limit", self.dense_limit, minimum=0)
        for name in ("force_online", "use_numba", "use_threadpoolctl"):
            if not isinstance(getattr(self, name), bool):
                check_choice(name, getattr(self, name), (True, False))
        if self.observe is not None and not callable(self.observe):
            raise OptionError(f"observe: expected None or a callable, got {type(self.observe).__name__}")


_DEFAULT = KernelConfig()
_current: contextvars.ContextVar[KernelConfig] = contextvars.ContextVar("attnlab_kernel_config", default=_DEFAULT)


def current() -> KernelConfig:
    """The configuration in force on this thread (the defaults outside any :func:`override`)."""
    return _current.get()


@contextlib.contextmanager
def override(**changes: Any) -> Iterator[KernelConfig]:
    """Within the block, the kernels use :func:`current` with ``changes`` applied (fields of :class:`KernelConfig`;
    an unknown name or a bad value is an :class:`~attnlab.errors.OptionError`). Blocks nest; yields the config.

    >>> with override(exp="exp2") as cfg:
    ...     cfg.exp, current().force_online
    ('exp2', False)
    >>> current().exp
    'auto'
    """
    fields = {f.name for f in dataclasses.fields(KernelConfig)}
    for name in changes:
        check_choice("override", name, sorted(fields))
    cfg = dataclasses.replace(current(), **changes)
    token = _current.set(cfg)
    try:
        yield cfg
    finally:
        _current.reset(token)
