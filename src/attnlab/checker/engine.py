"""The engine: one runner for every check, outputs and gradients alike.

:func:`run_check` (``attnlab.check``), :func:`run_gradients` (``check(fn, backward=...)`` after the outputs, and
``check_backward``) share everything but the strategy: where the function runs (in-process, or one worker process
for the whole check: the gradient session reuses the output session's worker, so torch or JAX is imported once),
the framework detection and its retry, the session (:class:`~attnlab.checker.session.Session`) with its timeouts
(the first call of each shape has its own ``compile_timeout``), the import report and the
:class:`~attnlab.checker.report.Report`. The strategy (:class:`~attnlab.checker.outputs.Outputs` or
:class:`~attnlab.checker.gradients.Gradients`) says what is compared.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .adapters import DTYPES, Adapter
from .fixes import FIXES
from .gradient_oracle import (
    CORE_GRAD_PROBES,
    GRAD_CAPABILITIES,
    GRAD_PROBES,
    KINDS,
    LSE_UNITS,
    GradAdapter,
    GradTarget,
    describe_backward,
    grad_spec,
    load_callable,
    merge,
    spec_from_options,
)
from .gradients import ForwardSeen, Gradients
from .isolation import WorkerBackend, available
from .outputs import Outputs
from .report import CORE_PROBES, PROBES, Finding, ProbeResult, Report, Unsupported
from .runner import InProcessBackend, loaded_frameworks
from .session import Session
from .spec import COMPILE_TIMEOUT, PARENT_ONLY, Spec, UsageError, listed
from .target import TargetError, load_target, parse_target

__all__ = ["Run", "check_backward", "importable", "label_of", "run_check", "run_gradients"]

Progress = Callable[[str, int, int], None]


def label_of(fn: Any) -> str:
    """``module:qualname`` of ``fn`` (how a report names a callable)."""
    mod = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{mod}:{qual}" if mod else str(qual)


def importable(fn: Any) -> str:
    """``module:qualname`` of a function a worker process can import by name, or a UsageError saying why not."""
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


@dataclass
class Run:
    """One session's run: its backend (left open: the next session may reuse its worker) and the session (None
    when the target's module did not import); ``detected`` says how the framework was found."""

    backend: Any
    session: Session | None
    detected: str = ""


def run_session(
    backend: Any, spec: Spec, strategy: Outputs | Gradients, probes: tuple[str, ...], progress: Progress | None
) -> Session | None:
    """Run ``strategy``'s probes on ``backend`` (None when its module did not import)."""
    if backend.import_failure is not None:
        return None
    if not [d for d in DTYPES if d not in backend.structural]:
        why = "; ".join(f"{d}: {backend.structural[d]}" for d in DTYPES)
        raise UsageError(f"dtypes: no dtype left to try ({why}); nothing could be tested")
    allowance = spec.compile_timeout
    if allowance is None:
        allowance = COMPILE_TIMEOUT if getattr(backend.resolved, "compiles", False) else 0.0
    resolved = backend.resolved.spec  # as the adapter resolved it (in a worker: without the parent-only options)
    if resolved is not None:
        parent: dict[str, Any] = {name: getattr(spec, name) for name in PARENT_ONLY}
        resolved = replace(resolved, **parent)
    session = Session(
        backend,
        (resolved or spec) if isinstance(strategy, Outputs) else spec,
        strategy,
        timeout=spec.timeout,
        seed=spec.seed,
        probes=probes,
        progress=progress,
        compile_timeout=allowance,
    )
    session.run()
    return session


def failed_everything(session: Session) -> bool:
    """No dtype worked and the calls raised (not clean refusals): the framework may be the wrong guess."""
    return (
        not session.dtypes
        and not all(d in session.unsupported for d in DTYPES)
        and any(o.error is not None and not o.error.died for o in session.runner.outcomes)
    )


