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

import difflib
import inspect
from collections.abc import Callable, Iterable
from typing import Any

from .adapters import CAPABILITIES, DTYPES
from .fixes import FIXES
from .report import CODES, CORE_PROBES, PROBES, ExitStatus, Finding, ProbeResult, Report, Unsupported
from .spec import Spec, UsageError, args_doc, keyword_signature
from .spec import options as spec_options

__all__ = [
    "CAPABILITIES",
    "CODES",
    "CORE_PROBES",
    "DTYPES",
    "FIXES",
    "PROBES",
    "ExitStatus",
    "Finding",
    "ProbeResult",
    "Report",
    "Spec",
    "Unsupported",
    "UsageError",
    "check",
    "check_backward",
]

#: Default seconds the worker may take to import the target module (torch and JAX imports take seconds).
IMPORT_TIMEOUT = Spec.import_timeout


def check(
    fn: Callable[..., Any] | str, *, progress: Callable[[str, int, int], None] | None = None, **options: Any
) -> Report:
    """Run ``fn`` through the probes and return a :class:`Report` (``report.ok`` when the verdict is clean).

    The keyword options are :class:`Spec`'s fields (the signature and the list below are generated from them).

    Args:
        fn: the attention function, ``fn(q, k, v, ...)`` over NumPy arrays, PyTorch tensors or JAX arrays (a
            function, lambda, ``functools.partial``, bound method, ``jax.jit`` function, instance with ``__call__``,
            class instantiable without arguments, or ``torch.nn.Module``; layers taking hidden states are checked
            in module mode, see :mod:`attnlab.checker.modules`); or a target string ``"path/to/file.py:NAME"`` /
            ``"package.module:NAME"``, imported in a worker process.
        OPTIONS
        progress: called as ``progress(step, done, total)`` before each step of the run (importing the target,
            each probe, the gradient battery); ``attnlab check`` draws its progress display from it.

    Shapes: the checker passes ``q [B, h, n_q, d_k]``, ``k [B, h_kv, n_k, d_k]``, ``v [B, h_kv, n_k, d_v]``
    (``[B, n, h, d]`` with ``layout="bnhd"``; also 3-D ``[h, n, d]`` when rank is supported) and masks
    ``[B, h, n_q, n_k]`` in the declared convention; ``fn`` returns ``out`` shaped like ``q`` with ``d_v`` last, or
    ``(out, weights [B, h, n_q, n_k])``. With ``device=`` every array passed (masks, lengths, ``cu_seqlens``
    too) is created on that device; outputs are copied back to the CPU and compared with the float64 NumPy golden.

    Raises:
        UsageError: an option has an invalid value, the framework's library is not installed, the device does not
            exist, the target does not exist or is not callable, or the options leave no dtype to try.
        TypeError: an unknown keyword.
    """
    unknown = [k for k in options if k not in _OPTION_NAMES]
    if unknown:
        close = difflib.get_close_matches(unknown[0], _OPTION_NAMES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; the options are {', '.join(_OPTION_NAMES)}"
        raise TypeError(f"check() got an unexpected keyword argument {unknown[0]!r}{hint}")
    target = fn if isinstance(fn, str) else None
    if target is None and not callable(fn):
        raise UsageError(f"fn: expected a callable attention function, got {type(fn).__name__}")
    spec = Spec(**options)
    from .engine import run_check

    return run_check(fn, target, spec, progress)


_OPTION_NAMES = tuple(name for name, _, _ in spec_options())
check.__signature__ = keyword_signature(  # type: ignore[attr-defined]  # typeshed's functions lack __signature__
    [inspect.Parameter("fn", inspect.Parameter.POSITIONAL_OR_KEYWORD)],
    Report,
    last=(inspect.Parameter("progress", inspect.Parameter.KEYWORD_ONLY, default=None),),
)
check.__doc__ = (check.__doc__ or "").replace("OPTIONS", args_doc(8))


def check_backward(
    bwd: Callable[..., Any] | str,
    forward: Callable[..., Any] | str | None = None,
    *,
    lse_units: str = "nats",
    kind: str = "auto",
    timeout: float = 10.0,
    seed: int = 0,
    probes: Iterable[str] | None = None,
    name: str | None = None,
    **options: Any,
) -> Report:
    """Check a hand-written attention backward alone and return a :class:`~attnlab.checker.Report`.

    Args:
        bwd: ``bwd(q, k, v, d_out, mask=None, scale=None) -> (dq, dk, dv)`` (plain) or FlashAttention-2's
            ``bwd(q, k, v, out, lse, d_out, ...) -> (dq, dk, dv)`` (flash), detected from the parameter names
            (``kind=`` to say which); NumPy, PyTorch or JAX; or a target string ``"file.py:NAME"`` (imported in
            this process). Optional keywords it may take: ``mask=``, ``scale=``, ``causal=``, ``dropout_mask=``
            with ``dropout_p=``, ``bias=`` (then it returns ``d_bias`` fourth).
        forward: a flash backward's forward ``fwd(q, k, v, ...) -> (out, lse)``; without it the golden ``out``
            and ``lse`` ``[B, h, n_q]`` are passed in.
        lse_units: ``"nats"`` or ``"log2"``: the units of the lse the backward takes.
        kind: ``"auto"``, ``"plain"``, ``"flash"`` or ``"autograd"`` (a forward, differentiated by its library).
        timeout, seed, probes, name: as :func:`attnlab.check` (``probes`` from
            :data:`~attnlab.checker.gradient_oracle.GRAD_PROBES`).
        options: :func:`attnlab.check`'s options describing the function (layout, gqa, dtypes, mask_convention,
            causal_align, masked_rows, unsupported, ...).

    Raises:
        UsageError: an option has an invalid value, or the function cannot be called at all.
    """
    from .engine import check_backward as run

    return run(bwd, forward, lse_units=lse_units, kind=kind, timeout=timeout, seed=seed, probes=probes, name=name,
               **options)  # fmt: skip
