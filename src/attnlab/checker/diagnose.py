"""Diagnosis of a wrong output: which named bug explains it, from the observations of one case.

:func:`compare_case` compares one outcome with the float64 reference under the tolerance rule; a mismatch is
explained by the first hypothesis of :mod:`attnlab.checker.hypotheses` whose output matches (:func:`diagnose`),
by a lower computing precision (:func:`lower_precision`), or else reported as ``reference-mismatch`` and followed
by perturbation experiments on that same case (:func:`experiments`), so that what they find is seen in it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .. import masks as _masks
from .adapters import round_to
from .cases import drawn, indent
from .evidence import fit_scale, precision
from .hypotheses import Context, outputs
from .runner import Case, Outcome
from .tolerance import FLOORS, Comparison, bound, compare, naive_output

if TYPE_CHECKING:
    from .outputs import Outputs
    from .session import Session

__all__ = [
    "EXPERIMENT_CASES",
    "compare_case",
    "diagnose",
    "experiments",
    "explains",
    "fitted_scale",
    "lower_precision",
    "moved",
    "ones_tolerance",
    "own_alignments",
]

#: How many mismatching cases no hypothesis explains get perturbation experiments of their own.
EXPERIMENT_CASES = 40


def compare_case(s: Session, out: Outcome) -> bool:
    """Compare one outcome with the reference; on a mismatch diagnose it. Returns True when it matches."""
    case = out.case
    if not out.ok:
        return False
    s.examined = (s.case_key, out)
    golden, tol, rows = s.expected(case)
    cmp = compare(out.out, golden, tol, rows)
    if cmp.ok:
        if s.work_dtype(case.dtype) != case.dtype and s.compute != "auto":
            s.note(
                "lower-precision",
                f"compared under {s.compute}'s tolerance rule for {case.dtype} inputs, as declared "
                f"(compute_dtype='{s.compute}')",
                f"case {case.label}: {case.shapes()}",
            )
        return True
    if s.compute == "auto" and s.lower_seen is None and case.dtype == "float64":
        naive32 = naive_output(
            case.q, case.k, case.v, s.allowed(case), dtype="float32", scale=case.scale, gqa=s.gqa_map
        )
        cmp32 = compare(out.out, golden, bound("float32", golden, naive32), rows)
        if cmp32.ok:
            s.lower_seen = "float32"
            s.note(
                "lower-precision",
                "float64 inputs are computed in float32 (e.g. a softmax upcast to float32 and cast back): the "
                "float64 cases are compared under float32's tolerance rule",
                f"case {case.label}: {case.shapes()}; max |out - float64 reference| = {cmp.max_error:.3g}, "
                f"beyond float64's bound {cmp.bound:.2g} and within float32's {cmp32.bound:.2g}",
                "declare compute_dtype='input' to hold float64 inputs to float64's rule, or "
                "compute_dtype='float32' to document it",
            )
            return True
    if other_alignment(s, case, out.out, rows):
        return True
    diagnose(s, case, out.out, cmp, rows)
    return False


def other_alignment(s: Session, case: Case, out: np.ndarray, rows: np.ndarray) -> bool:
    """A causal case with n_q != n_k whose output is that of the other alignment: a note when the alignment is the
    function's own choice (a bool flag), a ``causal-alignment`` bug when one was declared. True when it matched
    (the alignment seen is kept in ``s.align_seen``, the forward's structured result the gradients read)."""
    n_q, n_k = case.q.shape[-2], case.k.shape[-2]
    flag_only = s.causal_mode in ("flag", "only") and not s.causal_in_mask(case)
    if case.causal is not None and n_q != n_k and flag_only and s.spec.causal_value != "align":
        # a bool flag's alignment is the function's own (documented) choice; an alignment it was given is not
        other = "top_left" if case.causal == "bottom_right" else "bottom_right"
        g2, tol2, rows2 = s.expected(case, causal=other)
        if compare(out, g2, tol2, rows2 & rows).ok:
            s.align_seen = other
            names = {
                "top_left": "top-left (PyTorch is_causal, JAX)",
                "bottom_right": "bottom-right (FlashAttention, KV-cache decoding)",
            }
            leaks = (
                _masks.causal(n_q, n_k, align=cast(_masks.Align, other))
                & ~_masks.causal(n_q, n_k, align=cast(_masks.Align, case.causal))
            ).any()
            if s.spec.causal_align is not None:
                # the declared alignment is the one the caller relies on (a decode step, a KV cache): either
                # difference changes the output there, a looser mask leaks the future, a stricter one hides
                # keys the query must see
                what = (
                    "queries see keys in their declared future"
                    if leaks
                    else "queries miss keys the declared alignment lets them see"
                )
                s.bug(
                    "causal-alignment",
                    f"your function aligns its causal mask {names[other]}, not {names[case.causal]} as "
                    f"declared (causal_align='{case.causal}'): {what}",
                    f"case {case.label}: {case.shapes()}; n_q={n_q}, n_k={n_k}; query i sees keys "
                    + ("j <= i" if other == "top_left" else f"j <= i + {n_k - n_q}")
                    + f"; output matches causal='{other}'; the function's mask (first rows and keys):\n"
                    + indent(drawn(n_q, n_k, other)),
                )
            else:
                s.note(
                    "causal-alignment",
                    f"the causal mask is aligned {names[other]}",
                    f"case {case.label}: n_q={n_q}, n_k={n_k}; output matches causal='{other}'",
                    "declare causal_align to hold the function to one alignment",
                )
            return True
    return False


def diagnose(
    s: Session, case: Case, out: np.ndarray, cmp: Comparison, rows: np.ndarray, *, as_flag: bool = False
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
        s.bug(
            "reference-mismatch",
            f"your function returns shape {out.shape}; expected {exp_shape}",
            evidence + f"; layout {s.spec.layout}",
        )
        return
    what = (
        f"; {cmp.nonfinite} non-finite value(s) in rows that have allowed keys"
        if cmp.nonfinite
        else f"; max |out - reference| = {cmp.max_error:.3g} at {cmp.where} (tolerance {cmp.bound:.2g})"
    )
    evidence += what
    for held, rule in diagnosis_bounds(s, case, cmp):
        for align in own_alignments(s, case):
            if name_by_hypotheses(s, case, align, out, held, rows, evidence, rule, as_flag=as_flag):
                return
    if lower_precision(s, case, out, rows, evidence) or fitted_scale(s, case, out, cmp, evidence):
        return
    s.bug("reference-mismatch", "your function's output differs from the float64 reference", evidence)
    if not as_flag:
        experiments(s, case, out)


def diagnosis_bounds(s: Session, case: Case, cmp: Comparison) -> Iterator[tuple[Comparison, str]]:
    """The bounds a hypothesis must explain a mismatch to, tried in turn: the case's own, then (for float64
    inputs, no compute dtype declared: a float32 computation is only a note) float32's rule, computed only
    when the first found nothing."""
    yield cmp, ""
    if s.compute == "auto" and case.dtype == "float64" and cmp.nonfinite == 0:
        naive32 = naive_output(
            case.q, case.k, case.v, s.allowed(case), dtype="float32", scale=case.scale, gqa=s.gqa_map
        )
        b32 = bound("float32", s.expected(case)[0], naive32)
        if b32 > cmp.bound:
            yield replace(cmp, bound=b32), " (to float32's tolerance rule: computed in float32)"


def name_by_hypotheses(
    s: Session,
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
    in_mask = s.causal_in_mask(seen) and not as_flag
    ctx = Context.build(
        seen,
        out,
        s.allowed(seen),
        causal_in_mask=in_mask,
        alignment_received=in_mask or s.spec.causal_value == "align",
        inverted_text=inverted_text(s),
        gqa_map=s.gqa_map,
    )
    for code, message, alt in outputs(ctx):
        if alt.shape != out.shape:
            continue
        c = explains(out, alt, cmp, rows)
        if c is None:
            continue
        matched = evidence + f"; the output matches that explanation to {c:.2g}{rule}"
        if align != case.causal:
            matched += f" (with the function's own causal alignment, {str(align).replace('_', '-')})"
        if "+" in code:  # two bugs at once, each named (with the combination as its evidence)
            for i, part in enumerate(code.split("+")):
                s.bug(part, single(i, message), matched + f" ({message})")
            return True
        if code in ("scale-missing", "scale-wrong"):
            matched += f"; {fit_scale(seen, out, gqa=s.gqa_map, tol=cmp.bound).text}"
        s.bug(code, message, matched)
        return True
    return False


def lower_precision(s: Session, case: Case, out: np.ndarray, rows: np.ndarray, evidence: str) -> bool:
    """A ``precision`` bug: the error pattern is rounding to a lower dtype (:func:`attnlab.checker.evidence.precision`:
    its size, no structured explanation, a rounding pattern) and the output is right to that dtype's tolerance rule
    (computed in it, or an intermediate such as the weights rounded to it)."""
    golden, _, _ = s.expected(case)
    work = s.work_dtype(case.dtype)
    fit = precision(case, out, gqa=s.gqa_map, below=work)
    if not fit.dtype:
        return False
    low = fit.dtype
    naive = naive_output(case.q, case.k, case.v, s.allowed(case), dtype=low, scale=case.scale, gqa=s.gqa_map)
    c = compare(out, golden, bound(low, golden, naive), rows)
    if not c.ok:
        return False
    held = f"; compute_dtype='{s.compute}' holds {case.dtype} inputs to {work}'s rule" if s.compute != "auto" else ""
    s.bug(
        "precision",
        f"your function computes {case.dtype} inputs in {low} (or rounds an intermediate, such as the "
        f"weights before @ V, to {low}){held}",
        evidence + f"; within {low}'s tolerance rule ({c.bound:.2g}); {fit.text}",
    )
    return True


def fitted_scale(s: Session, case: Case, out: np.ndarray, cmp: Comparison, evidence: str) -> bool:
    """A ``scale-wrong`` bug named by the fitted scale (:func:`attnlab.checker.evidence.fit_scale`): one scalar,
    other than the expected one, explains the output within the tolerance."""
    fit = fit_scale(case, out, gqa=s.gqa_map, tol=cmp.bound)
    if not (fit.fits and fit.identifiable) or abs(fit.scale / fit.expected - 1) <= 1e-6:
        return False
    want = "1/sqrt(d_k)" if case.scale is None else f"the scale argument ({case.scale:g})"
    said = f"{fit.formula} = {fit.value:.6g}" if fit.formula else f"{fit.scale:.6g}, which matches no formula"
    s.bug("scale-wrong", f"your function scales the scores by {said}, instead of {want}", evidence + f"; {fit.text}")
    return True


def inverted_text(s: Session) -> str:
    return {
        "allow": "your function treats True as 'blocked' (the mask is read inverted; declared True = may attend)",
        "block": "your function treats True as 'may attend' (the mask is read inverted; declared True = blocked)",
        "keep": "your function treats 1 as 'masked' (the keep mask is read inverted)",
        "additive": "your function reads the additive mask inverted (0 blocks, the large negative value allows)",
    }[s.spec.mask_convention]


def ones_tolerance(s: Session, case: Case, out: Outcome) -> float:
    """How far from 1 an output with V = ones may be: the coarser of the case's working precision and the
    returned dtype, and float32's for float64 inputs unless a compute dtype is declared (an undeclared float32
    computation of float64 inputs is the ``lower-precision`` note, never a normalization bug)."""
    coarse = max(FLOORS[s.work_dtype(case.dtype)], FLOORS.get(out.returned.out_dtype or case.dtype, 0.0))
    if s.compute == "auto" and case.dtype == "float64":
        coarse = max(coarse, FLOORS["float32"])
    return coarse * 4


def own_alignments(s: Session, case: Case) -> tuple[str | None, ...]:
    """The causal alignments a mismatching ``case`` is diagnosed under: its own, and the other one too when the
    alignment is the function's own undeclared choice (a bool flag on a rectangular case), the one it was seen
    to use first."""
    n_q, n_k = case.q.shape[-2], case.k.shape[-2]
    own_choice = (
        case.causal is not None
        and n_q != n_k
        and s.spec.causal_align is None
        and s.spec.causal_value != "align"
        and s.causal_mode in ("flag", "only")
        and not s.causal_in_mask(case)
    )
    if not own_choice:
        return (case.causal,)
    other = "top_left" if case.causal == "bottom_right" else "bottom_right"
    return (other, case.causal) if s.align_seen == other else (case.causal, other)


def moved(new: Outcome, out: np.ndarray, idx: Any, tol: float, rows: np.ndarray | None = None) -> float | None:
    """How far ``new``'s output moved from ``out`` at ``idx`` beyond ``tol`` (None: not at all, or no output); a
    NaN that stays is no move, and only the ``rows`` that have allowed keys count."""
    if not new.ok or new.out.shape != out.shape:
        return None
    a, b = new.out[idx], out[idx]
    with np.errstate(invalid="ignore"):
        d = np.where((a == b) | (np.isnan(a) & np.isnan(b)), 0.0, np.abs(a - b))
    if rows is not None:
        d = np.where(rows[idx][..., None], d, 0.0)
    bad = d[~(d <= tol)]
    if not bad.size:
        return None
    finite = bad[np.isfinite(bad)]
    return float(finite.max()) if finite.size else math.inf


def experiments(s: Session, case: Case, out: np.ndarray) -> None:
    """Perturbation experiments on a mismatching case that no hypothesis explains, so that what they find is
    seen in this case: the same call repeated, its future tokens, its blocked keys, another batch element,
    another head, V = ones. At most :data:`EXPERIMENT_CASES` cases per run get them."""
    st = cast("Outputs", s.strategy)
    if st.experiments_left <= 0 or out.shape != (*case.q.shape[:-1], case.v.shape[-1]):
        return
    st.experiments_left -= 1
    finite = np.abs(out[np.isfinite(out)])
    tol = FLOORS[s.work_dtype(case.dtype)] * max(1.0, float(finite.max()) if finite.size else 1.0) * 4
    ev = f"case {case.label}: {case.shapes()}"
    again = s.call(case)
    if again.ok and (again.out.shape != out.shape or not np.array_equal(again.out, out, equal_nan=True)):
        s.bug("nondeterministic", "the same inputs give different outputs from one call to the next", ev)
    n_q, n_k = case.q.shape[-2], case.k.shape[-2]
    if case.causal is not None:
        off = n_k - n_q if case.causal == "bottom_right" else 0
        t = max(0, n_q // 2 - 1)
        if t + off + 1 < n_k:
            future = (..., slice(t + off + 1, None), slice(None))
            sel = {"q": (..., slice(t + 1, None), slice(None)), "k": future, "v": future}
            m = moved(s.call(s.perturbed(case, sel)), out, (..., slice(0, t + 1), slice(None)), tol)
            if m is not None:
                s.bug(
                    "causal-leak",
                    f"queries 0..{t} change when the tokens after them (their future) change",
                    ev + f", causal; max change {m:.3g} (tolerance {tol:.2g})",
                )
    blocked_keys(s, case, out, tol, ev)
    other_elements(s, case, out, tol, ev)
    res = s.call(replace(case, v=np.ones_like(case.v)))
    if res.ok and res.out.shape == out.shape:
        rows = s.allowed(case).any(axis=-1)
        cmp = compare(res.out, np.ones(res.out.shape), ones_tolerance(s, case, res), rows)
        if not cmp.ok and not cmp.nonfinite:  # NaN says nothing about the normalization
            s.bug(
                "not-normalized",
                "with V = ones every output must be 1 (the weights of a row sum to 1); yours is not",
                ev + f" with V = ones; max |out - 1| = {cmp.max_error:.3g}",
            )


def blocked_keys(s: Session, case: Case, out: np.ndarray, tol: float, ev: str) -> None:
    """The experiment on keys no query of any head of the last batch element may attend: changing their K/V must
    not move that element's outputs (the other elements are left out: a batch leak would confound them)."""
    allowed = s.allowed(case)
    if case.mask is None or allowed.ndim < 3:
        return
    b = (case.q.shape[0] - 1,) if case.q.ndim == 4 else ()
    blocked = ~allowed[b].any(axis=(-3, -2))  # [n_k]
    if not blocked.any():
        return
    k, v = case.k.copy(), case.v.copy()
    for arr in (k, v):
        part = arr[(*b, slice(None), blocked, slice(None))]
        arr[(*b, slice(None), blocked, slice(None))] = round_to(s.rng.normal(0, 3, part.shape), case.dtype).astype(
            np.float64
        )
    m = moved(s.call(replace(case, k=k, v=v)), out, (*b, ...), tol, allowed.any(axis=-1))
    if m is not None:
        s.bug(
            "padding-leak",
            "the output changes when the K/V of keys the mask blocks change",
            ev + f", with a mask; max change {m:.3g} (tolerance {tol:.2g})",
        )


def other_elements(s: Session, case: Case, out: np.ndarray, tol: float, ev: str) -> None:
    """The experiment on batch elements and heads: changing one must not move another's outputs."""
    pairs: list[tuple[str, tuple[Any, ...], tuple[Any, ...]]] = []
    if case.q.ndim == 4 and case.q.shape[0] > 1:
        pairs += [("batch element", (1,), (0,)), ("batch element", (0,), (1,))]
    if case.q.ndim >= 3 and case.q.shape[-3] > 1 and not case.gqa:
        heads = [(..., j, slice(None), slice(None)) for j in (0, 1)]
        pairs += [("head", heads[1], heads[0]), ("head", heads[0], heads[1])]
    for what, changed, watched in pairs:
        m = moved(s.call(s.perturbed(case, changed)), out, watched, tol)
        if m is not None:
            s.bug(
                "batch-leak",
                f"the output of {what} {1 - index(changed)} changes when only {what} {index(changed)} changes",
                ev + f" (layout {s.spec.layout}); max change {m:.3g} (tolerance {tol:.2g})",
            )
            return


def explains(out: np.ndarray, alt: np.ndarray, cmp: Comparison, rows: np.ndarray) -> float | None:
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


def single(index: int, combined: str) -> str:
    """The message of bug ``index`` (0 or 1) of a combined explanation ``"your function ...; and ..."``."""
    first, _, second = combined.partition("; and ")
    return first if index == 0 else "your function " + second


def index(sel: tuple[Any, ...]) -> int:
    """The batch element or head an index ``(1,)`` / ``(..., 1, :, :)`` selects."""
    return next(i for i in sel if isinstance(i, int))
