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
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .adapters import CAPABILITIES, DTYPES, Adapter
from .probes import FIXES, Battery
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


def _name(fn: Any) -> str:
    mod = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{mod}:{qual}" if mod else str(qual)


def _importable(fn: Any) -> str:
    """``module:qualname`` of a function a worker process can import by name, or a UsageError saying why not."""
    import importlib

    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    why = None
    if not qual and not isinstance(fn, type):
        why = f"it is an object ({type(fn).__name__}) that has no module:qualname name; assign it in a file"
    elif not mod or not qual or "<" in qual or mod == "__main__":
        why = "it is a lambda, a closure, or defined in __main__"
    else:
        try:
            obj: Any = importlib.import_module(mod)
            for part in qual.split("."):
                obj = getattr(obj, part)
            if obj is not fn:
                why = f"{mod}:{qual} names another object"
        except Exception as err:
            why = f"{mod}:{qual} cannot be imported ({type(err).__name__})"
    if why is not None:
        raise UsageError(
            f"isolate=True: a worker process imports the function by name, and {why}; pass a target string "
            "'path/to/file.py:func', or isolate=False"
        )
    return f"{mod}:{qual}"


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
    return _check(fn, target, spec, progress)


_OPTION_NAMES = tuple(name for name, _, _ in spec_options())
check.__signature__ = keyword_signature(  # type: ignore[attr-defined]  # typeshed's functions lack __signature__
    [inspect.Parameter("fn", inspect.Parameter.POSITIONAL_OR_KEYWORD)],
    Report,
    last=(inspect.Parameter("progress", inspect.Parameter.KEYWORD_ONLY, default=None),),
)
check.__doc__ = (check.__doc__ or "").replace("OPTIONS", args_doc(8))


def _check(fn: Any, target: str | None, spec: Spec, progress: Callable[[str, int, int], None] | None = None) -> Report:
    """:func:`check` once the options are a valid :class:`Spec`."""
    from .isolation import WorkerBackend, available
    from .runner import InProcessBackend
    from .target import TargetError, load_target, parse_target

    timeout, import_timeout, seed = spec.timeout, spec.import_timeout, spec.seed
    selected = PROBES if spec.probes is None else spec.probes
    name = spec.name
    isolated = (target is not None if spec.isolate is None else spec.isolate) and available()
    if target is not None:
        try:
            parse_target(target)
        except TargetError as err:
            raise UsageError(str(err)) from None
    t0 = time.perf_counter()
    if isolated:
        if target is None:
            target = _importable(fn)
        label = name or target
    else:
        if target is not None:
            try:
                fn = load_target(target)
            except TargetError as err:
                raise UsageError(str(err)) from None
        label = name or target or _name(fn)

    def backend_for(s: Spec) -> Any:
        if not isolated:
            return InProcessBackend(Adapter(fn, s))
        assert target is not None  # isolated implies a target (set above)
        try:
            return WorkerBackend(target, s, import_timeout=import_timeout)
        except TargetError as err:  # pragma: no cover - parse_target ran first
            raise UsageError(str(err)) from None

    def run(s: Spec, probes: tuple[str, ...] = selected) -> tuple[Any, Battery | None]:
        backend = backend_for(s)
        if isolated and backend.import_failure is not None:
            backend.close()
            return backend, None
        try:
            left = [d for d in DTYPES if d not in backend.structural]
            if not left:
                why = "; ".join(f"{d}: {backend.structural[d]}" for d in DTYPES)
                raise UsageError(f"dtypes: no dtype left to try ({why}); nothing could be tested")
            battery = Battery(
                backend, backend.resolved.spec or s, timeout=timeout, seed=seed, probes=probes, progress=progress
            )
            battery.run()
        finally:
            backend.close()
        return backend, battery

    if progress is not None:
        progress("importing the target" if isolated else "preparing", 0, len(selected) + 1)
    backend, battery = run(spec)
    if battery is None:
        return _import_report(label, backend, spec, selected, time.perf_counter() - t0, import_timeout)
    detected = f"{backend.framework}: {backend.resolved.detected}" if backend.resolved.detected else backend.framework
    if spec.framework == "auto" and _failed_everything(battery):
        tried = [backend.framework]
        for other in _other_frameworks(backend.framework, backend.loaded, spec.device):
            try:
                b2, bat2 = run(replace(spec, framework=other))
            except UsageError:  # that library cannot take these options (e.g. NumPy and a device)
                continue
            tried.append(other)
            if bat2 is not None and not _failed_everything(bat2):
                detected = (
                    f"{other}: detected {detected}, but every call failed in {backend.framework}; in {other} the "
                    "calls ran"
                )
                backend, battery = b2, bat2
                break
        else:
            detected += f" (every call failed in {', '.join(tried)} as well)" if len(tried) > 1 else ""
    r = backend.resolved
    report = battery.report(
        label,
        backend,
        t0,
        detected,
        signature=r.describe(),
        spec=dict(spec.as_dict(), device=r.device or None, layout=getattr(r.spec, "layout", spec.layout)),
        mode=r.mode,
    )
    hint = _layout_hint(report, spec, run)
    if hint is not None:
        report = replace(report, notes=(*report.notes, hint))
    backward = spec.backward  # the gradient battery after the forward's (attnlab.checker.gradient_oracle)
    if backward is not None:
        from .gradient_oracle import with_backward

        if progress is not None:
            progress("the gradient battery (--backward)", len(selected) + 1, len(selected) + 2)
        return with_backward(
            report,
            fn,
            backward,
            spec,
            lse_units=spec.lse_units,
            timeout=timeout,
            seed=seed,
            name=name or label,
            import_timeout=import_timeout,
        )
    return report