def run_detected(
    start: Callable[[Spec], Any],
    spec: Spec,
    strategy: Callable[[Any], Outputs | Gradients],
    probes: tuple[str, ...],
    progress: Progress | None,
    order: tuple[str, ...],
    describe: Callable[[Any], str],
) -> Run:
    """Run a session on ``start(spec)``'s backend; when the framework was detected and every call failed, again in
    the other array libraries of ``order`` that are loaded (NumPy always, without a device) until one works.
    ``describe(backend)`` words how the first backend's framework was detected."""
    backend = start(spec)
    first = Run(backend, run_session(backend, spec, strategy(backend), probes, progress))
    if first.session is not None:
        first.detected = describe(backend)
    if first.session is None or spec.framework != "auto" or not failed_everything(first.session):
        return first
    tried = [backend.framework]
    loaded = backend.loaded if backend.isolated else (*backend.loaded, *loaded_frameworks())
    others = [f for f in order if f != backend.framework and (f in loaded or (f == "numpy" and spec.device is None))]
    for other in others:
        try:
            b2 = start(replace(spec, framework=other))
            s2 = run_session(b2, replace(spec, framework=other), strategy(b2), probes, progress)
        except UsageError:  # that library cannot take these options (e.g. NumPy and a device)
            continue
        tried.append(other)
        if s2 is not None and not failed_everything(s2):
            backend.close()
            why = f"every call failed in {backend.framework}; in {other} the calls ran"
            return Run(b2, s2, f"{other}: detected {first.detected}, but {why}")
        b2.close()
    if len(tried) > 1:
        first.detected += f" (every call failed in {', '.join(tried)} as well)"
    return first


# ----------------------------------------------------------------------------------------------------------------
# check(): the outputs, then (backward=...) the gradients


def run_check(fn: Any, target: str | None, spec: Spec, progress: Progress | None = None) -> Report:
    """:func:`attnlab.check` once the options are a valid :class:`Spec`."""
    selected = PROBES if spec.probes is None else spec.probes
    if spec.probes is None and spec.claims is None:  # the mods probe has nothing to check: not listed
        selected = tuple(p for p in selected if p != "mods")
    isolated = (target is not None if spec.isolate is None else spec.isolate) and available()
    if target is not None:
        try:
            parse_target(target)
        except TargetError as err:
            raise UsageError(str(err)) from None
    t0 = time.perf_counter()
    if isolated:
        target = target or importable(fn)
    elif target is not None:
        fn = _loaded(target)
    label = spec.name or target or label_of(fn)

    def start(s: Spec) -> Any:
        if not isolated:
            return InProcessBackend(Adapter(fn, s))
        assert target is not None  # isolated implies a target (set above)
        return WorkerBackend(target, s, import_timeout=spec.import_timeout)

    if progress is not None:
        progress("importing the target" if isolated else "preparing", 0, len(selected) + 1)
    run = run_detected(start, spec, lambda b: Outputs(), selected, progress, ("torch", "jax", "numpy"), _detected)
    try:
        if run.session is None:
            return import_report(label, run.backend, spec, selected, time.perf_counter() - t0)
        report = outputs_report(run, label, spec, t0)
        hint = layout_hint(report, spec, start)
        if hint is not None:
            report = replace(report, notes=(*report.notes, hint))
        if spec.backward is None:
            return report
        if progress is not None:
            progress("the gradient battery (--backward)", len(selected) + 1, len(selected) + 2)
        reuse = run.backend if isolated else None
        return with_backward(report, run.session, target if isolated else fn, spec, reuse)
    finally:
        run.backend.close()


def _detected(backend: Any) -> str:
    r = backend.resolved
    return f"{backend.framework}: {r.detected}" if r.detected else backend.framework


def _loaded(target: str) -> Any:
    try:
        return load_target(target)
    except TargetError as err:
        raise UsageError(str(err)) from None


def outputs_report(run: Run, label: str, spec: Spec, started: float) -> Report:
    """The report of the output session of ``run``."""
    backend, session = run.backend, run.session
    assert session is not None  # the module imported
    r = backend.resolved
    return session.report(
        label,
        backend,
        started,
        run.detected,
        signature=r.describe(),
        spec=dict(spec.as_dict(), device=r.device or None, layout=getattr(r.spec, "layout", spec.layout)),
        mode=r.mode,
    )


#: The findings a function that takes ``[B, n, h, d]`` gets when it is called heads-first (``[B, h, n, d]``).
_LAYOUT_SYMPTOMS = frozenset({"reference-mismatch", "batch-leak"})


def layout_hint(report: Report, spec: Spec, start: Callable[[Spec], Any]) -> Finding | None:
    """A ``layout`` note when the layout was not declared, the function was called heads-first and failed as a
    ``[B, n, h, d]`` function does, and the reference probe called ``[B, n, h, d]`` finds nothing: the layout is
    the likely cause of the findings (one more reference run, only for such reports)."""
    if spec.layout != "auto" or report.spec.get("layout") != "bhnd" or not _LAYOUT_SYMPTOMS <= set(report.codes):
        return None
    s = replace(spec, layout="bnhd")
    try:
        backend = start(s)
    except UsageError:
        return None
    try:
        session = run_session(backend, s, Outputs(), ("reference",), None)
    except UsageError:
        return None
    finally:
        backend.close()
    if session is None or not session.dtypes or session.strategy.findings()[0]:
        return None
    return Finding(
        "layout",
        "the findings above are likely the layout: called with [B, n, h, d] inputs (layout bnhd) instead of "
        "[B, h, n, d], your function passes the reference probe",
        f"reference probe rerun with layout bnhd: {session.runner.calls} calls, no finding",
        "declare the layout, --layout bnhd (layout='bnhd'); the function itself needs no change",
        "reference",
        severity="note",
    )


