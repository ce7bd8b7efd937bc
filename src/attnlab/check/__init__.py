"""The checker: run any attention implementation through the articles' tests and name the bug.

:func:`check` calls a function many times on small, deliberate inputs (a reference grid, future-token and
padding perturbations, fully masked rows, huge logits, batch and head perturbations, repeated calls) and returns a
:class:`Report` whose findings carry stable codes (``scale-missing``, ``mask-inverted``, ``causal-leak``, ...),
the evidence and the fix. Nothing here imports torch, jax or rich until a function of theirs is checked or a report
is rendered.

>>> import numpy as np
>>> def attention(q, k, v, mask=None):
...     s = q @ np.swapaxes(k, -1, -2)  # forgot / sqrt(d_k)
...     if mask is not None:
...         s = np.where(mask, s, -np.inf)
...     e = np.exp(s - s.max(axis=-1, keepdims=True))
...     return (e / e.sum(axis=-1, keepdims=True)) @ v
>>> report = check(attention, probes=("reference",))
>>> report.codes
('scale-missing',)
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Callable, Iterable
from typing import Any

from .adapters import CAPABILITIES, DTYPES, Adapter, Spec, UsageError
from .probes import FIXES, PROBES, Battery
from .report import CODES, Finding, ProbeResult, Report, Unsupported

__all__ = [
    "CAPABILITIES",
    "CODES",
    "DTYPES",
    "FIXES",
    "PROBES",
    "Finding",
    "ProbeResult",
    "Report",
    "Spec",
    "Unsupported",
    "UsageError",
    "check",
]


def _name(fn: Any) -> str:
    mod = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{mod}:{qual}" if mod else str(qual)


def check(
    fn: Callable[..., Any],
    *,
    framework: str = "auto",
    signature: str = "auto",
    mask_convention: str = "allow",
    layout: str = "bhnd",
    returns: str = "auto",
    causal_only: bool = False,
    causal_align: str | None = None,
    causal_value: str = "bool",
    gqa: bool = False,
    dtypes: Iterable[str] = DTYPES,
    unsupported: Iterable[str] = (),
    mask_arg: str | None = None,
    causal_arg: str | None = None,
    scale_arg: str | None = None,
    timeout: float = 10.0,
    probes: Iterable[str] | None = None,
    seed: int = 0,
    name: str | None = None,
) -> Report:
    """Run ``fn`` through the probes and return a :class:`Report` (``report.ok`` when no bug was found).

    Args:
        fn: the attention function, ``fn(q, k, v, ...)`` over NumPy arrays, PyTorch tensors or JAX arrays.
        framework, signature, mask_convention, layout, returns, causal_only, causal_align, causal_value, gqa,
            dtypes, unsupported, mask_arg, causal_arg, scale_arg: what ``fn`` is and supports; see :class:`Spec`.
        timeout: seconds one call may take; after a timeout nothing more is called (the hung thread cannot be
            killed and keeps running until the process exits).
        probes: the probes to run (default all, see :data:`PROBES`); the preflight always runs.
        seed: seed of the random inputs (the report is reproducible).
        name: how the report names ``fn`` (default ``module:qualname``).

    Shapes: the checker passes ``q [B, h, n_q, d_k]``, ``k [B, h_kv, n_k, d_k]``, ``v [B, h_kv, n_k, d_v]``
    (``[B, n, h, d]`` with ``layout="bnhd"``; also 3-D ``[h, n, d]`` when rank is supported) and masks
    ``[B, h, n_q, n_k]`` in the declared convention; ``fn`` returns ``out`` shaped like ``q`` with ``d_v`` last, or
    ``(out, weights [B, h, n_q, n_k])``.

    Raises:
        UsageError: an option has an invalid value, or the framework's library is not installed.
    """
    if not callable(fn):
        raise UsageError(f"fn: expected a callable attention function, got {type(fn).__name__}")
    try:
        timeout = float(timeout)
    except (TypeError, ValueError):
        raise UsageError(f"timeout: expected a number of seconds, got {timeout!r}") from None
    if not timeout > 0:
        raise UsageError(f"timeout: expected a positive number of seconds, got {timeout!r}")
    selected = tuple(PROBES if probes is None else probes)
    for p in selected:
        if p not in PROBES:
            raise UsageError(f"probes: unknown probe {p!r}; expected some of {', '.join(PROBES)}")
    spec = Spec(
        framework=framework,
        signature=signature,
        mask_convention=mask_convention,
        layout=layout,
        returns=returns,
        causal_only=bool(causal_only),
        causal_align=causal_align,
        causal_value=causal_value,
        gqa=bool(gqa),
        dtypes=tuple(dtypes),
        unsupported=frozenset(unsupported),
        mask_arg=mask_arg,
        causal_arg=causal_arg,
        scale_arg=scale_arg,
    )
    adapter = Adapter(fn, spec)
    t0 = time.perf_counter()
    battery = Battery(adapter, timeout=timeout, seed=seed, probes=selected)
    battery.run()
    findings, explained = battery.findings_list()
    return Report(
        target=name or _name(fn),
        framework=adapter.framework,
        signature=adapter.resolved.describe(),
        findings=findings,
        notes=tuple(battery.notes),
        unsupported=battery.unsupported_list(),
        probes=tuple(battery.probe_results),
        explained=explained,
        calls=battery.runner.calls,
        seconds=time.perf_counter() - t0,
        spec=spec.as_dict(),
    )


class _CallableModule(types.ModuleType):
    """``attnlab.check`` is both this package and the function: ``attnlab.check(fn)`` runs :func:`check`."""

    __call__ = staticmethod(check)


sys.modules[__name__].__class__ = _CallableModule
