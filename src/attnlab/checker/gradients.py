"""The gradient strategy of a session: what ``check(fn, backward=...)`` and ``check_backward`` compare.

:class:`Gradients` prepares each case with an upstream gradient ``d_out`` (and, when asked, a dropout keep mask
or a bias), sends them with the request (with the golden ``out`` and ``lse`` for a flash backward without a
forward), checks each gradient's dtype, computes the float64 golden gradients
(:func:`~attnlab.checker.gradient_oracle.golden_grads`) and their bounds under FlashAttention's rule for gradients,
compares and diagnoses by the named mistakes of :mod:`attnlab.checker.grad_hypotheses`. The session, the
preflight, the calls and the report are those of :func:`attnlab.check`: only what is compared differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .adapters import round_to
from .depends import wrong_entries
from .grad_hypotheses import Variant, attention_grads, fitted_dv_lse, fitted_lse, hypotheses
from .gradient_oracle import (
    BACKWARD_CODES,
    GRAD_CAPABILITIES,
    GRAD_FIXES,
    GRADS,
    GradCase,
    GradReturned,
    golden_grads,
    golden_out_lse,
    grad_bound,
)
from .outputs import explain
from .probes import GRAD_PROBE_FUNCTIONS
from .report import CORE_GRAD_PROBES, Finding, Unsupported
from .runner import CallRequest, Case, Outcome
from .tolerance import bound, compare, golden_output, naive_output

if TYPE_CHECKING:
    from .session import Observation, Session

__all__ = ["DIAGNOSED_CASES", "ForwardSeen", "Gradients", "diagnose_grads"]

#: Mismatching cases diagnosed (the hypotheses are recomputed for each), at most.
DIAGNOSED_CASES = 16

_ORDER = [*BACKWARD_CODES, "reference-mismatch", "crash", "timeout", "dtype", "mutates-input", "output-type"]
_GENERIC = ("grad-mismatch",)


@dataclass(frozen=True)
class ForwardSeen:
    """What the output session of the same check saw the forward do, which its gradients are held to.

    ``align``: the causal alignment of a bool flag when n_q != n_k and none is declared (``align_seen``);
    ``row_policy``: what a fully masked row came back as (``row_policy_seen``: ``"uniform"`` lets the gradients
    of such a row be those of a softmax at uniform weights, ``"nan"`` makes NaN gradients there the forward's
    ``masked-row-nan``, not a second bug); ``lower``: the lower precision float64 inputs were computed in
    (``lower_seen``, e.g. a softmax upcast to float32 only), so float64 gradients are judged under its rule.
    """

    align: str | None = None
    row_policy: str | None = None
    lower: str | None = None


class Gradients:
    """Compare the function's gradients with attnlab's analytic float64 backward (see the module doc).

    ``kind``: ``autograd`` (the function is a forward, differentiated by its library), ``plain`` or ``flash``;
    ``with_forward``: a flash backward checked with its own forward; ``seen``: what the forward was seen to do in
    the same check (:class:`ForwardSeen`; the alignment defaults to top-left); ``forward_checked``: the forward
    was checked in the same run (its first finding's code, or True), so a wrong forward output is its finding and
    explains the gradient findings of that case.
    """

    name = "gradients"
    preflight_name = "grad-preflight"
    probe_functions = GRAD_PROBE_FUNCTIONS
    fixes = GRAD_FIXES
    default_align = "top_left"
    softmax_words = "backward's softmax: its lse or P is recomputed without the row maximum"
    #: gradients at logits of ~1000 carry q and k of ~20 through dS: a correct float32 kernel is off by ~1e-3 of the
    #: largest entry, an overflowing one by all of it (zeros, inf or NaN)
    unstable_code, unstable_rel = "grad-lse", 0.05

    def __init__(
        self,
        *,
        lse_units: str = "nats",
        kind: str = "plain",
        with_forward: bool = False,
        seen: ForwardSeen | None = None,
        forward_checked: bool | str = False,
    ):
        self.s: Any = None
        self.seen = seen or ForwardSeen()
        self.nan_rows: set[str] = set()  # cases whose NaN gradients are the forward's NaN fully masked rows
        self.kind = kind
        self.has_forward = kind == "autograd" or with_forward
        self.golden_lse = kind in ("flash", "backward") and not with_forward
        self.forward_wrong: set[str] = set()
        self.forward_checked = bool(forward_checked)
        #: the forward finding that explains gradient codes of a case whose forward output is wrong
        self.forward_code = forward_checked if isinstance(forward_checked, str) else "reference-mismatch"
        self.diagnosed = 0
        self.matched: list[tuple[str, str, Any]] = []  # hypotheses that explained a case, tried first next time
        self.lse_units = lse_units

    def bind(self, session: Session) -> None:
        """Attach this strategy to ``session``: causal=True with n_q != n_k is top-left unless declared (or, through
        autograd, what the forward was seen to do); a lower compute precision the forward was seen to use is the
        gradients' too (unless ``compute_dtype`` is declared)."""
        self.s = session
        session.align = session.spec.causal_align or self.seen.align or "top_left"
        if session.compute == "auto" and self.seen.lower is not None:
            session.lower_seen = self.seen.lower

    def prepare(self, case: Case) -> GradCase:
        """``case`` with a random ``d_out`` (a gradient case is called as it is)."""
        return self.grad_case(case)

    def request(self, case: Case, causal_flag: bool | str, gqa: bool) -> CallRequest:
        """The request sent for ``case``: with ``d_out``, dropout, bias, and the golden ``out`` and ``lse`` for a
        flash backward without a forward."""
        g = cast(GradCase, case)
        out = lse = None
        if self.golden_lse:
            out, lse = golden_out_lse(g, self.s.gqa_map)
            if self.lse_units == "log2":
                lse = lse / math.log(2)
        return CallRequest(
            g.q, g.k, g.v, g.dtype, g.mask, causal_flag, g.scale, gqa, g.d_out, g.keep, g.dropout_p, g.bias, out, lse
        )

    def after_call(self, case: Case, out: Outcome) -> None:
        """Each gradient in its input's dtype."""
        ret = out.returned
        if out.ok and isinstance(ret, GradReturned):
            for name, dt in ret.dtypes.items():
                if dt != case.dtype:
                    self.s.bug(
                        "dtype",
                        f"your function returns {name} in {dt} for {case.dtype} inputs",
                        f"case {case.label}: {case.shapes()}; {name} dtype {dt}",
                    )
                    break

    def compare(self, out: Outcome) -> bool:
        """Compare one outcome's gradients with the golden (diagnosed when they differ)."""
        return self.compare_grads(out)

    def gross_error(self, out: Outcome, rel: float) -> str:
        """``""`` when every gradient of ``out`` is within its bound widened to ``rel`` of the golden's largest
        entry; else what is wrong, in words (no diagnosis, no finding)."""
        ret = out.returned
        if not isinstance(ret, GradReturned):
            return "no gradients returned"
        case = cast(GradCase, out.case)
        golden, bounds = self.expected(case, work=self.grad_work(case, ret))
        wide = {n: max(b, rel * max(1.0, float(np.max(np.abs(golden[n]))))) for n, b in bounds.items()}
        return "; ".join(wrong_parts(self.mismatch(ret.grads, golden, wide, case)))

    def bounds(self, case: Case) -> dict[str, float]:
        """Each gradient's bound for ``case`` under its dtype's rule (a reproduction's ``TOL``)."""
        return cast(dict[str, float], self.expected(case)[1])

    def first_wrong(self, out: Outcome, limit: int = 5) -> tuple[str, ...]:
        """The first wrong entries of the gradients of ``out`` that break their bound, in words."""
        ret = out.returned
        if not out.ok or not isinstance(ret, GradReturned):
            return ()
        case = cast(GradCase, out.case)
        golden, bounds = self.expected(case, work=self.grad_work(case, ret))
        rows = self.s.allowed(case).any(axis=-1)
        found: list[str] = []
        for name in self.mismatch(ret.grads, golden, bounds, case):
            a, e = ret.grads[name], golden[name]
            if a.size != e.size:
                found.append(f"{name} has shape {a.shape}, expected {e.shape}")
                continue
            r = rows if name == "dq" else np.ones(e.shape[:-1], bool)
            found += [w.text for w in wrong_entries(a.reshape(e.shape), e, r, bounds[name], limit=limit, name=name)]
        return tuple(found[:limit])

    def findings(self) -> tuple[tuple[Finding, ...], tuple[Finding, ...]]:
        """Bugs in a stable order, and the explained ones: ``grad-mismatch`` seen in a case where a named code is
        seen too, and (``explained_by="reference-mismatch"``) any gradient code in a case whose forward output was
        already wrong."""
        leaky = any(o.finding.code == "grad-batch-leak" for o in self.s.obs)

        def explainer(o: Observation, seen: set[str]) -> str | None:
            code = o.finding.code
            if code in _GENERIC:
                named = [c for c in _ORDER if c in seen and (c in BACKWARD_CODES or c == "mutates-input")]
                named = [c for c in named if c not in _GENERIC]
                if named:
                    return named[0]
            if code in ("grad-mismatch", "grad-masked-row") and leaky:
                # a gradient that mixes batch elements or heads is wrong in every case with B > 1 or h > 1, and
                # no per-case hypothesis expresses it (as nondeterminism explains the forward's perturbation leaks)
                return "grad-batch-leak"
            if o.case in self.forward_wrong and code in BACKWARD_CODES and "forward" not in o.case:
                return self.forward_code
            if code == "grad-masked-row" and o.case in self.nan_rows:
                return "masked-row-nan"
            return None

        return explain(self.s.obs, explainer, _ORDER)

    def unsupported_extra(self) -> tuple[Unsupported, ...]:
        """The gradient-only capabilities the function lacks (``dropout``, ``bias``)."""
        return tuple(Unsupported(c, r) for c, r in self.s.unsupported.items() if c in GRAD_CAPABILITIES)

    def completeness(self) -> list[Unsupported]:
        """The core gradient probes that could not run (the verdict is incomplete)."""
        results = {p.name: p for p in self.s.probe_results}
        out = []
        for name in CORE_GRAD_PROBES:
            if name != "grad-reference" and "mask" in self.s.unsupported:
                continue
            p = results.get(name)
            if p is None:
                out.append(Unsupported(name, "not selected (probes=...)"))
            elif p.status in ("skipped", "not run"):
                out.append(Unsupported(name, p.detail or "not run"))
        return out

    def grad_case(
        self,
        case: Case,
        *,
        keep: np.ndarray | None = None,
        dropout_p: float = 0.0,
        bias: bool | np.ndarray = False,
    ) -> GradCase:
        """``case`` with a random ``d_out`` in its dtype (and a bias when asked and supported)."""
        if isinstance(case, GradCase):
            return case
        shape = (*case.q.shape[:-1], case.v.shape[-1])
        d_out = round_to(self.s.rng.normal(0, 1, shape), case.dtype).astype(np.float64)
        b = None
        if isinstance(bias, np.ndarray):
            b = bias
        elif bias and "bias" not in self.s.unsupported:
            full = (*case.q.shape[:-2], case.q.shape[-2], case.k.shape[-2])
            b = round_to(self.s.rng.normal(0, 1, full), case.dtype).astype(np.float64)
        vals = {f.name: getattr(case, f.name) for f in fields(Case)}
        return GradCase(**vals, d_out=d_out, keep=keep, dropout_p=dropout_p, bias=b)

    def grad_work(self, case: Case, ret: GradReturned) -> str:
        """The precision the gradients are held to: the input's, or a lower one they were returned in (a ``dtype``
        bug, reported as such: the values are compared under that dtype's rule)."""
        work = self.s.work_dtype(case.dtype)
        rank = {"float64": 3, "float32": 2, "float16": 1, "bfloat16": 0}
        for dt in ret.dtypes.values():
            if dt in rank and rank[dt] < rank[work]:
                work = dt
        return work

    def expected(self, case: Case, *, causal: str | None = "same", work: str | None = None) -> Any:
        """The golden gradients and each one's bound under FlashAttention's gradient rule."""
        c = case.causal if causal == "same" else causal
        g = cast(GradCase, case if c == case.causal else replace(case, causal=c))
        golden = golden_grads(g, self.s.gqa_map)
        work = work or self.s.work_dtype(g.dtype)
        naive = self.case_grads(g, dtype=work)  # the right backward, every step rounded to the work dtype
        bounds = {n: grad_bound(work, want, naive[n]) for n in GRADS if (want := golden.get(n)) is not None}
        return golden, bounds

    def case_grads(self, case: GradCase, variant: Variant | None = None, dtype: str = "float64") -> dict[str, Any]:
        """The gradients of ``case`` under ``variant`` (None: the right backward), every step rounded to ``dtype``."""
        return attention_grads(
            case.q,
            case.k,
            case.v,
            case.d_out,
            case.mask,
            causal=case.causal,
            scale=case.scale,
            bias=case.bias,
            keep=case.keep,
            dropout_p=case.dropout_p,
            mapping=self.s.gqa_map,
            variant=variant,
            dtype=dtype,
        )

    def compare_grads(self, out: Outcome, *, diagnose: bool = True) -> bool:
        """Compare one outcome's gradients (and, with a forward, its output) with the golden; diagnose a mismatch."""
        if not out.ok or not isinstance(out.returned, GradReturned):
            return False
        case = cast(GradCase, out.case)
        key = self.s.case_key or self.s.key(case)
        self.s.examined = (self.s.case_key, out)  # a finding from here on is about this call
        ret = out.returned
        if out.mutated:  # seen in this case too: the gradients were computed from the written-over inputs
            self.s.bug(
                "mutates-input",
                f"your function writes into its input{'s' if len(out.mutated) > 1 else ''} {', '.join(out.mutated)}",
                f"case {case.label}: {case.shapes()}; {', '.join(out.mutated)} differ after the call",
                case=key,
            )
        if self.other_alignment(case, ret):
            return True
        if self.has_forward and ret.out is not None and case.keep is None:
            gout = golden_output(
                case.q, case.k, case.v, case.mask, scale=case.scale, causal=case.causal, gqa=self.s.gqa_map
            )
            if case.bias is None and ret.out.shape == gout.shape:
                # the forward's rule, with room: this only tells a wrong forward from a wrong backward
                work = self.s.work_dtype(case.dtype)
                allowed = self.s.allowed(case)
                naive = naive_output(case.q, case.k, case.v, allowed, dtype=work, scale=case.scale, gqa=self.s.gqa_map)
                tol = 10 * bound(work, gout, naive)
                rows = allowed.any(axis=-1)
                if not compare(ret.out, gout, tol, rows).ok:
                    self.forward_wrong.add(key)
                    if not self.forward_checked:  # nobody else looks at this forward: say it is wrong
                        self.s.bug(
                            "reference-mismatch",
                            "the forward's output differs from the float64 reference",
                            f"case {case.label}: {case.shapes()}",
                        )
        golden, bounds = self.expected(case, work=self.grad_work(case, ret))
        bad = self.mismatch(ret.grads, golden, bounds, case)
        if not bad:
            return True
        if self.kind != "autograd" or key not in self.forward_wrong:
            if diagnose and diagnose_grads(self.s, case, ret.grads, bounds, bad, self.matched):
                return False
            if diagnose and self.diagnosed < DIAGNOSED_CASES:
                self.diagnosed += 1
                if diagnose_grads(self.s, case, ret.grads, bounds, bad):
                    return False
        self.s.bug(
            "grad-mismatch", "your function's gradients differ from the float64 golden", self.evidence(case, bad)
        )
        return False

    def other_alignment(self, case: GradCase, ret: GradReturned) -> bool:
        """A causal case with n_q != n_k whose gradients (and forward output) are all those of the other alignment,
        when none is declared: a note, as the forward's (the function is causal the other way, consistently)."""
        n_q, n_k = case.q.shape[-2], case.k.shape[-2]
        told = self.s.causal_mode == "mask" or self.s.spec.causal_value == "align"  # the alignment was passed in
        if case.causal is None or n_q == n_k or self.s.spec.causal_align is not None or told:
            return False
        other = "top_left" if case.causal == "bottom_right" else "bottom_right"
        alt = replace(case, causal=other)
        golden, bounds = self.expected(alt, work=self.grad_work(case, ret))
        if self.mismatch(ret.grads, golden, bounds, alt):
            return False
        if self.has_forward and ret.out is not None:
            gout = golden_output(case.q, case.k, case.v, case.mask, scale=case.scale, causal=other, gqa=self.s.gqa_map)
            if ret.out.shape != gout.shape or not compare(ret.out, gout, bounds["dq"] * 10 + 1e-6).ok:
                return False
        mine, _ = self.expected(case)
        if not self.mismatch(ret.grads, mine, bounds, case):
            return False  # both alignments agree here: nothing to tell
        names = {"top_left": "top-left (PyTorch is_causal)", "bottom_right": "bottom-right (FlashAttention)"}
        self.s.note(
            "causal-alignment",
            f"the backward's causal mask is aligned {names[other]} (no causal_align declared; causal=True is "
            f"compared as {names[case.causal]} otherwise)",
            f"case {case.label}: n_q={n_q}, n_k={n_k}; the gradients match causal='{other}'",
            "declare causal_align to hold the function to one alignment",
        )
        return True

    def mismatch(
        self, grads: dict[str, np.ndarray], golden: dict[str, Any], bounds: dict[str, float], case: GradCase
    ) -> dict[str, Any]:
        """The gradients that break their bound: name -> Comparison (shape mismatches have max_error inf)."""
        rows = self.s.allowed(case).any(axis=-1)
        bad: dict[str, Any] = {}
        for name in ("dq", "dk", "dv", "dbias"):
            if golden.get(name) is None or name not in grads:
                continue
            a = grads[name]
            e = golden[name]
            if a.shape != e.shape and a.size == e.size and name == "dbias":
                a = a.reshape(e.shape)
            if name == "dq":
                c = compare(a, e, bounds[name], rows)
            else:
                c = compare(a, e, bounds[name])
            if not c.ok:
                bad[name] = c
        return bad

    def evidence(self, case: GradCase, bad: dict[str, Any]) -> str:
        """The evidence line of a gradient mismatch: the case, and each wrong gradient's error and where."""
        ev = f"case {case.label}: {case.shapes()}"
        if case.mask is not None:
            ev += ", with a mask"
        if case.causal is not None:
            ev += f", causal ({case.causal.replace('_', '-')})"
        if case.keep is not None:
            ev += f", dropout p={case.dropout_p:g}"
        return ev + "; " + "; ".join(wrong_parts(bad))


def wrong_parts(bad: dict[str, Any]) -> list[str]:
    """Each wrong gradient of ``bad`` (name -> Comparison) in words: its error and where, or what is wrong."""
    parts = []
    for name, c in bad.items():
        if c.max_error == math.inf:
            parts.append(f"{name} has the wrong shape")
        elif c.nonfinite:
            parts.append(f"{name} has {c.nonfinite} non-finite value(s)")
        else:
            parts.append(f"max |{name} - golden| = {c.max_error:.3g} at {c.where} (tolerance {c.bound:.2g})")
    return parts


def diagnose_grads(
    s: Session,
    case: GradCase,
    grads: dict[str, np.ndarray],
    bounds: dict[str, float],
    bad: dict[str, Any],
    only: list[tuple[str, str, Any]] | None = None,
) -> bool:
    """Recompute the gradients under each named mistake (``only`` those) and report the first that explains
    every gradient."""
    if any(c.max_error == math.inf for c in bad.values()):
        return False
    n_q, n_k = case.q.shape[-2], case.k.shape[-2]
    allowed = s.allowed(case)
    cands = (
        only
        if only is not None
        else hypotheses(
            n_q,
            n_k,
            h=case.q.shape[-3],
            h_kv=case.k.shape[-3],
            masked=not bool(allowed.all()),
            causal=case.causal,
            dropout=case.keep is not None,
            flash=s.grads.kind == "flash",
            explicit_scale=case.scale is not None,
        )
    )
    rows = allowed.any(axis=-1)
    refit = only is None or any(v.lse == "shifted" for _, _, v in only)
    cands = [c for c in cands if c[2].lse != "shifted"]  # a fitted lse belongs to the case it was fitted on
    if refit and grads.get("dq") is not None:  # a wrong lse of any kind: fitted from dq, row by row
        right = s.grads.case_grads(case)
        cands = [*cands, *fitted_lse(right["dq"], grads["dq"], rows)]
        if "dq" not in bad and "dv" in bad and case.keep is None and case.k.shape[-3] == case.q.shape[-3]:
            cands = [*cands, *fitted_dv_lse(right["p"], case.d_out, grads["dv"], rows)]  # only dV's P wrong
    worst = max(c.max_error for c in bad.values() if c.max_error < math.inf) if bad else 0.0
    for code, text, var in cands:
        if var.transposed and n_q != n_k:
            continue
        if var.p_causal is not None and var.causal_added != (case.causal is None):
            continue  # a causal hypothesis for a causal case, an added causal mask for one without
        alt = s.grads.case_grads(case, var)
        ok = True
        err = 0.0
        naive_alt = None
        work = s.work_dtype(case.dtype)
        for name, a in grads.items():
            e = alt.get(name)
            if e is None or name not in bounds:
                continue
            if a.shape != e.shape:
                ok = False
                break
            tol = bounds[name]
            if work != "float64":  # the mistake made in the same precision: its own rounding error
                if naive_alt is None:
                    naive_alt = s.grads.case_grads(case, var, work)
                tol = max(tol, grad_bound(work, e, naive_alt[name]))
            c = compare(a, e, tol, rows if name == "dq" else None)
            if not c.ok:
                ok = False
                break
            err = max(err, c.max_error)
        if ok and (err * 10 <= worst or any(c.nonfinite for c in bad.values())):
            if (code, text, var) not in s.grads.matched:
                s.grads.matched.append((code, text, var))
            if code == "grad-lse" and s.grads.kind != "flash" and not s.grads.has_forward:
                text += " (the backward recomputes its own lse)"
            s.bug(
                code,
                text,
                s.grads.evidence(case, bad) + f"; the gradients match that explanation to {err:.2g}",
            )
            return True
    return False
