"""The probes: small experiments on the function under test, each diagnosing one class of bug by its code.

Every probe builds canonical cases (float64 NumPy, heads before the sequence axis, True = may attend), calls the
function through the :class:`~attnlab.checker.adapters.Adapter` and compares with attnlab's float64 reference under
the tolerance rule of :mod:`attnlab.checker.tolerance`. When an output is wrong, the probe tests hypotheses (scale
missing, softmax over the wrong axis, mask inverted, ...) and names the one that explains it.

The probes, in the order they run (``probes=`` selects a subset):

========================  ===========================================================================  ===========
probe                     experiment                                                                   needs
========================  ===========================================================================  ===========
``reference``             a grid of shapes (n_q != n_k, d_v != d_k, odd sizes, rank 2-4, GQA, B and h  --
                          above 1) and dtypes, compared with the float64 reference; mismatches are
                          diagnosed by the hypotheses of :mod:`attnlab.checker.hypotheses`
``invariants``            the §21 invariants on returned weights (rows sum to 1, masked weights 0)     weights
``normalization``         V = ones: every output must be exactly a convex combination, i.e. 1          --
``causal``                change future tokens; earlier outputs must not move                          causal
``padding``               1e10 / random / NaN in the K and V of padded keys, and scores of large       mask
                          magnitude (a finite fill leaks); valid outputs must not move
``masked-rows``           a query row with no allowed key: error, zeros, uniform (documented) or NaN   mask
``large-logits``          logits of about ±1000: exp overflows or underflows unless the row maximum    --
                          is subtracted
``batch``                 change batch element 1, then 0, then head 1, then 0; the others must not     --
                          move
``determinism``           the same call three times; outputs must be bitwise equal                     --
========================  ===========================================================================  ===========

``crash``, ``timeout``, ``dtype`` (output dtype = input dtype), ``output-type`` (an array of the function's own
library) and ``mutates-input`` are checked on every call.

Every bug a probe sees is an observation tied to its *case* (one grid case, or one perturbation experiment: its
base call, the repeated base call and the perturbed calls). A generic code is "explained" only by a named bug
seen in the same case; a probe that saw any bug is ``failed`` and lists the codes it saw.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from .. import masks as _masks
from ..invariants import check_arrays
from .adapters import CAPABILITIES, round_to
from .cases import COMBOS, DTYPE_NAMES, GRID, LENGTH_FORMS, PRECISION, Geom, drawn, indent, random_mask, softmax
from .evidence import fit_scale, precision
from .fixes import FIXES, LEAKS, NOT_DIAGNOSES, PERTURBATION, SPECIFIC
from .hypotheses import Context, outputs
from .minimal import Caller, Minimal, minimal_case, unshrunk
from .report import CORE_PROBES, PROBES, Finding, ProbeResult, Report, Unsupported
from .reproduction import CallWords
from .runner import CallError, Case, Outcome, Runner
from .tolerance import FLOORS, Comparison, bound, compare, expand_kv, golden_output, naive_output

__all__ = ["FIXES", "PROBE_FUNCTIONS", "Battery", "ProbeAbort", "ProbeSkip", "probe"]

#: How many mismatching cases no hypothesis explains get perturbation experiments of their own.
EXPERIMENT_CASES = 40

#: The probes by name, in the order they run: ``name -> probe(battery)`` (registered with :func:`probe`).
PROBE_FUNCTIONS: dict[str, Callable[[Battery], None]] = {}


def probe(name: str) -> Callable[[Callable[[Battery], None]], Callable[[Battery], None]]:
    """Register the decorated method as the probe ``name``, one of :data:`~attnlab.checker.report.PROBES` (probes
    run in that order, which is the order they are defined in)."""
    if name not in PROBES or name in PROBE_FUNCTIONS:
        raise RuntimeError(f"probe {name!r}: not in attnlab.checker.report.PROBES, or defined twice")

    def register(fn: Callable[[Battery], None]) -> Callable[[Battery], None]:
        PROBE_FUNCTIONS[name] = fn
        return fn

    return register


#: How a call of each capability is described, and the words that make an error a clean refusal of it.
_CAP_PHRASE = {
    "mask": "with a mask",
    "causal": "with the causal flag",
    "scale": "with a scale argument",
    "cross": "with n_q != n_k",
    "dv": "with d_v != d_k",
    "rank": "on 3-D inputs [h, n, d]",
    "gqa": "with fewer K/V heads than query heads",
    "causal-cross": "causal with n_q != n_k",
}
_SHAPE_CAPS = ("cross", "dv", "rank", "gqa", "causal-cross")
#: Messages of a shape error inside the function (NumPy, PyTorch): they name no unsupported argument.
_INTERNAL_SHAPE = (
    r"could not be broadcast|could not broadcast|must match the size of tensor|doesn't match the broadcast shape"
    r"|expanded size of the tensor|cannot reshape array|is invalid for input of size|shapes cannot be multiplied"
    r"|mismatch in its core dimension"
)
#: A library op called with arguments it cannot take: a bug in the function, whatever argument it names.
_MISUSED_OP = r"received an invalid combination of arguments|has no attribute|is not defined"
_REFUSAL_WORDS = {
    "float64": r"float64|double|\bf64\b|dtype",
    "float32": r"float32|\bsingle\b|'float'|\bf32\b|dtype",
    "float16": r"float16|\bhalf\b|\bf16\b|dtype",
    "bfloat16": r"bfloat16|\bbf16\b|dtype",
    "mask": r"\bmask(s|ing)?\b|\battn_mask\b|\bkey_padding_mask\b",  # not masked_fill / masked_softmax
    "causal": r"causal",
    "scale": r"scale",
    "cross": r"n_q|n_k|length|\bseq|square|same|cross|shape|size",
    "dv": r"d_v|\bdv\b|value|head.?dim|dimension|shape|size",
    "rank": r"rank|\bdim|ndim|[234]-?d\b|shape",
    "gqa": r"gqa|group|head|shape",
    "causal-cross": r"causal|align|n_q|n_k|square|shape",
}


class ProbeAbort(Exception):
    """A call timed out, or the worker ended too often; nothing more is called."""


@dataclass(frozen=True)
class _Obs:
    """One bug seen: the finding and the case it was seen in."""

    finding: Finding
    case: str


class Battery:
    """One run of the probes on one function, called through ``backend`` (in-process or a worker process)."""

    #: The fix line of each finding code this battery reports.
    fixes: dict[str, str] = FIXES

    def __init__(
        self,
        backend: Any,
        spec: Any,
        *,
        timeout: float,
        seed: int,
        probes: tuple[str, ...],
        progress: Callable[[str, int, int], None] | None = None,
    ):
        self.backend = backend
        self.progress = progress  # progress(step, done, total) before each probe (attnlab check's display)
        self.spec = spec
        self.runner = Runner(backend, timeout=timeout)
        self.rng = np.random.default_rng(seed)
        self.selected = probes
        self.findings: dict[str, Finding] = {}
        self.obs: list[_Obs] = []
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
        self.align: str | None = self.spec.causal_align
        self.align_seen: str | None = None
        self.returns_weights = False
        self.base_ok: dict[str, bool] = {}
        self.experiments_left = EXPERIMENT_CASES
        self.gqa_map = getattr(spec, "gqa_mapping", "interleave")
        self.mask_form = getattr(spec, "mask_form", "full")
        self.compute = getattr(spec, "compute_dtype", "auto")
        self.lower_seen: str | None = None
        self.float32_oracle = False
        self.last: tuple[Case, Outcome] | None = None  # the last call made (every_call)
        self.examined: tuple[str | None, Case, Outcome] | None = None  # the call being compared, in its case key
        self.failing: dict[str, tuple[Case, Outcome]] = {}  # each code's first failing case and call
        self.minimal: dict[str, Minimal] = {}  # each reported finding's smallest case (after the probes)
        r = backend.resolved
        self.causal_mode: str | None
        if self.spec.causal_only:
            self.causal_mode = "only"
        elif r.causal_arg is not None:
            self.causal_mode = "flag"
        elif r.mask_arg is not None:
            self.causal_mode = "mask"
        else:
            self.causal_mode = None

    # ------------------------------------------------------------------------------------------------ findings
    def bug(self, code: str, message: str, evidence: str, *, case: str | None = None) -> None:
        """Record that ``code`` was seen in ``case`` (default: the case being worked on)."""
        f = Finding(code, message, evidence, self.fixes[code], self.current)
        self.obs.append(_Obs(f, case or self.case_key or self.current))
        seen = self.examined[1:] if self.examined is not None and self.examined[0] == self.case_key else self.last
        if seen is not None:
            self.failing.setdefault(code, seen)
        self.findings.setdefault(code, f)
        if code not in self.probe_codes:
            self.probe_codes.append(code)

    def note(self, code: str, message: str, evidence: str, fix: str = "") -> None:
        """Record a note (a documented behaviour, never a bug) once per code and message."""
        if not any(n.code == code and n.message == message for n in self.notes):
            self.notes.append(Finding(code, message, evidence, fix, self.current, severity="note"))

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
            m = self.random_mask(g)
        causal = causal or self.spec.causal_only or (getattr(self.spec, "causal_when_no_mask", False) and m is None)
        given_align, align = align, None
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
            m = m & per_seq
            return Case(q, k, v, dtype=dtype, mask=m, causal=None, scale=scale, label=label, flag=True)
        if causal:
            align = "top_left" if g.n_q == g.n_k else (given_align or self.align or "bottom_right")
        return Case(q, k, v, dtype=dtype, mask=m, causal=align, scale=scale, label=label)

    def random_mask(self, g: Geom) -> np.ndarray:
        """A random mask the function's mask form can express (see :func:`~attnlab.checker.cases.random_mask`)."""
        return random_mask(self.rng, g, self.mask_form if g.b is not None else "full")

    @staticmethod
    def key(case: Case) -> str:
        """The case an observation belongs to (grid cases are keyed by label and dtype)."""
        return f"{case.label} ({case.dtype})"

    def base_call(self, case: Case, key: str) -> Outcome | None:
        """The base call of a perturbation experiment, or None when it failed.

        It is compared with the reference (a named bug it shows is seen in this case, and explains a leak found
        here) and repeated once: noise between two identical calls is nondeterminism, not a leak.
        """
        self.case_key = key
        base = self.call(case)
        if not base.ok:
            self.crash(base)
            return None
        self.compare_case(base)
        again = self.call(case)
        if not again.ok:
            self.crash(again)
        elif again.out.shape != base.out.shape or not np.array_equal(again.out, base.out, equal_nan=True):
            diff = np.abs(again.out - base.out) if again.out.shape == base.out.shape else np.array([np.inf])
            self.bug(
                "nondeterministic",
                "the same inputs give different outputs from one call to the next",
                f"case {case.label}: {case.shapes()}; max difference {float(np.nanmax(diff)):.3g} between two "
                "identical calls",
            )
        return base

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

    def causal_in_mask(self, case: Case) -> bool:
        """Whether the causal part of ``case`` reaches the function inside its mask argument."""
        if self.mask_form != "full" and self.causal_mode == "flag":
            return False  # a [B, n_k] / per-batch mask cannot hold the causal part: flag and mask go separately
        return case.causal is not None and (
            self.causal_mode == "mask" or (self.causal_mode == "flag" and case.mask is not None)
        )

    def as_passed(self, case: Case, default_align: str) -> tuple[Case, bool | str]:
        """``case`` as the function is given it, and its causal argument: the causal part goes in the mask when the
        function has no flag, or has one and gets a mask (PyTorch SDPA refuses both); an alignment string (or
        ``default_align``) for ``causal_value="align"``."""
        passed = replace(case, mask=self.allowed(case), causal=None, flag=False) if self.causal_in_mask(case) else case
        flag: bool | str = passed.causal is not None or case.flag
        if flag and self.spec.causal_value == "align":
            flag = passed.causal or default_align
        return passed, flag

    def every_call(self, case: Case, out: Outcome) -> None:
        """What every call must satisfy, whatever the battery: no timeout, no dead worker, no write into its
        inputs, a readable result of the right kind. Raises :class:`ProbeAbort` when nothing more can be called."""
        self.last = (case, out)
        if out.skipped:
            raise ProbeAbort
        if out.timed_out:
            after = (
                "the worker process was killed (with its threads and child processes)"
                if self.backend.isolated
                else "a Python thread cannot be killed; it may still be running"
            )
            self.bug(
                "timeout",
                f"the function did not return within {self.runner.timeout:g} s",
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

    def call(self, case: Case) -> Outcome:
        """Call the function on ``case`` and check what every call must satisfy (crash, timeout, dtype, writes)."""
        passed, flag = self.as_passed(case, "bottom_right")
        out = self.runner.call(passed, causal_flag=flag, gqa=case.gqa)
        out.case = case
        self.every_call(case, out)
        if (
            out.ok
            and out.returned.out_dtype == "float32"
            and case.dtype != "float32"
            and self.compute in ("auto", "float32")
            and (case.dtype == "float64" or self.float32_oracle)
        ):
            # a reference oracle that computes and returns float32 whatever it is given (xformers' ref_attention)
            self.float32_oracle = True
            if self.compute == "auto":
                self.lower_seen = "float32"
            self.note(
                "lower-precision",
                "the function computes and returns float32 for every input dtype (an upcasting reference oracle): "
                "float64 inputs are compared under float32's rule, and a float32 output is not a dtype bug",
                f"case {case.label}: {case.shapes()}; output dtype float32",
                "declare compute_dtype='input' to hold it to each input dtype",
            )
        elif out.ok and out.returned.out_dtype is not None and out.returned.out_dtype != case.dtype:
            self.bug(
                "dtype",
                f"your function returns {out.returned.out_dtype} for {case.dtype} inputs",
                f"case {case.label}: {case.shapes()}; output dtype {out.returned.out_dtype}",
            )
        if out.ok and out.weights is not None:
            self.returns_weights = True
        return out

    def crash(self, out: Outcome, message: str | None = None) -> None:
        """A ``crash`` finding for an outcome that raised (or ended the worker), naming the call and the error."""
        e = out.error
        if e is None:
            return
        if message is None:
            if e.died:
                message = f"your function ended the process it ran in: {e.message.split(';')[0]}"
            else:
                message = f"your function {_raised(e)} on an input it otherwise supports"
                if re.search(r"converted to type .*without overflow", e.message):
                    message += " (a fill value this dtype cannot hold, such as -1e9 in float16: use finfo(dtype).min)"
        first = (e.text.splitlines() or [e.type_name])[0][:300]
        self.examined = (self.case_key, out.case, out)  # the failing case is this call's
        self.bug("crash", message, f"case {out.case.label}: {out.call}: {first}")

    def refusal(self, cap: str, e: CallError | None) -> bool:
        """A clean refusal: NotImplementedError, the library refusing the input, or a ValueError, TypeError or
        RuntimeError whose message names ``cap`` (its argument, dtype or shape)."""
        assert e is not None  # called for outcomes that raised
        if e.died or e.type_name in ("SystemExit", "KeyboardInterrupt", "WorkerExit"):
            return False
        if e.not_implemented or e.library:
            return True
        if not {"ValueError", "TypeError", "RuntimeError"} & set(e.bases):
            return False  # AttributeError, NameError, IndexError, AssertionError...: a bug, whatever it says
        if re.search(_MISUSED_OP, e.message, flags=re.IGNORECASE):
            return False  # torch.masked_fill(x, bad_args), a typo caught as TypeError: a crash, not a refusal
        if cap == "dv" and re.search(_INTERNAL_SHAPE, e.message, flags=re.IGNORECASE):
            return False  # an output allocated like q, a broadcast inside the function: a crash, not a refusal
        r = self.backend.resolved
        names = {"mask": r.mask_arg, "causal": r.causal_arg, "scale": r.scale_arg}
        words = _REFUSAL_WORDS[cap] + (f"|\\b{re.escape(names[cap])}\\b" if names.get(cap) else "")
        if cap in _SHAPE_CAPS:  # a shape written out names it: "expects [B, h, n, d]", "(1, 5, 2, 6)"
            words += r"|\[[\w\s,.]*\]|\(\d+(?:,\s*\d+)+\)"
        return re.search(words, e.message, flags=re.IGNORECASE) is not None

    # ------------------------------------------------------------------------------------------------ expected
    def expected(self, case: Case, *, causal: str | None = "same") -> tuple[np.ndarray, float, np.ndarray]:
        """The golden output, its bound under the tolerance rule, and which rows to compare ``[..., n_q]``."""
        c = case.causal if causal == "same" else causal
        golden = golden_output(case.q, case.k, case.v, case.mask, scale=case.scale, causal=c, gqa=self.gqa_map)
        allowed = self.allowed(case, causal=c)
        work = self.work_dtype(case.dtype)
        naive = naive_output(case.q, case.k, case.v, allowed, dtype=work, scale=case.scale, gqa=self.gqa_map)
        return golden, bound(work, golden, naive), allowed.any(axis=-1)

    def expand(self, q: np.ndarray, x: np.ndarray, mapping: str | None = None) -> np.ndarray:
        """K/V expanded to q's heads with the declared GQA mapping (or ``mapping``)."""
        return expand_kv(q, x, mapping or self.gqa_map)

    def work_dtype(self, dtype: str) -> str:
        """The precision whose tolerance rule applies to a case in ``dtype``: the input dtype, or the declared
        (or seen) lower compute precision."""
        c = self.compute
        if c == "auto":
            c = self.lower_seen or "input"
        if c == "input" or PRECISION[c] >= PRECISION[dtype]:
            return dtype
        return c

    def lower_precision(self, case: Case, out: np.ndarray, rows: np.ndarray, evidence: str) -> bool:
        """A ``precision`` bug: the error pattern is rounding to a lower dtype
        (:func:`~attnlab.checker.evidence.precision`: its size, no structured explanation, a rounding pattern) and
        the output is right to that dtype's tolerance rule (computed in it, or an intermediate rounded to it)."""
        golden, _, _ = self.expected(case)
        work = self.work_dtype(case.dtype)
        fit = precision(case, out, gqa=self.gqa_map, below=work)
        if not fit.dtype:
            return False
        low = fit.dtype
        allowed = self.allowed(case)
        naive = naive_output(case.q, case.k, case.v, allowed, dtype=low, scale=case.scale, gqa=self.gqa_map)
        c = compare(out, golden, bound(low, golden, naive), rows)
        if not c.ok:
            return False
        held = (
            f"; compute_dtype='{self.compute}' holds {case.dtype} inputs to {work}'s rule"
            if self.compute != "auto"
            else ""
        )
        self.bug(
            "precision",
            f"your function computes {case.dtype} inputs in {low} (or rounds an intermediate, such as the "
            f"weights before @ V, to {low}){held}",
            evidence + f"; within {low}'s tolerance rule ({c.bound:.2g}); {fit.text}",
        )
        return True

    def fitted_scale(self, case: Case, out: np.ndarray, cmp: Comparison, evidence: str) -> bool:
        """A ``scale-wrong`` bug named by the fitted scale (:func:`~attnlab.checker.evidence.fit_scale`): one
        scalar, other than the expected one, explains the output within the tolerance."""
        fit = fit_scale(case, out, gqa=self.gqa_map, tol=cmp.bound)
        if not (fit.fits and fit.identifiable) or abs(fit.scale / fit.expected - 1) <= 1e-6:
            return False
        want = "1/sqrt(d_k)" if case.scale is None else f"the scale argument ({case.scale:g})"
        said = f"{fit.formula} = {fit.value:.6g}" if fit.formula else f"{fit.scale:.6g}, which matches no formula"
        self.bug(
            "scale-wrong", f"your function scales the scores by {said}, instead of {want}", evidence + f"; {fit.text}"
        )
        return True

    def _inverted_text(self) -> str:
        return {
            "allow": "your function treats True as 'blocked' (the mask is read inverted; declared True = may attend)",
            "block": "your function treats True as 'may attend' (the mask is read inverted; declared True = blocked)",
            "keep": "your function treats 1 as 'masked' (the keep mask is read inverted)",
            "additive": "your function reads the additive mask inverted (0 blocks, the large negative value allows)",
        }[self.spec.mask_convention]

    def diagnose(
        self, case: Case, out: np.ndarray, cmp: Comparison, rows: np.ndarray, *, as_flag: bool = False
    ) -> None:
        """Name the bug behind a mismatching output, or report ``reference-mismatch`` with the evidence and run the
        perturbation experiments on ``case``. ``as_flag``: the call made passed ``case``'s causal part as the flag,
        not in the mask (the hypotheses read the mask without it; no experiments, which would call ``case``)."""
        evidence = f"case {case.label}: {case.shapes()}"
        if case.mask is not None:
            evidence += ", with a mask"
        if case.causal is not None:
            evidence += f", causal ({case.causal.replace('_', '-')})"
        if cmp.max_error == math.inf:
            exp_shape = (*case.q.shape[:-1], case.v.shape[-1])
            self.bug(
                "reference-mismatch",
                f"your function returns shape {out.shape}; expected {exp_shape}",
                evidence + f"; layout {self.spec.layout}",
            )
            return
        what = (
            f"; {cmp.nonfinite} non-finite value(s) in rows that have allowed keys"
            if cmp.nonfinite
            else f"; max |out - reference| = {cmp.max_error:.3g} at {cmp.where} (tolerance {cmp.bound:.2g})"
        )
        evidence += what
        for held, rule in self.diagnosis_bounds(case, cmp):
            for align in self.own_alignments(case):
                if self.name_by_hypotheses(case, align, out, held, rows, evidence, rule, as_flag=as_flag):
                    return
        if self.lower_precision(case, out, rows, evidence) or self.fitted_scale(case, out, cmp, evidence):
            return
        self.bug("reference-mismatch", "your function's output differs from the float64 reference", evidence)
        if not as_flag:
            self.experiments(case, out)

    def diagnosis_bounds(self, case: Case, cmp: Comparison) -> Iterator[tuple[Comparison, str]]:
        """The bounds a hypothesis must explain a mismatch to, tried in turn: the case's own, then (for float64
        inputs, no compute dtype declared: a float32 computation is only a note) float32's rule, computed only
        when the first found nothing."""
        yield cmp, ""
        if self.compute == "auto" and case.dtype == "float64" and cmp.nonfinite == 0:
            naive32 = naive_output(
                case.q, case.k, case.v, self.allowed(case), dtype="float32", scale=case.scale, gqa=self.gqa_map
            )
            b32 = bound("float32", self.expected(case)[0], naive32)
            if b32 > cmp.bound:
                yield replace(cmp, bound=b32), " (to float32's tolerance rule: computed in float32)"

    def name_by_hypotheses(
        self,
        case: Case,
        align: str | None,
        out: np.ndarray,
        cmp: Comparison,
        rows: np.ndarray,
        evidence: str,
        rule: str,
        *,
        as_flag: bool,
    ) -> bool:
        """Name the first registered hypothesis that explains ``out`` (to ``cmp``'s bound) under the causal
        alignment ``align``; False when none does."""
        seen = case if align == case.causal else replace(case, causal=align)
        in_mask = self.causal_in_mask(seen) and not as_flag
        ctx = Context.build(
            seen,
            out,
            self.allowed(seen),
            causal_in_mask=in_mask,
            alignment_received=in_mask or self.spec.causal_value == "align",
            inverted_text=self._inverted_text(),
            gqa_map=self.gqa_map,
        )
        for code, message, alt in outputs(ctx):
            if alt.shape != out.shape:
                continue
            c = _explains(out, alt, cmp, rows)
            if c is None:
                continue
            matched = evidence + f"; the output matches that explanation to {c:.2g}{rule}"
            if align != case.causal:
                matched += f" (with the function's own causal alignment, {str(align).replace('_', '-')})"
            if "+" in code:  # two bugs at once, each named (with the combination as its evidence)
                for i, part in enumerate(code.split("+")):
                    self.bug(part, _single(i, message), matched + f" ({message})")
                return True
            if code in ("scale-missing", "scale-wrong"):
                fit = fit_scale(seen, out, gqa=self.gqa_map, tol=cmp.bound)
                matched += f"; {fit.text}"
            self.bug(code, message, matched)
            return True
        return False

    def ones_tolerance(self, case: Case, out: Outcome) -> float:
        """How far from 1 an output with V = ones may be: the coarser of the case's working precision and the
        returned dtype, and float32's for float64 inputs unless a compute dtype is declared (an undeclared float32
        computation of float64 inputs is the ``lower-precision`` note, never a normalization bug)."""
        coarse = max(FLOORS[self.work_dtype(case.dtype)], FLOORS.get(out.returned.out_dtype or case.dtype, 0.0))
        if self.compute == "auto" and case.dtype == "float64":
            coarse = max(coarse, FLOORS["float32"])
        return coarse * 4

    def own_alignments(self, case: Case) -> tuple[str | None, ...]:
        """The causal alignments a mismatching ``case`` is diagnosed under: its own, and the other one too when the
        alignment is the function's own undeclared choice (a bool flag on a rectangular case), the one it was seen
        to use first."""
        n_q, n_k = case.q.shape[-2], case.k.shape[-2]
        own_choice = (
            case.causal is not None
            and n_q != n_k
            and self.spec.causal_align is None
            and self.spec.causal_value != "align"
            and self.causal_mode in ("flag", "only")
            and not self.causal_in_mask(case)
        )
        if not own_choice:
            return (case.causal,)
        other = "top_left" if case.causal == "bottom_right" else "bottom_right"
        return (other, case.causal) if self.align_seen == other else (case.causal, other)

    def experiments(self, case: Case, out: np.ndarray) -> None:
        """Perturbation experiments on a mismatching case that no hypothesis explains, so that what they find is
        seen in this case: the same call repeated, its future tokens, its blocked keys, another batch element,
        another head, V = ones. At most :data:`EXPERIMENT_CASES` cases per run get them."""
        if self.experiments_left <= 0 or out.shape != (*case.q.shape[:-1], case.v.shape[-1]):
            return
        self.experiments_left -= 1
        finite = np.abs(out[np.isfinite(out)])
        tol = FLOORS[self.work_dtype(case.dtype)] * max(1.0, float(finite.max()) if finite.size else 1.0) * 4
        ev = f"case {case.label}: {case.shapes()}"

        def moved(new: Outcome, idx: Any, rows: np.ndarray | None = None) -> float | None:
            if not new.ok or new.out.shape != out.shape:
                return None
            a, b = new.out[idx], out[idx]
            with np.errstate(invalid="ignore"):
                d = np.where((a == b) | (np.isnan(a) & np.isnan(b)), 0.0, np.abs(a - b))  # NaN that stays is no move
            if rows is not None:
                d = np.where(rows[idx][..., None], d, 0.0)
            bad = d[~(d <= tol)]
            if not bad.size:
                return None
            finite = bad[np.isfinite(bad)]
            return float(finite.max()) if finite.size else math.inf

        again = self.call(case)
        if again.ok and (again.out.shape != out.shape or not np.array_equal(again.out, out, equal_nan=True)):
            self.bug("nondeterministic", "the same inputs give different outputs from one call to the next", ev)
        n_q, n_k = case.q.shape[-2], case.k.shape[-2]
        if case.causal is not None:
            off = n_k - n_q if case.causal == "bottom_right" else 0
            t = max(0, n_q // 2 - 1)
            if t + off + 1 < n_k:
                sel = {
                    "q": (..., slice(t + 1, None), slice(None)),
                    "k": (..., slice(t + off + 1, None), slice(None)),
                    "v": (..., slice(t + off + 1, None), slice(None)),
                }
                m = moved(self.call(self._perturbed(case, sel)), (..., slice(0, t + 1), slice(None)))
                if m is not None:
                    self.bug(
                        "causal-leak",
                        f"queries 0..{t} change when the tokens after them (their future) change",
                        ev + f", causal; max change {m:.3g} (tolerance {tol:.2g})",
                    )
        allowed = self.allowed(case)
        rows = allowed.any(axis=-1)
        if case.mask is not None and allowed.ndim >= 3:
            # keys no query of any head of the last batch element may attend: changing their K/V must not move
            # that element's outputs (the other elements are left out: a batch leak would confound them)
            b = (case.q.shape[0] - 1,) if case.q.ndim == 4 else ()
            blocked = ~allowed[b].any(axis=(-3, -2))  # [n_k]
            if blocked.any():
                k, v = case.k.copy(), case.v.copy()
                for arr in (k, v):
                    part = arr[(*b, slice(None), blocked, slice(None))]
                    arr[(*b, slice(None), blocked, slice(None))] = round_to(
                        self.rng.normal(0, 3, part.shape), case.dtype
                    ).astype(np.float64)
                pert = Case(case.q, k, v, case.dtype, case.mask, case.causal, case.scale, case.label, flag=case.flag)
                m = moved(self.call(pert), (*b, ...), rows)
                if m is not None:
                    self.bug(
                        "padding-leak",
                        "the output changes when the K/V of keys the mask blocks change",
                        ev + f", with a mask; max change {m:.3g} (tolerance {tol:.2g})",
                    )
        pairs: list[tuple[str, tuple[Any, ...], tuple[Any, ...]]] = []
        if case.q.ndim == 4 and case.q.shape[0] > 1:
            pairs += [("batch element", (1,), (0,)), ("batch element", (0,), (1,))]
        if case.q.ndim >= 3 and case.q.shape[-3] > 1 and not case.gqa:
            heads = [(..., j, slice(None), slice(None)) for j in (0, 1)]
            pairs += [("head", heads[1], heads[0]), ("head", heads[0], heads[1])]
        for what, changed, watched in pairs:
            m = moved(self.call(self._perturbed(case, changed)), watched)
            if m is not None:
                self.bug(
                    "batch-leak",
                    f"the output of {what} {1 - _index(changed)} changes when only {what} {_index(changed)} changes",
                    ev + f" (layout {self.spec.layout}); max change {m:.3g} (tolerance {tol:.2g})",
                )
                break
        ones = Case(
            case.q,
            case.k,
            np.ones_like(case.v),
            case.dtype,
            case.mask,
            case.causal,
            case.scale,
            case.label,
            flag=case.flag,
        )
        res = self.call(ones)
        if res.ok and res.out.shape == out.shape:
            cmp = compare(res.out, np.ones(res.out.shape), self.ones_tolerance(case, res), rows)
            if not cmp.ok and not cmp.nonfinite:  # NaN says nothing about the normalization
                self.bug(
                    "not-normalized",
                    "with V = ones every output must be 1 (the weights of a row sum to 1); yours is not",
                    ev + f" with V = ones; max |out - 1| = {cmp.max_error:.3g}",
                )

    def compare_case(self, out: Outcome) -> bool:
        """Compare one outcome with the reference; on a mismatch diagnose it. Returns True when it matches."""
        case = out.case
        if not out.ok:
            return False
        self.examined = (self.case_key, case, out)
        golden, tol, rows = self.expected(case)
        cmp = compare(out.out, golden, tol, rows)
        if cmp.ok:
            if self.work_dtype(case.dtype) != case.dtype and self.compute != "auto":
                self.note(
                    "lower-precision",
                    f"compared under {self.compute}'s tolerance rule for {case.dtype} inputs, as declared "
                    f"(compute_dtype='{self.compute}')",
                    f"case {case.label}: {case.shapes()}",
                )
            return True
        if self.compute == "auto" and self.lower_seen is None and case.dtype == "float64":
            naive32 = naive_output(
                case.q, case.k, case.v, self.allowed(case), dtype="float32", scale=case.scale, gqa=self.gqa_map
            )
            cmp32 = compare(out.out, golden, bound("float32", golden, naive32), rows)
            if cmp32.ok:
                self.lower_seen = "float32"
                self.note(
                    "lower-precision",
                    "float64 inputs are computed in float32 (e.g. a softmax upcast to float32 and cast back): the "
                    "float64 cases are compared under float32's tolerance rule",
                    f"case {case.label}: {case.shapes()}; max |out - float64 reference| = {cmp.max_error:.3g}, "
                    f"beyond float64's bound {cmp.bound:.2g} and within float32's {cmp32.bound:.2g}",
                    "declare compute_dtype='input' to hold float64 inputs to float64's rule, or "
                    "compute_dtype='float32' to document it",
                )
                return True
        n_q, n_k = case.q.shape[-2], case.k.shape[-2]
        flag_only = self.causal_mode in ("flag", "only") and not self.causal_in_mask(case)
        if case.causal is not None and n_q != n_k and flag_only and self.spec.causal_value != "align":
            # a bool flag's alignment is the function's own (documented) choice; an alignment it was given is not
            other = "top_left" if case.causal == "bottom_right" else "bottom_right"
            g2, tol2, rows2 = self.expected(case, causal=other)
            if compare(out.out, g2, tol2, rows2 & rows).ok:
                self.align_seen = other
                names = {
                    "top_left": "top-left (PyTorch is_causal, JAX)",
                    "bottom_right": "bottom-right (FlashAttention, KV-cache decoding)",
                }
                leaks = (
                    _masks.causal(n_q, n_k, align=cast(_masks.Align, other))
                    & ~_masks.causal(n_q, n_k, align=cast(_masks.Align, case.causal))
                ).any()
                if self.spec.causal_align is not None:
                    # the declared alignment is the one the caller relies on (a decode step, a KV cache): either
                    # difference changes the output there, a looser mask leaks the future, a stricter one hides
                    # keys the query must see
                    what = (
                        "queries see keys in their declared future"
                        if leaks
                        else "queries miss keys the declared alignment lets them see"
                    )
                    self.bug(
                        "causal-alignment",
                        f"your function aligns its causal mask {names[other]}, not {names[case.causal]} as "
                        f"declared (causal_align='{case.causal}'): {what}",
                        f"case {case.label}: {case.shapes()}; n_q={n_q}, n_k={n_k}; query i sees keys "
                        + ("j <= i" if other == "top_left" else f"j <= i + {n_k - n_q}")
                        + f"; output matches causal='{other}'; the function's mask (first rows and keys):\n"
                        + indent(drawn(n_q, n_k, other)),
                    )
                else:
                    self.note(
                        "causal-alignment",
                        f"the causal mask is aligned {names[other]}",
                        f"case {case.label}: n_q={n_q}, n_k={n_k}; output matches causal='{other}'",
                        "declare causal_align to hold the function to one alignment",
                    )
                return True
        self.diagnose(case, out.out, cmp, rows)
        return False

    # ------------------------------------------------------------------------------------------------ preflight
    def preflight(self) -> None:
        """Find the dtypes and capabilities the function supports, with two attempts each."""
        self.unsupported = dict(self.backend.structural)
        base = [(lbl, g, req, ex) for lbl, g, req, ex in GRID if not req]
        for dtype in ("float64", "float32", "float16", "bfloat16"):
            if dtype in self.unsupported:
                continue
            self.case_key = f"preflight {dtype}"
            outs = [self.call(self.make(g, dtype, label=f"{lbl} {dtype}")) for lbl, g, _, _ in base]
            self._classify(dtype, outs, is_dtype=True)
        if not self.dtypes:
            raise ProbeAbort
        self.primary = self.dtypes[0]
        for cap in ("mask", "causal", "scale", "cross", "dv", "rank", "gqa", "causal-cross"):
            if cap in self.unsupported:
                continue
            if cap == "causal" and self.causal_mode == "mask" and "mask" in self.crashed:
                self.crashed[cap] = "needs the mask argument, which crashed on every attempt"
                continue
            if cap == "causal" and self.causal_mode == "mask" and "mask" in self.unsupported:
                self.unsupported[cap] = "no causal flag, and the mask is not supported"
                continue
            cases = [(lbl, g, ex) for lbl, g, req, ex in GRID if req and req[0] == cap]
            if any(r not in self.caps for lbl, g, req, ex in GRID if req and req[0] == cap for r in req[1:]):
                continue
            self.case_key = f"preflight {cap}"
            outs = [self.call(self.make(g, self.primary, label=lbl, **ex)) for lbl, g, ex in cases]
            self._classify(cap, outs)
        self.case_key = None

    def _classify(self, cap: str, outs: list[Outcome], *, is_dtype: bool = False) -> None:
        errs = [o for o in outs if o.error is not None]
        bad = [o for o in outs if o.returned.problem is not None]
        if not errs and not bad:
            self._supported(cap, outs, is_dtype)
            return
        if cap == "cross" and len(errs) == len(outs) and "mask" in self.caps and not self.crashed.get("mask"):
            # n_q != n_k fails without a mask: does it work with one (a default mask built (n_q, n_q))?
            g = next(g for lbl, g, req, _ in GRID if req == ("cross",))
            with_mask = self.call(self.make(g, self.primary, label="cross, with a mask", mask=np.ones((1,), bool)))
            if with_mask.ok:
                self.crash(
                    errs[0],
                    f"your function {_raised(errs[0].error)} on every call with n_q != n_k without a mask "
                    f"({self.backend.resolved.mask_arg or 'mask'}=None); it works with one",
                )
                self._supported(cap, [with_mask], is_dtype)
                return
        if len(errs) == len(outs) and all(self.refusal(cap, o.error) for o in errs):
            self.unsupported[cap] = f"refused on every attempt: {errs[0].error_text.splitlines()[0][:200]}"
            return
        if len(errs) + len(bad) < len(outs):  # it works on some inputs of this capability: keep testing it
            for o in errs:
                self.crash(o)
            self._supported(cap, outs, is_dtype)
            return
        first = errs[0] if errs else bad[0]
        if is_dtype and errs and "mask" not in self.unsupported:
            # no call without a mask worked: does the function need one?
            probe = self.make(GRID[0][1], cap, label=f"base {cap}, with a mask", mask=np.ones((1, 1, 1, 1), bool))
            with_mask = self.call(probe)
            if with_mask.ok:
                self.crash(
                    first,
                    f"your function {_raised(first.error)} on every call without a mask "
                    f"({self.backend.resolved.mask_arg or 'mask'}=None) in {cap}; it works with one",
                )
                self._supported(cap, [with_mask], is_dtype)
                return
        what = f"in {cap}" if is_dtype else _CAP_PHRASE[cap]
        reason = "crashed on every attempt (see the crash finding)"
        if errs:
            works = "" if is_dtype else " (it works without it)"
            self.crash(
                first,
                f"your function {_raised(first.error)} on every call {what}{works}; that is not a clean "
                "refusal (NotImplementedError, or an error whose message names what is unsupported)",
            )
        else:
            reason = "no usable return value on any attempt (see the crash finding)"
        self.crashed[cap] = reason

    def _supported(self, cap: str, outs: list[Outcome], is_dtype: bool) -> None:
        if is_dtype:
            self.dtypes.append(cap)
        else:
            self.caps.add(cap)
        self.grid.extend(o for o in outs if o.error is None)

    # ------------------------------------------------------------------------------------------------ probes
    @probe("reference")
    def p_reference(self) -> None:
        """The ``reference`` probe (see the module's table)."""
        for lbl, g, req, ex in COMBOS:
            if all(r in self.caps for r in req):
                self.grid.append(self.call(self.make(g, self.primary, label=lbl, **ex)))
        given = self.spec.causal_value == "align" and self.causal_mode == "flag"
        in_mask = self.causal_mode in ("mask", "flag") and self.mask_form == "full"
        if "causal-cross" in self.caps and (given or in_mask):
            # the alignment reaches the function (inside its mask, or as a string): it must follow either one
            other = "top_left" if (self.align or "bottom_right") == "bottom_right" else "bottom_right"
            with_mask = self.causal_mode == "flag" and not given
            if not with_mask or "mask" in self.caps:
                g = Geom(2, 2, 4, 9, 8, 8)
                label = f"causal+cross {other.replace('_', '-')}" + (" +mask" if with_mask else "")
                case = self.make(g, self.primary, label=label, causal=True, mask=with_mask, align=other)
                self.grid.append(self.call(case))
        for dtype in self.dtypes[1:]:
            if "causal" in self.caps:
                g = GRID[4][1]
                self.grid.append(self.call(self.make(g, dtype, label=f"causal {dtype}", causal=True)))
            if "mask" in self.caps:
                g = GRID[2][1]
                self.grid.append(self.call(self.make(g, dtype, label=f"mask {dtype}", mask=True)))
        for out in self.grid:
            self.case_key = self.key(out.case)
            if out.error is not None:
                self.crash(out)
                continue
            ok = self.compare_case(out)
            if out.case.label.startswith("base"):
                self.base_ok[out.case.dtype] = self.base_ok.get(out.case.dtype, True) and ok

    @probe("invariants")
    def p_invariants(self) -> None:
        """The ``invariants`` probe: returned weights keep the §21 invariants (see the module's table)."""
        if not self.returns_weights:
            raise ProbeSkip("the function returns no weights")
        wanted = ("causal+mask", "mask", "causal", "base")
        pick = None
        for label in wanted:
            pick = next((o for o in self.grid if o.case.label == label and o.ok and o.weights is not None), None)
            if pick is not None:
                break
        if pick is None:
            raise ProbeSkip("no call returned weights")
        case = pick.case
        self.case_key = self.key(case)
        allowed = self.allowed(case)
        q, k, v = case.q, self.expand(case.q, case.k), self.expand(case.q, case.v)
        w = pick.weights
        assert w is not None  # picked for its weights
        if w.shape != allowed.shape:
            self.bug(
                "reference-mismatch",
                f"the returned weights have shape {w.shape}; expected {allowed.shape}",
                f"case {case.label}: {case.shapes()}",
            )
            return
        o = pick.out
        work = self.work_dtype(case.dtype)
        if work != case.dtype and work in ("float32", "float16"):  # judged under the compute precision's tolerance
            w, o = w.astype(work), o.astype(work)
        for viol in check_arrays(q, k, v, w, o, allowed):
            ev = f"case {case.label}: {case.shapes()}; {viol.message}; at {list(viol.positions[:4])}"
            if viol.name == "masked-weight":
                future = case.causal is not None and any(
                    not _masks.causal(q.shape[-2], k.shape[-2], align=cast(_masks.Align, case.causal))[p[-2], p[-1]]
                    for p in viol.positions
                )
                if future:
                    self.bug("causal-leak", "your function gives weight to keys in a query's future", ev)
                else:
                    self.bug("padding-leak", "your function gives weight to keys the mask blocks", ev)
            elif viol.name == "row-sum":
                s0 = case.scale if case.scale is not None else 1 / math.sqrt(q.shape[-1])
                after = softmax(q @ np.swapaxes(k, -1, -2) * s0, -1) * allowed
                if np.allclose(w, after, atol=1e-4):
                    self.bug(
                        "mask-after-softmax",
                        "the mask is applied after the softmax: the weights of valid keys are not renormalized",
                        ev,
                    )
                else:
                    self.bug("not-normalized", "the returned weights of a row do not sum to 1", ev)
            else:
                self.bug("reference-mismatch", f"invariant {viol.name} does not hold", ev)

    @probe("normalization")
    def p_normalization(self) -> None:
        """The ``normalization`` probe: with V = ones every output is 1 (see the module's table)."""
        g = Geom(2, 2, 6, 6, 8, 5)
        dv = "dv" in self.caps
        if not dv:
            g = Geom(2, 2, 6, 6, 8, 8)
        case = self.make(g, self.primary, label="V = ones")
        case = Case(case.q, case.k, np.ones_like(case.v), case.dtype, None, case.causal, None, case.label)
        self.case_key = "normalization: V = ones"
        out = self.call(case)
        if not out.ok:
            self.crash(out)
            return
        self.compare_case(out)
        rows = self.allowed(case).any(axis=-1)
        cmp = compare(out.out, np.ones(out.out.shape), self.ones_tolerance(case, out), rows)
        if not cmp.ok and out.out.shape == (*case.q.shape[:-1], case.v.shape[-1]):
            sums = out.out[..., 0]
            self.bug(
                "not-normalized",
                "with V = ones every output must be 1 (the weights of a row sum to 1); yours is not",
                f"case {case.label}: {case.shapes()}; outputs range {np.nanmin(sums):.4g} .. {np.nanmax(sums):.4g}",
            )

    def _perturbed(self, case: Case, sel: Any, *, what: str = "qkv", value: float | None = None) -> Case:
        """``case`` with new values at index ``sel`` of q (queries), k and v (keys)."""
        q, k, v = case.q.copy(), case.k.copy(), case.v.copy()
        for name, arr in (("q", q), ("k", k), ("v", v)):
            if name not in what:
                continue
            idx = sel[name] if isinstance(sel, dict) else sel
            shape = arr[idx].shape
            new = self.rng.normal(0, 3, shape) if value is None else np.full(shape, value)
            arr[idx] = round_to(new, case.dtype).astype(np.float64)
        return Case(q, k, v, case.dtype, case.mask, case.causal, case.scale, case.label, flag=case.flag)

    @probe("causal")
    def p_causal(self) -> None:
        """The ``causal`` probe: changing future tokens moves no earlier output (see the module's table)."""
        if "causal" not in self.caps:
            raise ProbeSkip("needs causal")
        n = 8
        case = self.make(Geom(2, 2, n, n, 4, 4), self.primary, label="future", causal=True)
        base = self.base_call(case, "causal: future tokens")
        if base is None:
            return
        tol = FLOORS[case.dtype] * max(1.0, float(np.max(np.abs(base.out)))) * 4
        for t in (1, 4):
            sel = {
                "q": (..., slice(t + 1, None), slice(None)),
                "k": (..., slice(t + 1, None), slice(None)),
                "v": (..., slice(t + 1, None), slice(None)),
            }
            out = self.call(self._perturbed(case, sel))
            if not out.ok:
                self.crash(out)
                continue
            diff = _change(out.out[..., : t + 1, :], base.out[..., : t + 1, :])
            if not np.all(diff <= tol):
                idx = np.argwhere(~(diff <= tol))[0]
                self.bug(
                    "causal-leak",
                    f"query {int(idx[-2])} changes when tokens {t + 1}..{n - 1} (its future) change",
                    f"case {case.label}: {case.shapes()}, causal; max change {_largest(diff):.3g} in "
                    f"outputs of queries 0..{t} (tolerance {tol:.2g})",
                )
                return
        self.large_scores_causal(case)
        if "mask" in self.caps:
            self.future_within_mask()
            self.flag_and_mask_together()

    def future_within_mask(self) -> None:
        """Causal with a mask (per-sequence lengths of a KV cache, packed sequences, padding): for the first
        queries, change the K/V of keys that only later queries may see; their outputs must not move. A causal
        bound taken from the padded cache size instead of each sequence's length leaks exactly there."""
        g = Geom(2, 2, 4, 9, 4, 4) if "cross" in self.caps else Geom(2, 2, 8, 8, 4, 4)
        case = self.make(g, self.primary, label="future, with a mask", causal=True, mask=True)
        own = self.allowed(case)
        allowed = own
        for align in self.own_alignments(case)[1:]:  # the function's alignment is its own: the looser one counts
            allowed = allowed | self.allowed(case, causal=align)
        base = self.base_call(case, "causal: future tokens, with a mask")
        if base is None or base.out.shape != (*case.q.shape[:-1], case.v.shape[-1]):
            return
        tol = FLOORS[case.dtype] * max(1.0, float(np.max(np.abs(base.out[np.isfinite(base.out)]), initial=0))) * 4
        for t in (0, g.n_q // 2):
            later = allowed[..., t + 1 :, :].any(axis=-2) & ~allowed[..., : t + 1, :].any(axis=-2)  # [B, h, n_k]
            future = later.all(axis=1)  # [B, n_k]: keys no head's first queries may see (K/V heads are shared)
            for b in np.nonzero(future.any(axis=-1))[0]:  # one batch element at a time, its own rows watched
                out = self.call(self._perturbed(case, (b, slice(None), future[b], slice(None)), what="kv"))
                if not out.ok or out.out.shape != base.out.shape:
                    continue
                diff = _change(out.out[b, :, : t + 1, :], base.out[b, :, : t + 1, :])
                diff = np.where(own[b, :, : t + 1, :].any(axis=-1)[..., None], diff, 0.0)
                if not np.all(diff <= tol):
                    idx = np.argwhere(~(diff <= tol))[0]
                    lengths = np.asarray(case.mask.any(axis=-2))[:, 0].sum(axis=-1) if case.mask is not None else None
                    self.bug(
                        "causal-leak",
                        f"query {int(idx[-2])} of batch element {int(b)} changes when keys only later queries may "
                        "see change (its future, under a mask: a causal bound taken from the padded size instead "
                        "of each sequence's own length leaks there)",
                        f"case {case.label}: {case.shapes()}; valid keys per batch element "
                        f"{'' if lengths is None else lengths.tolist()}; max change {_largest(diff):.3g} in outputs "
                        f"of queries 0..{t} (tolerance {tol:.2g})",
                    )
                    return

    def flag_and_mask_together(self) -> None:
        """A causal flag and a mask in the same call (a full mask form, the causal part not in the mask): the
        function must apply both, or refuse the pair (PyTorch SDPA raises); silently dropping one is a leak."""
        if self.causal_mode != "flag" or self.mask_form != "full":
            return
        g = Geom(2, 2, 8, 8, 4, 4)
        logical = self.make(g, self.primary, label="mask and causal flag together", causal=True, mask=True)
        self.case_key = "causal: mask and causal flag together"
        out = self.call(replace(logical, causal=None, flag=True))  # square: both alignments are the same
        if out.timed_out:
            return
        ev = f"case {logical.label}: {logical.shapes()}; the causal flag set and a mask without the causal part"
        if out.error is not None:
            self.note(
                "causal-and-mask",
                "a causal flag together with a mask is refused (as PyTorch SDPA); the checker passes the causal part "
                "inside the mask then",
                ev + f"; {out.error_text.splitlines()[0][:200]}",
            )
            return
        if not out.ok:
            return
        golden, tol, rows = self.expected(logical)
        cmp = compare(out.out, golden, tol, rows)
        if not cmp.ok:  # the call made is not ``logical`` (its causal part went as the flag): no experiments
            self.diagnose(logical, out.out, cmp, rows, as_flag=True)

    def large_scores_causal(self, small: Case) -> bool:
        """The causal case ``small`` with scores of large magnitude (as :meth:`large_scores`): a finite causal fill
        (-1e4, -1e5, -1e9) then outscores the allowed keys, and the future's V moves the early outputs."""
        dtype = self.primary
        b, h, n, _ = small.q.shape
        d = 4
        a = 6000.0 if dtype == "float16" else 3e10
        c = 1.2 + 0.8 * np.argsort(self.rng.random((b, h, n)), axis=-1) / max(1, n - 1)
        q = round_to(np.full((b, h, n, d), a), dtype).astype(np.float64)
        k = round_to(np.broadcast_to(-c[..., None], (b, h, n, d)), dtype).astype(np.float64)
        v = round_to(self.rng.normal(0, 1, (b, h, n, d)), dtype).astype(np.float64)
        case = Case(q, k, v, dtype, small.mask, small.causal, None, "causal, large scores", flag=small.flag)
        self.case_key = "causal: large scores"
        base = self.call(case)
        if not base.ok or base.out.shape != (b, h, n, d):
            return False  # a range check refusing such scores: no evidence either way
        t = 1
        out = self.call(self._perturbed(case, {"v": (..., slice(t + 1, None), slice(None))}, what="v"))
        if not out.ok or out.out.shape != base.out.shape:
            return False
        d_ = _change(out.out[..., : t + 1, :], base.out[..., : t + 1, :])
        finite = np.abs(base.out[np.isfinite(base.out)])
        tol = FLOORS[dtype] * max(1.0, float(finite.max()) if finite.size else 1.0) * 4
        if not np.any(d_ > tol) or np.isinf(d_).any():
            return False
        lg = golden_logit_range(case)
        self.bug(
            "finite-fill",
            "future keys get weight once the scores are large: the V of tokens "
            f"{t + 1}..{n - 1} moves the outputs of queries 0..{t} when the allowed scores are about {lg[1]:.2g}; "
            "the causal mask fills with a finite value the scores exceed (such as -1e4, -1e5 or -1e9) instead of "
            "-inf or finfo(dtype).min",
            f"case {case.label}: {case.shapes()}, scores in [{lg[0]:.3g}, {lg[1]:.3g}]; changing the future V "
            f"moves earlier outputs by up to {_largest(d_):.3g} (tolerance {tol:.2g})",
        )
        return True

    @probe("padding")
    def p_padding(self) -> None:
        """The ``padding`` probe: what padded keys hold moves no valid output (see the module's table)."""
        if "mask" not in self.caps:
            raise ProbeSkip("needs mask")
        n = 6
        n_q = 5 if "cross" in self.caps else n  # rectangular where the function takes n_q != n_k
        lengths = np.array([n, 3])
        kp = _masks.key_padding(lengths, n)  # [B, 1, 1, n_k]
        case = self.make(Geom(2, 2, n_q, n, 4, 4), self.primary, label="key padding", mask=kp)
        base = self.base_call(case, "padding: key padding")
        if base is None:
            return
        rows = self.allowed(case).any(axis=-1)
        padded = (1, slice(None), slice(3, None), slice(None))  # batch 1, keys 3..5
        big = 1e10 if case.dtype in ("float64", "float32") else 1e3
        tol = FLOORS[case.dtype] * max(1.0, float(np.max(np.abs(base.out)))) * 4
        leaks: dict[str, tuple[float | None, Comparison]] = {}
        for what, value in (("large", big), ("random", None)):
            out = self.call(self._perturbed(case, {"k": padded, "v": padded}, what="kv", value=value))
            if not out.ok:
                self.crash(out)
                continue
            cmp = compare(out.out[1], base.out[1], tol, rows[1])  # the padded sequence's own valid outputs
            if not cmp.ok:
                leaks[what] = (value, cmp)
        for what, (value, cmp) in leaks.items():
            ev = (
                f"case {case.label}: {case.shapes()}, key lengths {lengths.tolist()}, padded K/V set to "
                f"{f'{value:g}' if value is not None else 'random values'}; "
                + (
                    f"{cmp.nonfinite} non-finite outputs"
                    if cmp.nonfinite
                    else f"max change {cmp.max_error:.3g} at {cmp.where} (tolerance {tol:.2g})"
                )
            )
            if what == "large" and "random" not in leaks and not cmp.nonfinite:  # blocked while scores are small
                self.bug(
                    "finite-fill",
                    "the output of valid positions changes when padded keys get scores of about "
                    f"{big:g}·q (their K set to {big:g}), and only then: the blocked scores are shifted by a finite "
                    "value (an additive mask such as (1 - mask) * -10000.0) instead of -inf or finfo(dtype).min",
                    ev,
                )
            else:
                self.bug(
                    "padding-leak",
                    f"the output of valid positions changes when the K/V of padded (masked) keys change ({what} "
                    "values)",
                    ev,
                )
            return
        if self.large_scores(kp):
            return
        out = self.call(self._perturbed(case, {"k": padded, "v": padded}, what="kv", value=math.nan))
        if out.ok and not np.all(np.isfinite(out.out[1][rows[1]])):
            self.note(
                "padding-nan",
                "NaN in the K/V of padded keys spreads into valid outputs (0 × NaN = NaN in weights @ V)",
                f"case {case.label}: {case.shapes()}, padded K/V set to NaN; PyTorch SDPA and NumPy behave the same",
                "make padded inputs finite (e.g. zeros) before attention; masking cannot remove a NaN from V",
            )

    def large_scores(self, kp: np.ndarray) -> bool:
        """Key padding ``kp`` with scores of large magnitude: allowed keys score about -1e11 (-1.4e4 to -2.4e4
        in float16), so a finite fill (-1e4, -1e9) outscores them, while -inf and finfo(dtype).min still block.
        Changing the V of the padded keys must not move the valid outputs. Returns True when it found a leak."""
        dtype = self.primary
        b, h, n_q, n_k, d = 2, 2, 5 if "cross" in self.caps else kp.shape[-1], kp.shape[-1], 4
        a = 6000.0 if dtype == "float16" else 3e10  # q = a; k = -c per key: scores = -a·c·d / sqrt(d)
        c = 1.2 + 0.8 * np.argsort(self.rng.random((b, h, n_k)), axis=-1) / max(1, n_k - 1)  # distinct per key
        q = np.full((b, h, n_q, d), a)
        k = np.broadcast_to(-c[..., None], (b, h, n_k, d))
        v = self.rng.normal(0, 1, (b, h, n_k, d))
        q, k, v = (round_to(x, dtype).astype(np.float64) for x in (q, k, v))
        case = Case(q, k, v, dtype, np.broadcast_to(kp, (b, h, n_q, n_k)).copy(), None, None, "large scores")
        self.case_key = "padding: large scores"
        base = self.call(case)
        if not base.ok:  # a function may refuse scores this large (a range check): no evidence either way
            return False
        padded = (1, slice(None), slice(3, None), slice(None))
        out = self.call(self._perturbed(case, {"v": padded}, what="v"))
        if not out.ok or out.out.shape != base.out.shape:
            return False
        rows = self.allowed(case).any(axis=-1)[1]
        d_ = np.where(rows[..., None], _change(out.out[1], base.out[1]), 0.0)
        finite = np.abs(base.out[1][np.isfinite(base.out[1])])
        tol = FLOORS[dtype] * max(1.0, float(finite.max()) if finite.size else 1.0) * 4
        if not np.any(d_ > tol) or np.isinf(d_).any():  # inf/NaN appearing is overflow, not a fill
            return False
        lg = golden_logit_range(case)
        self.bug(
            "finite-fill",
            "blocked keys get weight once the scores are large: the padded keys' V moves the valid outputs when the "
            f"allowed scores are about {lg[1]:.2g}; the mask fills with a finite value the scores exceed (such as "
            "-1e4 or -1e9) instead of -inf or finfo(dtype).min",
            f"case {case.label}: {case.shapes()}, key lengths {kp.sum(axis=-1).ravel().tolist()}, scores in "
            f"[{lg[0]:.3g}, {lg[1]:.3g}]; changing the padded keys' V moves valid outputs by up to "
            f"{_largest(d_):.3g} (tolerance {tol:.2g})",
        )
        return True

    @probe("masked-rows")
    def p_masked_rows(self) -> None:
        """The ``masked-rows`` probe: a query row with no allowed key (see the module's table)."""
        if "mask" not in self.caps:
            raise ProbeSkip("needs mask")
        g = Geom(2, 2, 4, 6, 4, 4) if "cross" in self.caps else Geom(2, 2, 6, 6, 4, 4)
        case = self.make(g, self.primary, label="fully masked row", mask=True)
        assert case.mask is not None  # mask=True
        m = case.mask.copy()
        form = self.mask_form
        if form in LENGTH_FORMS:  # a sequence with no valid key: every row of batch element 1
            m[1] = False
            sel: Any = (1, slice(None), 2)
            where = "batch element 1 has no valid key (length 0); its query 2"
        elif form == "batch":
            m[1, :, 2, :] = False
            sel = (1, slice(None), 2)
            where = "query 2 of batch element 1 (every head)"
        else:
            m[1, 0, 2, :] = False
            sel = (1, 0, 2)
            where = "query 2 of batch element 1, head 0"
        case = Case(case.q, case.k, case.v, case.dtype, m, case.causal, None, case.label, flag=case.flag)
        self.case_key = "masked-rows: fully masked row"
        out = self.call(case)
        ev = f"case {case.label}: {case.shapes()}; {where} may attend to no key"
        if out.error is not None:
            if getattr(self.spec, "masked_rows", "any") not in ("any", "raise"):
                self.bug(
                    "masked-row-policy",
                    f"a fully masked row raises an error; the declared policy is masked_rows='{self.spec.masked_rows}'",
                    ev + f"; {out.error_text.splitlines()[0][:200]}",
                )
                return
            self.note(
                "masked-row",
                "a fully masked row raises an error (a documented policy)",
                ev + f"; {out.error_text.splitlines()[0][:200]}",
            )
            return
        if not out.ok:
            self.crash(out)
            return
        row = out.out[sel]
        rows = self.allowed(case).any(axis=-1)
        policy = getattr(self.spec, "masked_rows", "any")
        if not np.all(np.isfinite(row)) and policy == "nan":
            self.note("masked-row", "a fully masked row comes back as NaN, as declared (masked_rows='nan')", ev)
        elif not np.all(np.isfinite(row)):
            self.bug(
                "masked-row-nan",
                "a query row whose keys are all masked comes back as NaN/inf",
                ev + f"; that output row holds {row.ravel()[~np.isfinite(row.ravel())][0]}",
            )
        else:
            tol = FLOORS[self.work_dtype(case.dtype)] * 8
            vexp = self.expand(case.q, case.v)
            uniform = np.mean(vexp, axis=-2)[sel[:-1]]
            if np.all(np.abs(row) <= tol):
                kind = "zeros (as FlashAttention and PyTorch SDPA)"
            elif np.all(np.abs(row - uniform) <= tol * max(1.0, np.max(np.abs(uniform))) * 10):
                kind = "the uniform average of V (as a finfo.min additive mask gives)"
            else:
                kind = "values that are neither zeros nor a uniform average (it attends as if that row were unmasked)"
            seen = "zeros" if kind.startswith("zeros") else "uniform" if kind.startswith("the uniform") else "other"
            if policy not in ("any", seen):
                self.bug(
                    "masked-row-policy",
                    f"a fully masked row comes back as {kind}; the declared policy is masked_rows='{policy}'",
                    ev,
                )
            else:
                self.note(
                    "masked-row", f"a fully masked row comes back as {kind}; a documented behaviour, not a bug", ev
                )
        golden, tol_g, _ = self.expected(case)
        cmp = compare(out.out, golden, tol_g, rows)
        if not cmp.ok:  # the other rows are wrong: name why, in this case
            self.diagnose(case, out.out, cmp, rows)
        if not cmp.ok and cmp.nonfinite:
            self.bug(
                "masked-row-nan",
                "a fully masked row spreads NaN/inf into rows that have allowed keys",
                ev + f"; {cmp.nonfinite} non-finite values in other rows",
            )
        if "masked-row-nan" not in self.findings and policy != "nan":
            self.masked_row_in_other_dtypes(case, sel, where)

    def masked_row_in_other_dtypes(self, first: Case, sel: Any, where: str) -> None:
        """The fully masked row of ``first`` in every other supported dtype: a fill that is finite in float32 can
        overflow to -inf in float16 (``-1e9``, ``-1e30``: 001 §7.2), and then the row is 0/0 = NaN there only."""
        for dtype in self.dtypes:
            if dtype == first.dtype:
                continue
            q, k, v = (round_to(x, dtype).astype(np.float64) for x in (first.q, first.k, first.v))
            case = replace(first, q=q, k=k, v=v, dtype=dtype, label=f"{first.label} {dtype}")
            self.case_key = f"masked-rows: fully masked row ({dtype})"
            out = self.call(case)
            if not out.ok or out.out.shape != (*first.q.shape[:-1], first.v.shape[-1]):
                continue  # a refusal or a crash in this dtype is the preflight's and the reference probe's
            row = out.out[sel]
            others = np.broadcast_to(self.allowed(case).any(axis=-1)[..., None], out.out.shape)
            if not np.all(np.isfinite(out.out[others])):
                continue  # the rows with keys are not finite either: not a masked-row matter (the reference's)
            if not np.all(np.isfinite(row)):
                self.bug(
                    "masked-row-nan",
                    f"a query row whose keys are all masked comes back as NaN/inf in {dtype} (finite in "
                    f"{first.dtype}): typically a fill of the blocked scores that overflows to -inf in {dtype} "
                    "(-1e9, -1e30)",
                    f"case {case.label}: {case.shapes()}; {where} may attend to no key; that output row holds "
                    f"{row.ravel()[~np.isfinite(row.ravel())][0]}",
                )
                return

    @probe("large-logits")
    def p_large_logits(self) -> None:
        """The ``large-logits`` probe: logits of about ±1000 (see the module's table)."""
        dts = [self.primary] + (["float32"] if "float32" in self.dtypes and self.primary != "float32" else [])
        dts = [d for d in dts if self.base_ok.get(d) is not False]
        if not dts:
            raise ProbeSkip("the ordinary base cases already differ from the reference")
        for dtype in dts:
            g = Geom(2, 2, 6, 6, 8, 8)
            pos = self.make(g, dtype, label="logits ~ +1000", std=20.0)
            neg = self.make(g, dtype, label="logits ~ -1000")
            qn = round_to(np.abs(self.rng.normal(0, 1, neg.q.shape)) * 20 + 5, dtype).astype(np.float64)
            kn = round_to(-np.abs(self.rng.normal(0, 1, neg.k.shape)) * 20 - 5, dtype).astype(np.float64)
            neg = Case(qn, kn, neg.v, dtype, None, neg.causal, None, neg.label)
            for case in (pos, neg):
                self.case_key = f"large-logits: {case.label} ({dtype})"
                out = self.call(case)
                if not out.ok:
                    self.crash(out)
                    continue
                golden, tol, rows = self.expected(case)
                # rounding the inputs moves logits of ~1000 by ~1000·eps: only gross errors count here
                tol = max(tol, 1e-3 * max(1.0, float(np.max(np.abs(golden)))))
                cmp = compare(out.out, golden, tol, rows)
                if not cmp.ok:
                    lg = golden_logit_range(case)
                    self.bug(
                        "unstable-softmax",
                        "large logits break your softmax (exp overflows to inf or underflows to 0)",
                        f"case {case.label}: {case.shapes()}; logits in [{lg[0]:.0f}, {lg[1]:.0f}]; "
                        + (
                            f"{cmp.nonfinite} non-finite outputs"
                            if cmp.nonfinite
                            else f"max |out - reference| = {cmp.max_error:.3g} (tolerance {cmp.bound:.2g})"
                        ),
                    )
                    return

    @probe("batch")
    def p_batch(self) -> None:
        """The ``batch`` probe: changing one batch element or head moves no other (see the module's table)."""
        g = Geom(3, 2, 5, 5, 4, 4)
        case = self.make(g, self.primary, label="batch")
        base = self.base_call(case, "batch: batch and head perturbation")
        if base is None:
            return
        if base.out.shape != (*case.q.shape[:-1], case.v.shape[-1]):
            return
        tol = FLOORS[case.dtype] * max(1.0, float(np.max(np.abs(base.out)))) * 4
        for what, sel, keep in (
            ("batch element 1", (1,), [(0,), (2,)]),
            ("batch element 0", (0,), [(1,), (2,)]),  # a loop that reuses element 0's K/V
            ("head 1", (slice(None), 1), [(slice(None), 0)]),
            ("head 0", (slice(None), 0), [(slice(None), 1)]),
        ):
            out = self.call(self._perturbed(case, sel))
            if not out.ok:
                self.crash(out)
                continue
            for kidx in keep:
                diff = _change(out.out[kidx], base.out[kidx])
                if not np.all(diff <= tol):
                    other = "batch element" if what.startswith("batch") else "head"
                    self.bug(
                        "batch-leak",
                        f"the output of {other} {kidx[-1]} changes when only {what} changes",
                        f"case {case.label}: {case.shapes()} (layout {self.spec.layout}); max change "
                        f"{_largest(diff):.3g} (tolerance {tol:.2g})",
                    )
                    return

    @probe("determinism")
    def p_determinism(self) -> None:
        """The ``determinism`` probe: the same call three times gives bitwise equal outputs."""
        first = next((o for o in self.grid if o.ok and o.case.label.startswith("base")), None)
        if first is None:
            raise ProbeSkip("no successful base call")
        self.case_key = self.key(first.case)
        for _ in range(2):
            out = self.call(first.case)
            if not out.ok:
                self.crash(out)
                return
            if out.out.shape != first.out.shape or not np.array_equal(out.out, first.out, equal_nan=True):
                diff = np.abs(out.out - first.out) if out.out.shape == first.out.shape else np.array([np.inf])
                self.bug(
                    "nondeterministic",
                    "the same inputs give different outputs from one call to the next",
                    f"case {first.case.label}: {first.case.shapes()}; max difference {float(np.nanmax(diff)):.3g} "
                    "between two identical calls",
                )
                return

    # ------------------------------------------------------------------------------------------------ run
    #: The name the preflight is reported under (a subclass, the gradient battery, has its own, and its own
    #: :attr:`probe_names`).
    preflight_name = "preflight"

    @property
    def probe_names(self) -> tuple[str, ...]:
        """The battery's probes, in order (:data:`~attnlab.checker.report.PROBES`)."""
        return PROBES

    def run_probe(self, name: str) -> None:
        """Run the probe ``name`` (raising :class:`ProbeSkip` or :class:`ProbeAbort` to stop it)."""
        PROBE_FUNCTIONS[name](self)

    def run(self) -> None:
        """Run the preflight, then every selected probe in order, recording results, findings and what could not
        be tested."""
        t0 = time.perf_counter()
        aborted = False
        self.current = self.preflight_name
        self.probe_codes = []
        try:
            self.preflight()
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
                self.preflight_name, status, self.runner.calls, time.perf_counter() - t0, codes=tuple(self.probe_codes)
            )
        )
        steps = [n for n in self.probe_names if n in self.selected]
        for name in self.probe_names:
            if name not in self.selected:
                continue
            if self.progress is not None:
                self.progress(f"probe {name}", 1 + steps.index(name), len(steps) + 1)
            if aborted:
                self.probe_results.append(ProbeResult(name, "not run", detail=self._stop_reason()))
                continue
            self.current = name
            self.case_key = None
            self.probe_codes = []
            calls0, t0 = self.runner.calls, time.perf_counter()
            status, detail = "passed", ""
            try:
                self.run_probe(name)
            except ProbeSkip as s:
                status, detail = "skipped", str(s)
            except ProbeAbort:
                aborted = True
                status, detail = "failed", self._stop_reason()
            if self.probe_codes:
                status = "failed"
            elif status == "failed":  # stopped before it saw anything: it did not run to the end
                status = "not run"
            self.probe_results.append(
                ProbeResult(
                    name,
                    status,
                    self.runner.calls - calls0,
                    time.perf_counter() - t0,
                    detail,
                    tuple(self.probe_codes),
                )
            )
        self.case_key = None
        self.shrink_findings()
        self._printed()
        self._completeness()

    def caller(self) -> Caller:
        """How :mod:`attnlab.checker.minimal` calls the function: through the runner, no finding recorded."""

        def call(case: Case) -> Outcome:
            passed, flag = self.as_passed(case, "bottom_right")
            out = self.runner.call(passed, causal_flag=flag, gqa=case.gqa)
            out.case = case
            return out

        backend = self.backend
        target = getattr(backend, "target", None) or getattr(getattr(backend, "adapter", None), "original", None)
        return Caller(
            call,
            self.expected,
            lambda c: self.as_passed(c, "bottom_right"),
            CallWords.of(backend.resolved, self.spec, target),
            self.gqa_map,
            self.mask_form,
            getattr(self.spec, "masked_rows", "any"),
            self.work_dtype,
        )

    def shrink_findings(self) -> None:
        """Shrink the first failing case of every reported finding (:func:`~attnlab.checker.minimal.minimal_case`,
        bounded per finding); the forward battery only, and only while calls can still be made."""
        if self.probe_names != PROBES:
            return
        bugs, _ = self.findings_list()
        caller = None
        for f in bugs:
            if f.code not in self.failing:
                continue
            case, first = self.failing[f.code]
            if self.runner.stopped is not None and f.code != "timeout":
                self.minimal[f.code] = unshrunk(case, f"no call is made after this: {self.runner.stopped}")
                continue
            caller = caller or self.caller()
            self.minimal[f.code] = minimal_case(f.code, case, first, caller, title=f"{f.code}: {f.message}")

    def _stop_reason(self) -> str:
        if self.runner.stopped is not None:
            return f"not run: {self.runner.stopped}"
        if not self.dtypes:
            return "not run: no dtype could be tested"
        return "not run"

    def _printed(self) -> None:
        """What the function wrote to stdout and stderr, as a note with the text (start and end)."""
        for name, cap in self.backend.output().items():
            if cap.total:
                self.current = "output"
                self.note(
                    "printed",
                    f"your function wrote {cap.total} byte{'s' if cap.total != 1 else ''} to {name} (captured; shown "
                    "here, not passed on)",
                    cap.text(600),
                )

    def _completeness(self) -> None:
        """The core probes that could not run for a capability the function has (the verdict is incomplete)."""
        has = {c: c not in self.unsupported for c in ("mask", "causal")}
        needed = {"reference": True, "causal": has["causal"], "padding": has["mask"], "masked-rows": has["mask"]}
        results = {p.name: p for p in self.probe_results}
        for name in CORE_PROBES:
            if not needed[name]:
                continue
            p = results.get(name)
            if p is None:
                self.incomplete.append(Unsupported(name, "not selected (probes=...)"))
            elif p.status in ("skipped", "not run"):
                reason = p.detail or "not run"
                cap = "mask" if name in ("padding", "masked-rows") else "causal"
                if p.status == "skipped" and cap in self.crashed:
                    reason = f"{cap}: {self.crashed[cap]}"
                elif not self.dtypes and all(d in self.unsupported for d in DTYPE_NAMES):
                    reason = (
                        "not run: no dtype could be tested ("
                        + "; ".join(f"{d}: {self.unsupported[d]}" for d in DTYPE_NAMES)
                        + ")"
                    )
                self.incomplete.append(Unsupported(name, reason))

    def unsupported_list(self) -> tuple[Unsupported, ...]:
        """The capabilities the function lacks (declared, structural, or crashed on), each with its reason."""
        out = [Unsupported(c, r) for c, r in self.unsupported.items() if c in CAPABILITIES]
        out += [Unsupported(c, r) for c, r in self.crashed.items() if c in CAPABILITIES and c not in self.unsupported]
        return tuple(out)

    def findings_list(self) -> tuple[tuple[Finding, ...], tuple[Finding, ...]]:
        """Bugs in a stable order, and the explained ones (each with ``explained_by``).

        A code is explained when every case it was seen in also shows a named bug that accounts for it:
        ``reference-mismatch`` by any diagnosis, the leaks and ``not-normalized`` by ``softmax-axis``,
        ``mask-after-softmax`` or ``mask-inverted``. The one exception: once the function is seen to be
        ``nondeterministic`` (in any case), the perturbation leaks are explained by it everywhere, since noise
        makes a perturbation experiment unable to tell a leak from chance.
        """
        by_case: dict[str, set[str]] = {}
        for o in self.obs:
            by_case.setdefault(o.case, set()).add(o.finding.code)

        def explainer(o: _Obs) -> str | None:
            code, seen = o.finding.code, by_case[o.case] - {o.finding.code}
            if code == "reference-mismatch":
                named = sorted(seen - set(NOT_DIAGNOSES), key=list(FIXES).index)
                return named[0] if named else None
            if code in LEAKS:
                for c in SPECIFIC:
                    if c in seen:
                        return c
            if code in PERTURBATION and noisy:
                # the one exception to "within the same case": noise invalidates the perturbation experiment
                # itself, and a repeated call can match bitwise by chance (dropout on a single key)
                return "nondeterministic"
            return None

        noisy = any(o.finding.code == "nondeterministic" for o in self.obs)

        kept: dict[str, Finding] = {}
        explained: dict[str, Finding] = {}
        for o in self.obs:
            why = explainer(o)
            if why is None:
                kept.setdefault(o.finding.code, o.finding)
            elif o.finding.code not in explained:
                f = o.finding
                explained[f.code] = Finding(f.code, f.message, f.evidence, f.fix, f.probe, f.severity, why)
        order = list(FIXES)
        bugs = sorted(kept.values(), key=lambda f: order.index(f.code))
        also = sorted((f for c, f in explained.items() if c not in kept), key=lambda f: order.index(f.code))
        return tuple(bugs), tuple(also)

    def report(self, target: str, backend: Any, started: float, detected: str, **fields: Any) -> Report:
        """The :class:`~attnlab.checker.report.Report` of this battery's run of ``target`` on ``backend`` (its
        framework, isolation and import time), begun at ``started`` (``time.perf_counter()``); ``fields`` are the
        report's fields that depend on the battery (``signature``, ``spec``, ``command`` ...)."""
        findings, explained = self.findings_list()
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


if tuple(PROBE_FUNCTIONS) != PROBES:  # the names the options accept are the probes defined above, in their order
    raise RuntimeError(f"attnlab.checker.report.PROBES {PROBES} != the @probe methods {tuple(PROBE_FUNCTIONS)}")


def _change(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``|a - b|`` where a NaN (or an infinity) that stays the same is no change, and a new one an infinite one."""
    with np.errstate(invalid="ignore", over="ignore"):
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        return np.where(same, 0.0, np.where(np.isfinite(a) & np.isfinite(b), np.abs(a - b), np.inf))


def _largest(d: np.ndarray) -> float:
    """The largest entry of a non-empty array of changes (inf when one is infinite)."""
    return float(np.max(d)) if d.size else 0.0


def _index(sel: tuple[Any, ...]) -> int:
    """The batch element or head an index ``(1,)`` / ``(..., 1, :, :)`` selects."""
    return next(i for i in sel if isinstance(i, int))


def _explains(out: np.ndarray, alt: np.ndarray, cmp: Comparison, rows: np.ndarray) -> float | None:
    """How closely ``alt`` explains ``out`` (max error), or None when it does not: within the case's bound and
    at least 10x closer than the reference; non-finite outputs must be non-finite exactly where ``alt`` is."""
    finite = np.isfinite(alt)
    if not finite.all():
        sel = np.broadcast_to(rows[..., None], out.shape)
        if not all(np.array_equal(f(out) & sel, f(alt) & sel) for f in (np.isposinf, np.isneginf, np.isnan)):
            return None
        c = compare(np.where(finite, out, 0.0), np.where(finite, alt, 0.0), cmp.bound, rows)
        return c.max_error if c.ok else None
    fin = np.abs(alt[np.isfinite(alt)])
    c = compare(out, alt, cmp.bound * max(1.0, float(fin.max()) if fin.size else 1.0), rows)  # large outputs
    if c.ok and (cmp.nonfinite > 0 or c.max_error * 10 <= cmp.max_error):
        return c.max_error
    return None


def _single(index: int, combined: str) -> str:
    """The message of bug ``index`` (0 or 1) of a combined explanation ``"your function ...; and ..."``."""
    first, _, second = combined.partition("; and ")
    return first if index == 0 else "your function " + second


def _raised(e: CallError | None) -> str:
    """``raised ValueError``, ``called sys.exit(3) (SystemExit)``, ``ended its process: ...``."""
    assert e is not None  # called for outcomes that raised
    if e.died:
        return f"ended the process it ran in ({e.message.split(';')[0]})"
    if e.type_name == "SystemExit":
        return f"called sys.exit({e.exit_status!r}) (SystemExit)"
    return f"raised {e.type_name}"


class ProbeSkip(Exception):
    """The probe needs a capability the function does not have."""


def golden_logit_range(case: Case, mapping: str = "interleave") -> tuple[float, float]:
    k = expand_kv(case.q, case.k, mapping)
    s0 = case.scale if case.scale is not None else 1 / math.sqrt(case.q.shape[-1])
    lg = case.q @ np.swapaxes(k, -1, -2) * s0
    return float(lg.min()), float(lg.max())
