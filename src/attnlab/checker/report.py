"""What the checker found: frozen :class:`Finding` and :class:`Report`, as text, rich text or JSON.

>>> f = Finding("scale-missing", "scores are not scaled", "max error 0.4", "multiply by 1/sqrt(d_k)", "reference")
>>> r = Report(target="f", framework="numpy", signature="fn(q, k, v)", findings=(f,))
>>> r.ok, r.codes, r.verdict, int(r.exit_status)
(False, ('scale-missing',), 'bug', 1)
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from ..errors import missing_extra
from ..schemas import name as schema_name

__all__ = [
    "CODES",
    "CORE_GRAD_PROBES",
    "CORE_PROBES",
    "GRAD_PROBES",
    "PROBES",
    "ExitStatus",
    "Finding",
    "ProbeResult",
    "Report",
    "Unsupported",
]


class ExitStatus(IntEnum):
    """The exit statuses of ``attnlab check`` (and ``check-model``), defined here and only here (each one's
    meaning is :attr:`meaning`; ``attnlab check --help`` lists them from it).

    ``CLEAN`` (0): every core probe ran and no bug was found. ``BUG`` (1): at least one finding.
    ``USAGE`` (2): a bad target or option (nothing was checked). ``INCOMPLETE`` (3): no bug found, but a core
    probe could not run for a capability the function has (the report names it and why).
    ``CHECKER_FAILURE`` (4): attnlab itself failed (a bug in the checker; the report, if any, says so), or the
    report could not be written (standard output closed or broken).
    """

    CLEAN = 0
    BUG = 1
    USAGE = 2
    INCOMPLETE = 3
    CHECKER_FAILURE = 4

    @property
    def meaning(self) -> str:
        """What this status says, in a few words (``attnlab check --help`` lists them).

        >>> ExitStatus.INCOMPLETE.meaning
        'incomplete: no bug found, but a core probe could not run'
        """
        return _EXIT_MEANINGS[self]

    @classmethod
    def listing(cls) -> str:
        """Every status with its meaning, one per line (the epilog of ``attnlab check --help``)."""
        return "\n".join(f"  {int(s)}  {s.meaning}" for s in cls)


_EXIT_MEANINGS = {
    ExitStatus.CLEAN: "clean: every core probe ran and no bug was found",
    ExitStatus.BUG: "bug: at least one finding",
    ExitStatus.USAGE: "usage error: a bad target or option, nothing was checked",
    ExitStatus.INCOMPLETE: "incomplete: no bug found, but a core probe could not run",
    ExitStatus.CHECKER_FAILURE: "checker failure: a bug in attnlab, or the report could not be written",
}


#: The output probes, in the order they run (``probes=`` selects a subset; each is one function registered with
#: :func:`attnlab.checker.registry.probe` in :mod:`attnlab.checker.probes`).
PROBES = (
    "reference",
    "invariants",
    "normalization",
    "causal",
    "padding",
    "masked-rows",
    "large-logits",
    "batch",
    "determinism",
    "call-order",
    "mask-space",
    "decode",
    "mods",
)

#: The probes that must run (for what the function supports) before a report may say OK.
CORE_PROBES = ("reference", "causal", "padding", "masked-rows")
#: Every gradient probe (``probes=`` of :func:`~attnlab.checker.check_backward` selects some), in order.
GRAD_PROBES = (
    "grad-reference",
    "grad-masked-keys",
    "grad-masked-rows",
    "grad-large-logits",
    "grad-mask-space",
    "grad-decode",
    "grad-batch",
    "grad-dropout",
)
#: The gradient probes that must run (for what the function supports) before a report may say OK.
CORE_GRAD_PROBES = ("grad-reference", "grad-masked-keys", "grad-masked-rows")

#: Every finding code, with its meaning in a few words (docs/checker.md explains each one).
CODES: dict[str, str] = {
    "reference-mismatch": "output differs from the float64 reference beyond the tolerance rule",
    "scale-missing": "scores are not multiplied by 1/sqrt(d_k)",
    "scale-wrong": "scores are scaled by the wrong factor (d_model, d_k, d_v, or a scale argument ignored)",
    "scale-after-softmax": "the scale is applied to the weights or the output after the softmax, not to the scores",
    "softmax-axis": "softmax runs over another axis than the keys (queries, heads, or a flattened axis)",
    "mask-inverted": "the mask is read with the opposite convention (True = blocked vs True = may attend)",
    "mask-after-softmax": "the mask is applied after the softmax, so valid rows no longer sum to 1",
    "fill-after-softmax": "a fill value (-inf, a finite constant) is written into the weights after the softmax",
    "finite-fill": "blocked scores are filled with a finite constant (-1e4, -1e9) that large scores exceed",
    "mask-wrong-heads": "a per-batch mask is expanded to the heads in the wrong order (repeat vs repeat_interleave)",
    "causal-alignment": "the causal mask is rebuilt with the other alignment than the given one (n_q != n_k)",
    "gqa-mapping": "GQA query heads use the wrong K/V heads (tile vs interleave, or one head for all)",
    "causal-leak": "a query sees keys in its future",
    "padding-leak": "masked (padded) keys change the output",
    "masked-row-nan": "a query row with no allowed key comes back as NaN or inf",
    "unstable-softmax": "large logits overflow or underflow (no row maximum subtracted)",
    "not-normalized": "attention weights of a row do not sum to 1",
    "batch-leak": "one batch element or head changes the output of another",
    "nondeterministic": "the same inputs give different outputs",
    "crash": "the function raised, or returned something that is not an array, on a supported input",
    "masked-row-policy": "a fully masked row does not follow the declared policy (masked_rows=...)",
    "precision": "inputs are computed in a lower precision than they carry (float16 weights, float64 in float32)",
    "dtype": "the output dtype differs from the input dtype",
    "mutates-input": "the function writes into the caller's arrays",
    "timeout": "a call did not return within the time limit",
    "output-type": "the output is not an array of the function's own library (a torch function returned NumPy)",
    "mod-mismatch": "a declared flex mask_mod / score_mod differs from the dense rule it claims",
}


@dataclass(frozen=True)
class Finding:
    """One diagnosis: a stable ``code``, what is wrong in plain words, the evidence, and how to fix it.

    ``severity`` is ``"bug"`` (the report is not ok) or ``"note"`` (a documented behaviour worth knowing, such as
    zeros on fully masked rows or a causal alignment other than the one declared).
    """

    code: str
    message: str
    evidence: str
    fix: str
    probe: str
    severity: str = "bug"
    explained_by: str = ""
    minimal: Any = None  #: the smallest failing case (:class:`attnlab.checker.minimal.Minimal`), or None

    def as_dict(self) -> dict[str, Any]:
        """This finding as JSON-ready data (the report's ``findings`` entries)."""
        d: dict[str, Any] = {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "evidence": self.evidence,
            "fix": self.fix,
            "probe": self.probe,
        }
        if self.explained_by:
            d["explained_by"] = self.explained_by
        if self.minimal is not None:
            d["minimal"] = self.minimal.as_dict()
        return d


@dataclass(frozen=True)
class Unsupported:
    """A capability (or, in ``Report.incomplete``, a core probe) that was not tested, and why."""

    capability: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        """This entry as JSON-ready data: ``capability`` and ``reason``."""
        return {"capability": self.capability, "reason": self.reason}


@dataclass(frozen=True)
class ProbeResult:
    """One probe: ``status`` is ``"passed"`` (it saw no bug), ``"failed"`` (it saw at least one, listed in
    ``codes``, explained ones included), ``"skipped"`` (needs a capability the function does not have) or
    ``"not run"`` (not selected, or after a timeout or the worker's end); ``calls`` calls took ``seconds``."""

    name: str
    status: str
    calls: int = 0
    seconds: float = 0.0
    detail: str = ""
    codes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """This probe's result as JSON-ready data (the report's ``probes`` entries)."""
        return {
            "name": self.name,
            "status": self.status,
            "calls": self.calls,
            "seconds": round(self.seconds, 4),
            "detail": self.detail,
            "codes": list(self.codes),
        }


@dataclass(frozen=True)
class Report:
    """The result of :func:`attnlab.check`: ``ok`` when the verdict is clean.

    Attributes:
        target: the function's name; framework, signature: how it was called.
        findings: bugs, at most one per code (the first evidence not explained within its own case).
        notes: documented behaviours (severity ``"note"``), and what the function printed.
        unsupported: capabilities not tested, with reasons.
        probes: each probe's status.
        explained: codes seen only in cases where a named bug accounts for them; ``explained_findings`` holds
            each one's first evidence and ``explained_by``.
        incomplete: core probes that could not run for a capability the function has, with the reason; when
            there are such and no bug, the verdict is ``"incomplete"``.
        isolation: ``"worker process"`` (the function ran in its own process) or ``"in-process"``;
            ``import_seconds``: how long the worker took to import the target (included in ``seconds``).
        detected: the framework and why (``"torch: its code uses F (module torch.nn.functional)"``), and, when
            every call failed in the detected one, which other framework worked.
        kind: what was passed (``"a functools.partial of attention"``, ``"a torch.nn.Module (Attend)"``).
        mode: for a layer checked in module mode, how it was adapted (projections, rotary, mask convention).
    """

    target: str
    framework: str
    signature: str
    findings: tuple[Finding, ...] = ()
    notes: tuple[Finding, ...] = ()
    unsupported: tuple[Unsupported, ...] = ()
    probes: tuple[ProbeResult, ...] = ()
    explained: tuple[str, ...] = ()
    calls: int = 0
    seconds: float = 0.0
    spec: dict[str, Any] = field(default_factory=dict)
    command: str = "check"
    explained_findings: tuple[Finding, ...] = ()
    incomplete: tuple[Unsupported, ...] = ()
    isolation: str = "in-process"
    import_seconds: float = 0.0
    detected: str = ""
    kind: str = ""
    mode: str = ""

    @property
    def verdict(self) -> str:
        """``"bug"`` (a finding), ``"incomplete"`` (no bug, but a core probe could not run) or ``"clean"``."""
        if self.findings:
            return "bug"
        return "incomplete" if self.incomplete else "clean"

    @property
    def ok(self) -> bool:
        """True only for a clean verdict: every core probe ran and no bug was found."""
        return self.verdict == "clean"

    @property
    def exit_status(self) -> ExitStatus:
        """The command's exit status for this verdict: 1 bug, 3 incomplete, 0 clean."""
        return {"bug": ExitStatus.BUG, "incomplete": ExitStatus.INCOMPLETE, "clean": ExitStatus.CLEAN}[self.verdict]

    @property
    def codes(self) -> tuple[str, ...]:
        """The findings' codes, in report order."""
        return tuple(f.code for f in self.findings)

    @property
    def summary(self) -> str:
        """One line: the verdict, the codes, and what was not tested."""
        if self.verdict == "clean":
            head = "clean: no bug found"
        elif self.verdict == "incomplete":
            head = "no bug found, but not run: " + ", ".join(u.capability for u in self.incomplete)
        else:
            n = len(self.findings)
            head = f"{n} bug{'s' if n != 1 else ''} found: {', '.join(self.codes)}"
        extra = []
        if self.notes:
            extra.append(f"{len(self.notes)} note{'s' if len(self.notes) != 1 else ''}")
        if self.unsupported:
            extra.append("not tested: " + ", ".join(u.capability for u in self.unsupported))
        tail = f" ({'; '.join(extra)})" if extra else ""
        return f"{head}{tail}; {self.calls} call{'s' if self.calls != 1 else ''} in {self.seconds:.2f} s"

    def as_dict(self) -> dict[str, Any]:
        """The report as the JSON document ``--json`` prints (schema ``attnlab.check/1`` or
        ``attnlab.check-model/1``, :mod:`attnlab.schemas`)."""
        return {
            "schema": schema_name(self.command),
            "command": self.command,
            "target": self.target,
            "ok": self.ok,
            "verdict": self.verdict,
            "exit_status": int(self.exit_status),
            "summary": self.summary,
            "framework": self.framework,
            "signature": self.signature,
            "findings": [f.as_dict() for f in self.findings],
            "notes": [f.as_dict() for f in self.notes],
            "explained": list(self.explained),
            "explained_findings": [f.as_dict() for f in self.explained_findings],
            "unsupported": [u.as_dict() for u in self.unsupported],
            "incomplete": [u.as_dict() for u in self.incomplete],
            "isolation": self.isolation,
            "detected": self.detected,
            "kind": self.kind,
            "mode": self.mode,
            "import_seconds": round(self.import_seconds, 4),
            "probes": [p.as_dict() for p in self.probes],
            "calls": self.calls,
            "seconds": round(self.seconds, 4),
            "spec": self.spec,
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        """The report as JSON text (:meth:`as_dict`)."""
        return json.dumps(self.as_dict(), indent=indent, sort_keys=False)

    # -- text ---------------------------------------------------------------------------------------------------
    def _lines(self) -> list[tuple[str, str]]:
        """(style, text) pairs; the plain text and the rich rendering share them."""
        device = self.spec.get("device")
        on = f" on {device}" if device else ""  # the device the inputs were created on (torch, JAX)
        out: list[tuple[str, str]] = [
            ("bold", f"attnlab {self.command}: {self.target}"),
            ("dim", f"  {self.framework}{on}, called as {self.signature}"),
        ]
        for f in self.findings:
            out += [
                ("bold red", f"BUG {f.code}: {f.message}"),
                ("", f"  evidence: {f.evidence}"),
                ("green", f"  fix: {f.fix}"),
            ]
            if f.minimal is not None:
                out += [("", line) for line in f.minimal.lines()]
        for f in self.notes:
            out += [("yellow", f"NOTE {f.code}: {f.message}"), ("", f"  evidence: {f.evidence}")]
            if f.fix:
                out.append(("", f"  {f.fix}"))
        if self.explained_findings:
            also = ", ".join(f"{f.code} (by {f.explained_by})" for f in self.explained_findings)
            out.append(("dim", f"also seen, explained by the above in the same case: {also}"))
        elif self.explained:
            out.append(("dim", f"also seen, explained by the above: {', '.join(self.explained)}"))
        for u in self.unsupported:
            out.append(("dim", f"not tested: {u.capability} ({u.reason})"))
        for u in self.incomplete:
            out.append(("bold yellow", f"NOT RUN {u.capability}: {u.reason}"))
        marks = {"passed": "ok", "failed": "FAIL", "skipped": "skip", "not run": "-"}

        def mark(p: ProbeResult) -> str:
            m = marks.get(p.status, p.status)
            return f"{m} ({', '.join(p.codes)})" if p.status == "failed" and p.codes else m

        if self.kind and self.kind not in ("a function", "a lambda"):
            out.append(("dim", f"checked: {self.kind}"))
        if self.mode:
            out.append(("dim", f"module mode: {self.mode}"))
        if self.detected and self.detected != self.framework:
            out.append(("dim", f"framework {self.detected}"))
        out.append(("dim", "probes: " + ", ".join(f"{p.name} {mark(p)}" for p in self.probes)))
        head = {
            "clean": ("bold green", "OK "),
            "incomplete": ("bold yellow", "INCOMPLETE "),
            "bug": ("bold red", "FAILED "),
        }
        style, word = head[self.verdict]
        out.append((style, word + self.summary))
        return out

    def to_text(self) -> str:
        """Plain text, one finding per block (no colour, no wrapping)."""
        return "\n".join(text for _, text in self._lines()) + "\n"

    def __str__(self) -> str:
        return self.to_text()

    def render(self, *, width: int = 100, color: bool = True) -> str:
        """The report rendered by rich at ``width`` columns (``color=False`` for plain, wrapped text)."""
        try:
            from rich.console import Console
            from rich.text import Text
        except ImportError:
            raise missing_extra("rich", "check") from None
        buf = io.StringIO()
        console = Console(
            file=buf,
            width=width,
            color_system="standard" if color else None,
            force_terminal=color,
            highlight=False,
            emoji=False,
            soft_wrap=False,
        )
        for style, text in self._lines():
            console.print(Text(text, style=style or ""))
        return buf.getvalue()
