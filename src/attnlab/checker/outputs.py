"""The output strategy of a session: what :func:`attnlab.check` compares (the output, and weights when returned).

:class:`Outputs` prepares nothing (a forward case is called as it is), checks each returned output's dtype,
computes the float64 golden output and its bound under the tolerance rule of :mod:`attnlab.checker.tolerance`,
compares and diagnoses (:mod:`attnlab.checker.diagnose`), and says which findings explain which. The gradient
strategy (:class:`attnlab.checker.gradients.Gradients`) has the same interface.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .cases import DTYPE_NAMES
from .diagnose import EXPERIMENT_CASES, compare_case
from .fixes import FIXES, LEAKS, NOT_DIAGNOSES, PERTURBATION, SPECIFIC
from .probes import PROBE_FUNCTIONS
from .report import CORE_PROBES, Finding, Unsupported
from .runner import CallRequest, Case, Outcome
from .tolerance import bound, compare, golden_output, naive_output

if TYPE_CHECKING:
    from .session import Observation, Session

__all__ = ["Outputs", "explain"]


def explain(
    obs: list[Observation], explainer: Callable[[Observation, set[str]], str | None], order: list[str]
) -> tuple[tuple[Finding, ...], tuple[Finding, ...]]:
    """The bugs seen in ``obs`` (first finding of each code), and the explained ones: ``explainer(o, seen)`` names
    the code that explains observation ``o`` given the other codes ``seen`` in its case, or None. Both sorted by
    ``order``; a code explained in one case and not in another is a bug."""
    by_case: dict[str, set[str]] = {}
    for o in obs:
        by_case.setdefault(o.case, set()).add(o.finding.code)
    kept: dict[str, Finding] = {}
    explained: dict[str, Finding] = {}
    for o in obs:
        why = explainer(o, by_case[o.case] - {o.finding.code})
        if why is None:
            kept.setdefault(o.finding.code, o.finding)
        elif o.finding.code not in explained:
            f = o.finding
            explained[f.code] = Finding(f.code, f.message, f.evidence, f.fix, f.probe, f.severity, why)
    bugs = sorted(kept.values(), key=lambda f: order.index(f.code))
    also = sorted((f for c, f in explained.items() if c not in kept), key=lambda f: order.index(f.code))
    return tuple(bugs), tuple(also)


class Outputs:
    """Compare the function's output with attnlab's float64 reference (see the module doc)."""

    name = "outputs"
    preflight_name = "preflight"
    probe_functions = PROBE_FUNCTIONS
    fixes = FIXES
    #: the alignment passed as ``causal_value="align"`` when a case has its causal part in a flag only
    default_align = "bottom_right"
    #: what large logits break, its code, and the share of the largest reference entry an error there may reach
    #: (the ``large-logits`` probe: rounding the inputs moves logits of ~1000 by ~1000·eps)
    softmax_words, unstable_code, unstable_rel = "softmax", "unstable-softmax", 1e-3

    def __init__(self) -> None:
        self.s: Any = None
        self.experiments_left = EXPERIMENT_CASES
        self.float32_oracle = False

    def bind(self, session: Session) -> None:
        """Attach this strategy to ``session`` (once, when the session is made)."""
        self.s = session

    def prepare(self, case: Case) -> Case:
        """The case as it is called (a forward case needs nothing more)."""
        return case

    def request(self, case: Case, causal_flag: bool | str, gqa: bool) -> CallRequest:
        """The request sent for ``case``."""
        return CallRequest(case.q, case.k, case.v, case.dtype, case.mask, causal_flag, case.scale, gqa)

    def after_call(self, case: Case, out: Outcome) -> None:
        """The output's dtype: the input's, or float32 for every input of an upcasting reference oracle (a note)."""
        s = self.s
        if out.ok and out.weights is not None:
            s.returns_weights = True
        dt = out.returned.out_dtype
        if not out.ok or dt is None:
            return
        if (
            dt == "float32"
            and case.dtype != "float32"
            and s.compute in ("auto", "float32")
            and (case.dtype == "float64" or self.float32_oracle)
        ):
            # a reference oracle that computes and returns float32 whatever it is given (xformers' ref_attention)
            self.float32_oracle = True
            if s.compute == "auto":
                s.lower_seen = "float32"
            s.note(
                "lower-precision",
                "the function computes and returns float32 for every input dtype (an upcasting reference oracle): "
                "float64 inputs are compared under float32's rule, and a float32 output is not a dtype bug",
                f"case {case.label}: {case.shapes()}; output dtype float32",
                "declare compute_dtype='input' to hold it to each input dtype",
            )
        elif dt != case.dtype:
            s.bug(
                "dtype",
                f"your function returns {dt} for {case.dtype} inputs",
                f"case {case.label}: {case.shapes()}; output dtype {dt}",
            )

    def expected(self, case: Case, *, causal: str | None = "same") -> tuple[np.ndarray, float, np.ndarray]:
        """The golden output, its bound under the tolerance rule, and which rows to compare ``[..., n_q]``."""
        s = self.s
        c = case.causal if causal == "same" else causal
        golden = golden_output(case.q, case.k, case.v, case.mask, scale=case.scale, causal=c, gqa=s.gqa_map)
        allowed = s.allowed(case, causal=c)
        work = s.work_dtype(case.dtype)
        naive = naive_output(case.q, case.k, case.v, allowed, dtype=work, scale=case.scale, gqa=s.gqa_map)
        return golden, bound(work, golden, naive), allowed.any(axis=-1)

    def compare(self, out: Outcome) -> bool:
        """Compare one outcome with the reference; on a mismatch diagnose it. Returns True when it matches."""
        return compare_case(self.s, out)

    def gross_error(self, out: Outcome, rel: float) -> str:
        """``""`` when ``out`` is within the reference's bound widened to ``rel`` of its largest entry; else what
        is wrong, in words (no diagnosis, no finding)."""
        golden, tol, rows = self.expected(out.case)
        cmp = compare(out.out, golden, max(tol, rel * max(1.0, float(np.max(np.abs(golden))))), rows)
        if cmp.ok:
            return ""
        if cmp.nonfinite:
            return f"{cmp.nonfinite} non-finite outputs"
        return f"max |out - reference| = {cmp.max_error:.3g} (tolerance {cmp.bound:.2g})"

    def findings(self) -> tuple[tuple[Finding, ...], tuple[Finding, ...]]:
        """Bugs in a stable order, and the explained ones (each with ``explained_by``).

        A code is explained when every case it was seen in also shows a named bug that accounts for it:
        ``reference-mismatch`` by any diagnosis, the leaks and ``not-normalized`` by ``softmax-axis``,
        ``mask-after-softmax`` or ``mask-inverted``. The one exception: once the function is seen to be
        ``nondeterministic`` (in any case), the perturbation leaks are explained by it everywhere, since noise
        makes a perturbation experiment unable to tell a leak from chance. And a fully masked row that attends to
        every key (``masked-row-policy``) is explained by a ``finite-fill`` seen in any case: ``s + c`` has the
        softmax of ``s`` for any finite ``c``.
        """
        noisy = any(o.finding.code == "nondeterministic" for o in self.s.obs)
        finite_fill = any(o.finding.code == "finite-fill" for o in self.s.obs)

        def explainer(o: Observation, seen: set[str]) -> str | None:
            code = o.finding.code
            if code == "reference-mismatch":
                named = sorted(seen - set(NOT_DIAGNOSES), key=list(FIXES).index)
                return named[0] if named else None
            if code in LEAKS:
                for c in SPECIFIC:
                    if c in seen:
                        return c
            if code == "masked-row-policy" and finite_fill and o.case in self.s.unmasked_rows:
                # a fully masked row that attends to every key is what the finite fill found elsewhere does to it
                return "finite-fill"
            if code in PERTURBATION and noisy:
                # the one exception to "within the same case": noise invalidates the perturbation experiment
                # itself, and a repeated call can match bitwise by chance (dropout on a single key)
                return "nondeterministic"
            return None

        return explain(self.s.obs, explainer, list(FIXES))

    def unsupported_extra(self) -> tuple[Unsupported, ...]:
        """Capabilities only this strategy has (none: the forward's are the session's)."""
        return ()

    def completeness(self) -> list[Unsupported]:
        """The core probes that could not run for a capability the function has (the verdict is incomplete)."""
        s = self.s
        has = {c: c not in s.unsupported for c in ("mask", "causal")}
        needed = {"reference": True, "causal": has["causal"], "padding": has["mask"], "masked-rows": has["mask"]}
        results = {p.name: p for p in s.probe_results}
        out = []
        for name in CORE_PROBES:
            if not needed[name]:
                continue
            p = results.get(name)
            if p is None:
                out.append(Unsupported(name, "not selected (probes=...)"))
            elif p.status in ("skipped", "not run"):
                reason = p.detail or "not run"
                cap = "mask" if name in ("padding", "masked-rows") else "causal"
                if p.status == "skipped" and cap in s.crashed:
                    reason = f"{cap}: {s.crashed[cap]}"
                elif not s.dtypes and all(d in s.unsupported for d in DTYPE_NAMES):
                    why = "; ".join(f"{d}: {s.unsupported[d]}" for d in DTYPE_NAMES)
                    reason = f"not run: no dtype could be tested ({why})"
                out.append(Unsupported(name, reason))
        return out