def with_backward(report: Report, forward: Session, fn: Any, spec: Spec, reuse: Any) -> Report:
    """The output ``report`` extended by the gradient session: ``spec.backward`` is True (autograd through ``fn``)
    or a backward callable / target string (checked with ``fn`` as its forward when it takes the forward's lse).
    What the output session saw the forward do (its causal alignment, fully-masked-row policy and compute
    precision: :class:`~attnlab.checker.gradients.ForwardSeen`) holds for the gradients too; gradient
    findings in cases where the forward output is already wrong are explained by the output findings. ``reuse``:
    the output session's worker, which serves the gradient session too."""
    backward = spec.backward
    extra = tuple(u for u in spec.unsupported if u in GRAD_CAPABILITIES)  # declared for the gradient side
    if spec.framework == "auto" and report.framework in ("numpy", "torch", "jax"):
        spec = replace(spec, framework=report.framework)  # what the output session found the calls run in
    if backward is True:
        if report.framework == "numpy":
            raise UsageError(
                "backward=True: a NumPy function has no gradient to check; pass its hand-written backward as "
                "backward=bwd (or check_backward(bwd))"
            )
        checked = report.codes[0] if report.codes else True
        g = run_gradients(
            fn, spec, kind="autograd", name=spec.name or report.target, forward_checked=checked, reuse=reuse,
            seen=ForwardSeen(forward.align_seen, forward.row_policy_seen, forward.lower_seen), extra_unsupported=extra,
        )  # fmt: skip
    else:
        if not isinstance(backward, str) and not callable(backward):
            raise UsageError(f"backward: expected True or a backward callable, got {type(backward).__name__}")
        g = run_gradients(backward, spec, kind="backward", forward=fn, reuse=reuse, extra_unsupported=extra)
    return merge(report, g)


# ----------------------------------------------------------------------------------------------------------------
# the gradients