#: The findings a function that takes ``[B, n, h, d]`` gets when it is called heads-first (``[B, h, n, d]``).
_LAYOUT_SYMPTOMS = frozenset({"reference-mismatch", "batch-leak"})


def _layout_hint(report: Report, spec: Spec, run: Callable[..., tuple[Any, Any]]) -> Finding | None:
    """A ``layout`` note when the layout was not declared, the function was called heads-first and failed as a
    ``[B, n, h, d]`` function does, and the reference probe called ``[B, n, h, d]`` finds nothing: the layout is
    the likely cause of the findings (one more reference run, only for such reports)."""
    if spec.layout != "auto" or report.spec.get("layout") != "bhnd" or not _LAYOUT_SYMPTOMS <= set(report.codes):
        return None
    try:
        _, battery = run(replace(spec, layout="bnhd"), ("reference",))
    except UsageError:
        return None
    if battery is None or not battery.dtypes:
        return None
    findings, _ = battery.findings_list()
    if findings:
        return None
    return Finding(
        "layout",
        "the findings above are likely the layout: called with [B, n, h, d] inputs (layout bnhd) instead of "
        "[B, h, n, d], your function passes the reference probe",
        f"reference probe rerun with layout bnhd: {battery.runner.calls} calls, no finding",
        "declare the layout, --layout bnhd (layout='bnhd'); the function itself needs no change",
        "reference",
        severity="note",
    )


def check_backward(bwd: Callable[..., Any] | str, forward: Any = None, **options: Any) -> Report:
    """Check a hand-written attention backward alone (see :func:`attnlab.checker.gradient_oracle.check_backward`)."""
    from .gradient_oracle import check_backward as _check_backward

    return _check_backward(bwd, forward, **options)


def _failed_everything(battery: Battery) -> bool:
    """No dtype worked and the calls raised (not clean refusals): the framework may be the wrong guess."""
    return (
        not battery.dtypes
        and not all(d in battery.unsupported for d in DTYPES)
        and any(o.error is not None and not o.error.died for o in battery.runner.outcomes)
    )


def _other_frameworks(framework: str, loaded: tuple[str, ...], device: str | None = None) -> list[str]:
    """The other array libraries to try: those loaded where the function was imported (torch before JAX), then
    NumPy (not with a device: NumPy has none)."""
    return [
        f for f in ("torch", "jax", "numpy") if f != framework and (f in loaded or (f == "numpy" and device is None))
    ]


def _import_report(
    label: str, backend: Any, spec: Spec, selected: tuple[str, ...], seconds: float, import_timeout: float
) -> Report:
    """The report when the target's module did not import: a ``crash`` or ``timeout`` finding, nothing run."""
    fail = backend.import_failure
    e = fail.error
    if fail.timed_out:
        finding = Finding(
            "timeout",
            f"importing the module did not finish within {import_timeout:g} s (import_timeout)",
            f"import of {label}; the worker process was killed (with its threads and child processes)",
            FIXES["timeout"] + "; a module must not loop or wait when it is imported",
            "import",
        )
    else:
        if e.died:
            message = f"importing the module ended the process: {e.message.split(';')[0]}"
        elif e.type_name == "SystemExit":
            message = f"the module called sys.exit({e.exit_status!r}) while it was imported"
        else:
            message = f"importing the module raised {e.type_name}"
        first = (e.text.splitlines() or [e.type_name])[0][:300]
        tb = e.traceback.strip().splitlines()
        where = next((ln.strip() for ln in reversed(tb) if ln.strip().startswith("File ")), "")
        finding = Finding(
            "crash",
            message,
            f"import of {label}: {first}" + (f" ({where})" if where else ""),
            "make the module importable without side effects: no exit(), no work at import time; keep scripts "
            "under `if __name__ == '__main__':`",
            "import",
        )
    notes = []
    for name, cap in backend.output().items():
        if cap.total:
            notes.append(
                Finding(
                    "printed",
                    f"the module wrote {cap.total} bytes to {name} while it was imported",
                    cap.text(600),
                    "",
                    "import",
                    severity="note",
                )
            )
    detail = "not run: the module did not import"
    probes = (
        ProbeResult("import", "failed", 0, fail.seconds, "", (finding.code,)),
        *(ProbeResult(p, "not run", detail=detail) for p in selected),
    )
    return Report(
        target=label,
        framework=spec.framework,
        signature="(not imported)",
        findings=(finding,),
        notes=tuple(notes),
        probes=probes,
        incomplete=tuple(Unsupported(p, detail) for p in CORE_PROBES),
        seconds=seconds,
        spec=spec.as_dict(),
        isolation=backend.description,
    )
