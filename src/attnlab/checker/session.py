"""The session: one run of the probes on one function, whatever is compared.

A :class:`Session` owns everything a check shares, outputs and gradients alike: the calls (through a
:class:`~attnlab.checker.runner.Runner` and its backend, in-process or a worker process), the random cases, the
capabilities the preflight found, the observations (every bug seen, tied to its case), the run loop over the
registered probes and the :class:`~attnlab.checker.report.Report`. *What is compared* is its ``strategy``:
:class:`~attnlab.checker.outputs.Outputs` (the output, or the output and its weights) or
:class:`~attnlab.checker.gradients.Gradients` (dq, dk, dv, d_bias). A strategy prepares each case (a gradient case
gets its ``d_out``), builds the request, checks what every call returns, computes the expected value, compares,
and decides which findings explain which; the probes (:mod:`attnlab.checker.probes`) are functions of the session.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .. import masks as _masks
from .adapters import CAPABILITIES, round_to
from .cases import DTYPE_NAMES, Geom, random_mask
from .interfaces import drawn_form
from .minimal import Minimal, shrink_findings
from .preflight import preflight, raised
from .registry import ProbeAbort, ProbeSkip
from .report import Finding, ProbeResult, Report, Unsupported
from .runner import Case, Outcome, Runner
from .tolerance import expand_kv

if TYPE_CHECKING:
    from .gradients import Gradients
    from .outputs import Outputs

__all__ = ["Observation", "Session"]


@dataclass(frozen=True)
class Observation:
    """One bug seen: the finding and the case it was seen in (a grid case's label and dtype, or an experiment)."""

    finding: Finding
    case: str


class Session:
    """One run of the probes on one function, called through ``backend``; ``strategy`` says what is compared.

    Where a finding is recorded (:meth:`bug`), ``self.last`` is the :class:`~attnlab.checker.runner.Outcome` of
    the call it is about (its ``case`` is the failing case, ``call`` how the function was called) and
    ``self.strategy.expected(case)`` the reference for it.
    """

    def __init__(
        self,
        backend: Any,
        spec: Any,
        strategy: Outputs | Gradients,
        *,
        timeout: float,
        seed: int,
        probes: tuple[str, ...],
        progress: Callable[[str, int, int], None] | None = None,
        compile_timeout: float = 0.0,
    ):
        self.backend = backend
        self.progress = progress  # progress(step, done, total) before each probe (attnlab check's display)
        self.spec = spec
        self.rng = np.random.default_rng(seed)
        self.selected = probes
        self.findings: dict[str, Finding] = {}
        self.obs: list[Observation] = []
        self.case_key: str | None = None
        self.probe_codes: list[str] = []
        self.crashed: dict[str, str] = {}
        self.incomplete: list[Unsupported] = []
        self.notes: list[Finding] = []
        self.unsupported: dict[str, str] = {}
        self.caps: set[str] = set()
        self.primary = "float64"
        self.dtypes: list[str] = []
        self.probe_results: list[ProbeResult] = []
        self.current = "preflight"
        self.grid: list[Outcome] = []
        self.align: str | None = spec.causal_align
        self.align_seen: str | None = None
        #: what the function did with a fully masked row (the masked-rows probe): "raise", "nan", "zeros",
        #: "uniform" or "other"; the gradient session of the same check holds its backward to it
        self.row_policy_seen: str | None = None
        #: cases whose fully masked row attended to every key (as a finite fill makes it): a ``finite-fill``
        #: found elsewhere explains their ``masked-row-policy``
        self.unmasked_rows: set[str] = set()
        self.returns_weights = False
        self.base_ok: dict[str, bool] = {}
        self.gqa_map = getattr(spec, "gqa_mapping", "interleave")
        self.mask_form = drawn_form(getattr(spec, "mask_form", "full"))  # the form of the masks drawn
        self.compute = getattr(spec, "compute_dtype", "auto")
        self.lower_seen: str | None = None
        self.last: Outcome | None = None
        self.examined: tuple[str | None, Outcome] | None = None  # the outcome compared since the last call
        self.failing: dict[str, list[Outcome]] = {}  # the calls each code's first finding may be about
        self.minimal: dict[str, Minimal] = {}  # each reported finding's smallest case (shrink_findings)
        r = backend.resolved
        self.causal_mode: str | None = (
            "only"
            if spec.causal_only
            else "flag"
            if r.causal_arg is not None
            else "mask"
            if r.mask_arg is not None
            else None
        )
        self.strategy = strategy
        strategy.bind(self)
        self.runner = Runner(backend, timeout=timeout, request=strategy.request, compile_timeout=compile_timeout)

    # ------------------------------------------------------------------------------------------------ findings
    def bug(self, code: str, message: str, evidence: str, *, case: str | None = None, calls: bool = True) -> None:
        """Record that ``code`` was seen in ``case`` (default: the case being worked on); ``calls=False``: a finding
        about something declared (a mod), not about a call, so no call of the function is shrunk for it."""
        f = Finding(code, message, evidence, self.strategy.fixes[code], self.current)
        self.obs.append(Observation(f, case or self.case_key or self.current))
        self.findings.setdefault(code, f)
        if calls and code not in self.failing:  # the calls it may be about: the one compared, then the latest ones
            seen = [self.examined[1]] if self.examined is not None and self.examined[0] == self.case_key else []
            self.failing[code] = seen + [o for o in self.runner.outcomes[-4:][::-1] if all(o is not x for x in seen)]
        if code not in self.probe_codes:
            self.probe_codes.append(code)

    def note(self, code: str, message: str, evidence: str, fix: str = "") -> None:
        """Record a note (a documented behaviour, never a bug) once per code and message."""
        if not any(n.code == code and n.message == message for n in self.notes):
            self.notes.append(Finding(code, message, evidence, fix, self.current, severity="note"))

    def crash(self, out: Outcome, message: str | None = None) -> None:
        """A ``crash`` finding for an outcome that raised (or ended the worker), naming the call and the error."""
        e = out.error
        if e is None:
            return
        if message is None:
            if e.died:
                message = f"your function ended the process it ran in: {e.message.split(';')[0]}"
            else:
                message = f"your function {raised(e)} on an input it otherwise supports"
                if re.search(r"converted to type .*without overflow", e.message):
                    message += " (a fill value this dtype cannot hold, such as -1e9 in float16: use finfo(dtype).min)"
        first = (e.text.splitlines() or [e.type_name])[0][:300]
        self.examined = (self.case_key, out)  # the failing case is this call's
        self.bug("crash", message, f"case {out.case.label}: {out.call}: {first}")

    # ------------------------------------------------------------------------------------------------ cases
    def make(
        self,
        g: Geom,
        dtype: str,
        *,
        label: str,
        mask: bool | np.ndarray = False,
        causal: bool = False,
        scale: float | None = None,
        std: float = 1.0,
        align: str | None = None,
    ) -> Case:
        """A random case of geometry ``g`` in ``dtype`` (values rounded to it, kept as float64); ``align``: the
        causal alignment when n_q != n_k (default: the declared one, else bottom-right)."""
        g = self.fit(g)
        rng = self.rng
        h_kv = g.h_kv or g.h
        q = rng.normal(0, std, (*g.lead(g.h), g.n_q, g.d_k))
        k = rng.normal(0, std, (*g.lead(h_kv), g.n_k, g.d_k))
        v = rng.normal(0, 1, (*g.lead(h_kv), g.n_k, g.d_v))
        q, k, v = (round_to(x, dtype).astype(np.float64) for x in (q, k, v))
        m = None
        if isinstance(mask, np.ndarray):
            m = np.broadcast_to(mask, (*g.lead(g.h), g.n_q, g.n_k)).copy()
        elif mask:
            m = random_mask(self.rng, g, self.mask_form if g.b is not None else "full")
        causal = causal or self.spec.causal_only or (getattr(self.spec, "causal_when_no_mask", False) and m is None)
        if causal and m is not None and self.mask_form in ("kv_cache", "varlen") and g.b is not None:
            # a decode kernel / packed sequences: each sequence's queries are its last positions (bottom-right per
            # sequence)
            i, j = np.arange(g.n_q)[:, None], np.arange(g.n_k)[None, :]
            if self.mask_form == "varlen":
                lq, lk = m[:, 0].any(axis=-1).sum(axis=-1), m[:, 0].any(axis=-2).sum(axis=-1)
                per_seq = (j <= (lk - lq)[:, None, None] + i)[:, None]
            else:
                lengths = m[:, 0, -1, :].sum(axis=-1)
                per_seq = j <= (lengths[:, None, None] - g.n_q + i)[:, None]  # [B, 1, n_q, n_k]
            return Case(q, k, v, dtype=dtype, mask=m & per_seq, causal=None, scale=scale, label=label, flag=True)
        given = None
        if causal:
            given = "top_left" if g.n_q == g.n_k else (align or self.align or "bottom_right")
        return Case(q, k, v, dtype=dtype, mask=m, causal=given, scale=scale, label=label)

    def fit(self, g: Geom) -> Geom:
        """``g`` within what the function does not support: declared (``unsupported=``), structural (module mode's
        self-attention layer, no ``gqa=True``) or refused on every preflight attempt: n_q = n_k without ``cross``,
        d_v = d_k without ``dv``, as many K/V heads as query heads without ``gqa``. A probe's case, of the outputs
        or the gradients, never asks for such a capability (a clean refusal there is not a crash). A refused
        ``cross`` is not squared away: a backward with a transposed P refuses n_q != n_k by a shape error, and
        its probes' rectangular cases are where that shows as the same crash, not as extra codes."""
        refused = {c for c in self.unsupported if c in ("dv", "gqa")}  # n_q != n_k refused: see below
        declared = {*self.spec.unsupported, *self.backend.structural, *refused}
        if "cross" in declared and g.n_q != g.n_k:
            g = replace(g, n_q=max(g.n_q, g.n_k), n_k=max(g.n_q, g.n_k))
        if "dv" in declared and g.d_v != g.d_k:
            g = replace(g, d_v=g.d_k)
        if "gqa" in declared and g.h_kv not in (None, g.h):
            g = replace(g, h_kv=None)
        return g

    @staticmethod
    def key(case: Case) -> str:
        """The case an observation belongs to (grid cases are keyed by label and dtype)."""
        return f"{case.label} ({case.dtype})"

    def perturbed(self, case: Case, sel: Any, *, what: str = "qkv", value: float | None = None) -> Case:
        """``case`` with new values at index ``sel`` of q (queries), k and v (keys)."""
        arrays = {"q": case.q.copy(), "k": case.k.copy(), "v": case.v.copy()}
        for name, arr in arrays.items():
            if name not in what:
                continue
            idx = sel[name] if isinstance(sel, dict) else sel
            shape = arr[idx].shape
            new = self.rng.normal(0, 3, shape) if value is None else np.full(shape, value)
            arr[idx] = round_to(new, case.dtype).astype(np.float64)
        return replace(case, q=arrays["q"], k=arrays["k"], v=arrays["v"])

    def allowed(self, case: Case, *, causal: str | None = "same") -> Any:
        """The full boolean mask of ``case`` ``[..., h, n_q, n_k]`` (user mask AND causal). Typed ``Any``: NumPy's
        stubs type a reduction such as ``.any(axis=-1)`` as a scalar or an array, and the probes index it."""
        n_q, n_k = case.q.shape[-2], case.k.shape[-2]
        full = (*case.q.shape[:-2], n_q, n_k)
        a = np.ones(full, bool) if case.mask is None else np.broadcast_to(case.mask, full)
        c = case.causal if causal == "same" else causal
        if c is not None:
            a = a & _masks.causal(n_q, n_k, align=cast(_masks.Align, c))
        return a

    def expand(self, q: np.ndarray, x: np.ndarray, mapping: str | None = None) -> np.ndarray:
        """K/V expanded to q's heads with the declared GQA mapping (or ``mapping``)."""
        return expand_kv(q, x, mapping or self.gqa_map)

    def causal_in_mask(self, case: Case) -> bool:
        """Whether the causal part of ``case`` reaches the function inside its mask argument."""
        if self.mask_form != "full" and self.causal_mode == "flag":
            return False  # a [B, n_k] / per-batch mask cannot hold the causal part: flag and mask go separately
        return case.causal is not None and (
            self.causal_mode == "mask" or (self.causal_mode == "flag" and case.mask is not None)
        )

    def work_dtype(self, dtype: str) -> str:
        """The precision whose tolerance rule applies to a case in ``dtype``: the input dtype, or the declared
        (or seen) lower compute precision."""
        from .cases import PRECISION

        c = self.compute
        if c == "auto":
            c = self.lower_seen or "input"
        if c == "input" or PRECISION[c] >= PRECISION[dtype]:
            return dtype
        return c

    # ------------------------------------------------------------------------------------------------ calls
    def call(self, case: Case, *, passed_mask: np.ndarray | None = None) -> Outcome:
        """Call the function on ``case`` (as the strategy prepares it) and check what every call must satisfy.
        ``passed_mask``: the mask as passed, in a shape that broadcasts to ``case.mask`` (the case keeps the
        full-size mask the reference and the diagnosis read)."""
        case = self.strategy.prepare(case)
        passed, flag = self.as_passed(case, passed_mask=passed_mask)
        out = self.runner.call(passed, causal_flag=flag, gqa=case.gqa)
        out.case = case
        self.last, self.examined = out, None  # a finding after this call is about it, until one is compared
        self.every_call(case, out)
        self.strategy.after_call(case, out)
        return out

    def as_passed(self, case: Case, *, passed_mask: np.ndarray | None = None) -> tuple[Case, bool | str]:
        """``case`` as the function is given it (the causal part in the mask when it goes there, ``passed_mask``
        instead of the full-size mask when given), and the value of its causal argument (False: none)."""
        passed = replace(case, mask=self.allowed(case), causal=None, flag=False) if self.causal_in_mask(case) else case
        if passed_mask is not None:
            passed = replace(passed, mask=passed_mask)
        flag: bool | str = passed.causal is not None or case.flag
        if flag and self.spec.causal_value == "align":
            flag = passed.causal or self.strategy.default_align
        return passed, flag

    def every_call(self, case: Case, out: Outcome) -> None:
        """What every call must satisfy, whatever is compared: no timeout, no dead worker, no write into its
        inputs, a readable result of the right kind. Raises :class:`ProbeAbort` when nothing more can be called."""
        if out.skipped:
            raise ProbeAbort
        if out.timed_out:
            after = (
                "the worker process was killed (with its threads and child processes)"
                if self.backend.isolated
                else "a Python thread cannot be killed; it may still be running"
            )
            limit = f"{self.runner.timeout:g} s" + (
                f" (a first call of its shape: {self.runner.timeout + self.runner.compile_timeout:g} s)"
                if out.first and self.runner.compile_timeout
                else ""
            )
            self.bug(
                "timeout",
                f"the function did not return within {limit}",
                f"case {case.label}: {out.call}; no further calls were made ({after})",
            )
            raise ProbeAbort
        if out.error is not None and out.error.died:
            self.crash(out)
            if self.runner.stopped is not None:
                raise ProbeAbort
        if out.mutated:
            self.bug(
                "mutates-input",
                f"your function writes into its input{'s' if len(out.mutated) > 1 else ''} {', '.join(out.mutated)}",
                f"case {case.label}: {case.shapes()}; {', '.join(out.mutated)} differ after the call",
            )
        if out.returned.problem is not None:
            self.bug("crash", f"your function {out.returned.problem}", f"case {case.label}: {out.call}")
        if out.ok and out.returned.wrong_type is not None:
            self.bug(
                "output-type",
                f"your function returns the wrong kind of array: {out.returned.wrong_type}",
                f"case {case.label}: {out.call}",
            )

    @property
    def grads(self) -> Gradients:
        """The strategy as the gradient probes use it (a gradient session's)."""
        return cast("Gradients", self.strategy)

    def expected(self, case: Case, **kw: Any) -> Any:
        """The strategy's reference for ``case`` and its tolerance."""
        return self.strategy.expected(case, **kw)

    def compare(self, out: Outcome) -> bool:
        """Compare one outcome with the strategy's reference (a mismatch is diagnosed); True when it matches."""
        return self.strategy.compare(out)

    # ------------------------------------------------------------------------------------------------ run
    def run(self) -> None:
        """Run the preflight, then every selected probe in order, recording results, findings and what could not
        be tested."""
        t0 = time.perf_counter()
        aborted = False
        self.current = self.strategy.preflight_name
        self.probe_codes = []
        try:
            preflight(self)
        except ProbeAbort:
            aborted = True
            if not self.dtypes and not self.findings and not all(d in self.unsupported for d in DTYPE_NAMES):
                errs = [o for o in self.runner.outcomes if o.error is not None]
                text = errs[0].error_text.splitlines()[0][:300] if errs else "no call succeeded"
                self.bug(
                    "crash",
                    "your function fails on every call, even the simplest one",
                    f"{len(self.runner.outcomes)} calls, e.g. case base: {text}",
                )
        status = "failed" if self.probe_codes else "passed"
        self.probe_results.append(
            ProbeResult(
                self.current, status, self.runner.calls, time.perf_counter() - t0, codes=tuple(self.probe_codes)
            )
        )
        steps = [n for n in self.strategy.probe_functions if n in self.selected]
        for i, name in enumerate(steps):
            if self.progress is not None:
                self.progress(f"probe {name}", 1 + i, len(steps) + 1)
            if aborted:
                self.probe_results.append(ProbeResult(name, "not run", detail=self.stop_reason()))
                continue
            aborted = self.run_probe(name)
        self.case_key = None
        shrink_findings(self)
        note_printed(self)
        self.incomplete.extend(self.strategy.completeness())

    def run_probe(self, name: str) -> bool:
        """Run the probe ``name`` and record its result; True when it aborted (nothing more can be called)."""
        self.current = name
        self.case_key = None
        self.probe_codes = []
        calls0, t0 = self.runner.calls, time.perf_counter()
        status, detail, aborted = "passed", "", False
        try:
            self.strategy.probe_functions[name](self)
        except ProbeSkip as s:
            status, detail = "skipped", str(s)
        except ProbeAbort:
            aborted = True
            status, detail = "failed", self.stop_reason()
        if self.probe_codes:
            status = "failed"
        elif status == "failed":  # stopped before it saw anything: it did not run to the end
            status = "not run"
        spent = time.perf_counter() - t0
        codes = tuple(self.probe_codes)
        self.probe_results.append(ProbeResult(name, status, self.runner.calls - calls0, spent, detail, codes))
        return aborted

    def stop_reason(self) -> str:
        """Why the remaining probes are not run."""
        if self.runner.stopped is not None:
            return f"not run: {self.runner.stopped}"
        if not self.dtypes:
            return "not run: no dtype could be tested"
        return "not run"

    # ------------------------------------------------------------------------------------------------ results
    def unsupported_list(self) -> tuple[Unsupported, ...]:
        """The capabilities the function lacks (declared, structural, or crashed on), each with its reason."""
        out = [Unsupported(c, r) for c, r in self.unsupported.items() if c in CAPABILITIES]
        out += [Unsupported(c, r) for c, r in self.crashed.items() if c in CAPABILITIES and c not in self.unsupported]
        return tuple(out) + self.strategy.unsupported_extra()

    def report(self, target: str, backend: Any, started: float, detected: str, **fields: Any) -> Report:
        """The :class:`~attnlab.checker.report.Report` of this session's run of ``target`` on ``backend`` (its
        framework, isolation and import time), begun at ``started`` (``time.perf_counter()``); ``fields`` are the
        report's fields that depend on the run (``signature``, ``spec``, ``command`` ...)."""
        findings, explained = self.strategy.findings()  # bugs in a stable order, the explained ones
        findings = tuple(replace(f, minimal=self.minimal.get(f.code)) for f in findings)
        return Report(
            target=target,
            framework=backend.framework,
            findings=findings,
            notes=tuple(self.notes),
            unsupported=self.unsupported_list(),
            probes=tuple(self.probe_results),
            explained=tuple(f.code for f in explained),
            explained_findings=explained,
            incomplete=tuple(self.incomplete),
            calls=self.runner.calls,
            seconds=time.perf_counter() - started,
            isolation=backend.description,
            import_seconds=getattr(backend, "import_seconds", 0.0),
            detected=detected,
            kind=backend.resolved.kind,
            **fields,
        )


def note_printed(s: Session) -> None:
    """What the function of session ``s`` wrote to stdout and stderr, as a note with the text (start and end)."""
    for name, cap in s.backend.output().items():
        if cap.total:
            s.current = "output"
            s.note(
                "printed",
                f"your function wrote {cap.total} byte{'s' if cap.total != 1 else ''} to {name} (captured; shown here, "
                "not passed on)",
                cap.text(600),
            )