def run_gradients(
    fn: Any,
    spec: Spec,
    *,
    kind: str = "auto",
    forward: Any = None,
    probes: Any = None,
    name: str | None = None,
    seen: ForwardSeen | None = None,
    extra_unsupported: tuple[str, ...] = (),
    forward_checked: bool | str = False,
    reuse: Any = None,
) -> Report:
    """Run the gradient session on ``fn`` and return its :class:`~attnlab.checker.Report`.

    ``fn`` (and ``forward``) may be target strings ``"file.py:NAME"``: the function is then imported and called in
    a worker process (``reuse``: the output session's, when there is one), killed on a timeout; a callable runs in
    this process. ``seen``: what the output session of the same check saw the forward do (its causal alignment,
    fully-masked-row policy and compute precision: :class:`~attnlab.checker.gradients.ForwardSeen`);
    ``extra_unsupported``: gradient-only capabilities declared unsupported (``"dropout"``, ``"bias"``);
    ``forward_checked``: the output session ran on the same function (see
    :class:`~attnlab.checker.gradients.Gradients`).
    """
    selected = tuple(GRAD_PROBES if probes is None else listed(probes))
    for p in selected:
        if p not in GRAD_PROBES:
            raise UsageError(f"probes: unknown gradient probe {p!r}; expected some of {', '.join(GRAD_PROBES)}")
    if kind not in (*KINDS, "backward"):
        raise UsageError(f"kind: expected one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    t0 = time.perf_counter()
    spec = grad_spec(spec)
    isolated = isinstance(fn, str) and available() and (forward is None or isinstance(forward, str))
    if not isolated:
        fn, forward = load_callable(fn), (None if forward is None else load_callable(forward))
    lse_units = spec.lse_units
    shared = [reuse]

    def start(s: Spec) -> Any:
        if not isolated:
            return InProcessBackend(GradAdapter(fn, s, kind=kind, forward=forward, lse_units=lse_units,
                                                extra_unsupported=extra_unsupported))  # fmt: skip
        target = GradTarget(s, kind, forward, lse_units, extra_unsupported)
        worker, shared[0] = shared[0], None  # the output session's worker serves the first gradient session
        if worker is not None and worker.reconfigure(fn, target):
            return worker
        try:
            return WorkerBackend(fn, target, import_timeout=spec.import_timeout)
        except TargetError as err:
            raise UsageError(str(err)) from None

    def strategy(backend: Any) -> Gradients:
        k, _, f = backend.resolved.mode.removeprefix("backward ").partition("+") if backend.resolved else (kind, "", "")
        return Gradients(lse_units=lse_units, kind=k, with_forward=bool(f), seen=seen, forward_checked=forward_checked)

    order = ("numpy", "torch", "jax")
    run = run_detected(start, spec, strategy, selected, None, order, lambda b: b.resolved.detected)
    run.backend.close()
    label = name or (fn if isinstance(fn, str) else label_of(fn))
    report_spec = {**spec.as_dict(), "backward": kind, "lse_units": lse_units}
    if run.session is None:
        fail = import_report(label, run.backend, spec, (), time.perf_counter() - t0, CORE_GRAD_PROBES)
        return replace(fail, spec=report_spec, command="check --backward")
    st = run.session.strategy
    assert isinstance(st, Gradients)
    return run.session.report(
        label,
        run.backend,
        t0,
        run.detected,
        signature=describe_backward(st.kind, run.backend, lse_units, st.has_forward and st.kind != "autograd"),
        spec={**report_spec, "backward": st.kind},
        command="check --backward",
    )


def check_backward(bwd: Any, forward: Any = None, **options: Any) -> Report:
    """:func:`attnlab.checker.check_backward` (see there)."""
    lse_units = options.pop("lse_units", "nats")
    if lse_units not in LSE_UNITS:
        raise UsageError(f"lse_units: expected 'nats' or 'log2', got {lse_units!r}")
    kind, probes, name = options.pop("kind", "auto"), options.pop("probes", None), options.pop("name", None)
    if not isinstance(bwd, str) and not callable(bwd):
        raise UsageError(f"bwd: expected a callable backward or a target string, got {type(bwd).__name__}")
    if forward is not None and not isinstance(forward, str) and not callable(forward):
        raise UsageError(
            f"forward: expected None, a callable forward fwd(q, k, v, ...) -> (out, lse) or a target string, got "
            f"{type(forward).__name__} {forward!r}"
        )
    extra = tuple(u for u in listed(options.get("unsupported", ())) if u in GRAD_CAPABILITIES)
    spec = spec_from_options(lse_units=lse_units, **options)  # timeout and seed checked as check() does
    return run_gradients(
        bwd,
        spec,
        kind="backward" if kind == "auto" else kind,  # a backward: FlashAttention-2's signature, or the plain one
        forward=forward,
        probes=probes,
        name=name or (bwd if isinstance(bwd, str) else None),
        extra_unsupported=extra,
    )


# ----------------------------------------------------------------------------------------------------------------
# the report when the module did not import


def import_report(
    label: str,
    backend: Any,
    spec: Spec,
    selected: tuple[str, ...],
    seconds: float,
    core: tuple[str, ...] = CORE_PROBES,
) -> Report:
    """The report when the target's module did not import: a ``crash`` or ``timeout`` finding, nothing run."""
    fail = backend.import_failure
    finding = import_finding(label, fail, spec.import_timeout)
    notes = tuple(
        Finding(
            "printed",
            f"the module wrote {cap.total} bytes to {name} while it was imported",
            cap.text(600),
            "",
            "import",
            severity="note",
        )
        for name, cap in backend.output().items()
        if cap.total
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
        notes=notes,
        probes=probes,
        incomplete=tuple(Unsupported(p, detail) for p in core),
        seconds=seconds,
        spec=spec.as_dict(),
        isolation=backend.description,
    )


def import_finding(label: str, fail: Any, import_timeout: float) -> Finding:
    """The ``timeout`` or ``crash`` finding of a module that did not import."""
    if fail.timed_out:
        return Finding(
            "timeout",
            f"importing the module did not finish within {import_timeout:g} s (import_timeout)",
            f"import of {label}; the worker process was killed (with its threads and child processes)",
            FIXES["timeout"] + "; a module must not loop or wait when it is imported",
            "import",
        )
    e = fail.error
    first = (e.text.splitlines() or [e.type_name])[0][:300]
    if e.died:
        message = f"importing the module ended the process: {e.message.split(';')[0]}"
    elif e.type_name == "SystemExit":
        message = f"the module called sys.exit({e.exit_status!r}) while it was imported"
    else:
        message = f"importing the module raised {first}"
    tb = e.traceback.strip().splitlines()
    where = next((ln.strip() for ln in reversed(tb) if ln.strip().startswith("File ")), "")
    return Finding(
        "crash",
        message,
        f"import of {label}: {first}" + (f" ({where})" if where else ""),
        "make the module importable without side effects: no exit(), no work at import time; keep scripts "
        "under `if __name__ == '__main__':`",
        "import",
    )
