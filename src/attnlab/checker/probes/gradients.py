"""The gradient probes on the grid, batch elements and heads, and dropout (the table in
:mod:`attnlab.checker.gradient_oracle`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypedDict, cast

import numpy as np

from ..adapters import round_to
from ..cases import Geom
from ..gradient_oracle import GradReturned
from ..registry import ProbeSkip, probe
from .common import grad_pairs, report_leak

if TYPE_CHECKING:
    from ..session import Session

__all__ = ["COMBOS", "eliminate", "grad_batch", "grad_dropout", "grad_reference"]


class Flags(TypedDict, total=False):
    """The keywords of :meth:`~attnlab.checker.session.Session.make` a combination sets."""

    causal: bool
    mask: bool


#: The combinations the grad-reference probe adds once the capabilities they need are known to work.
COMBOS: list[tuple[str, Geom, tuple[str, ...], Flags]] = [
    ("causal+mask", Geom(2, 2, 13, 13, 5, 7), ("causal", "mask", "dv"), {"causal": True, "mask": True}),
    ("mask+cross", Geom(2, 2, 5, 8, 8, 8), ("mask", "cross"), {"mask": True}),
    ("mask+cross-2", Geom(2, 3, 7, 4, 4, 4), ("mask", "cross"), {"mask": True}),
    ("causal+cross", Geom(1, 2, 6, 11, 8, 8), ("causal", "cross", "causal-cross"), {"causal": True}),
    ("gqa+causal", Geom(2, 4, 9, 9, 8, 6, h_kv=2), ("gqa", "causal"), {"causal": True}),
    ("gqa+mask", Geom(1, 6, 5, 7, 4, 4, h_kv=3), ("gqa", "mask", "cross"), {"mask": True}),
    ("long", Geom(1, 2, 45, 70, 16, 16), ("cross",), {}),
    ("long-causal", Geom(1, 1, 67, 67, 8, 8), ("causal",), {"causal": True}),
    ("long-mask", Geom(1, 1, 37, 37, 8, 8), ("mask",), {"mask": True}),
    ("odd", Geom(2, 3, 11, 11, 5, 5), (), {}),
]


@probe("grad-reference")
def grad_reference(s: Session) -> None:
    """The ``grad-reference`` probe: gradients on the grid in every dtype, mismatches diagnosed (see the
    module's table)."""
    for lbl, g, req, ex in COMBOS:
        if all(r in s.caps for r in req):
            s.grid.append(s.call(s.make(g, s.primary, label=lbl, **ex)))
    if "bias" not in s.unsupported:
        g0 = Geom(2, 2, 6, 9, 8, 8)
        base = s.make(g0, s.primary, label="bias", mask=("mask" in s.caps))
        s.grid.append(s.call(s.grads.grad_case(base, bias=True)))
    if "causal-cross" in s.caps and (s.causal_mode == "mask" or s.spec.causal_value == "align"):
        # the function can be told either alignment: both are checked
        for n_q, n_k in ((4, 9), (9, 5)):
            base = s.make(Geom(2, 2, n_q, n_k, 8, 8), s.primary, label=f"causal both alignments {n_q}x{n_k}")
            for align in ("top_left", "bottom_right"):
                if align == "bottom_right" and n_q > n_k:
                    continue  # rows with no key: the masked-rows probe's business
                case = replace(base, causal=align, label=f"causal {align.replace('_', '-')} {n_q}x{n_k}")
                s.grid.append(s.call(case))
    for dtype in s.dtypes[1:]:
        if "causal" in s.caps:
            s.grid.append(s.call(s.make(Geom(2, 2, 6, 6, 8, 8), dtype, label=f"causal {dtype}", causal=True)))
        if "mask" in s.caps:
            s.grid.append(s.call(s.make(Geom(2, 3, 9, 9, 4, 4), dtype, label=f"mask {dtype}", mask=True)))
        if "gqa" in s.caps:
            s.grid.append(s.call(s.make(Geom(1, 4, 6, 6, 8, 8, h_kv=2), dtype, label=f"gqa {dtype}")))
    results: list[tuple[Any, bool, str | None]] = []
    for out in s.grid:
        s.case_key = s.key(out.case)
        if out.error is not None:
            s.crash(out)
            continue
        results.append((out.case, s.grads.compare_grads(out), s.case_key))
        s.base_ok[out.case.dtype] = s.base_ok.get(out.case.dtype, True) and results[-1][1]
    # a feature whose cases alone fail, with nothing named: the backward's handling of that feature is wrong
    for code, has, text in (
        ("grad-causal", lambda c: c.causal is not None, "the backward's causal masking"),
        ("grad-gqa-sum", lambda c: c.gqa, "the backward's GQA (K/V heads shared by query groups)"),
    ):
        eliminate(s, results, code, has, text)


def eliminate(s: Session, results: list[tuple[Any, bool, str | None]], code: str, has: Any, text: str) -> None:
    """Name ``code`` in the cases that have a feature (``has``) and fail with only ``grad-mismatch``, when
    every case without the feature passed: the difference is the feature."""
    seen: dict[str | None, set[str]] = {}
    for o in s.obs:
        seen.setdefault(o.case, set()).add(o.finding.code)
    without = [ok for c, ok, _ in results if not has(c)]
    failing = [(c, key) for c, ok, key in results if has(c) and not ok and seen.get(key) == {"grad-mismatch"}]
    if len(without) < 3 or not all(without) or not failing:
        return
    for c, key in failing:
        s.bug(
            code,
            f"{text} is wrong: every case without it matches the golden, the cases with it do not (no single "
            "named mistake explains them)",
            f"case {c.label}: {c.shapes()}; {len(without)} cases without it match",
            case=key,
        )


@probe("grad-batch")
def grad_batch(s: Session) -> None:
    """The ``grad-batch`` probe: changing one batch element or head moves no other one's gradients."""
    g = Geom(2, 2, 5, 7, 4, 4)
    base = s.grads.grad_case(s.make(g, s.primary, label="batch", mask=("mask" in s.caps)))
    s.case_key = s.key(base)
    out = s.call(base)
    if not out.ok:
        s.crash(out)
        return
    s.grads.compare_grads(out)
    ret = cast(GradReturned, out.returned)  # an ok call of the gradient battery returned its gradients
    _, bounds = s.expected(base)
    for axis, what, changed in ((0, "batch element", 1), (0, "batch element", 0), (1, "head", 1), (1, "head", 0)):
        sel = (slice(changed, changed + 1),) if axis == 0 else (slice(None), slice(changed, changed + 1))
        q, k, v, do = (x.copy() for x in (base.q, base.k, base.v, base.d_out))
        for x in (q, k, v, do):
            x[sel] = round_to(s.rng.normal(0, 1, x[sel].shape), base.dtype)
        moved = s.call(replace(base, q=q, k=k, v=v, d_out=do))
        if not moved.ok or not isinstance(moved.returned, GradReturned):
            continue
        other = 1 - changed
        keep0 = (slice(other, other + 1),) if axis == 0 else (slice(None), slice(other, other + 1))
        for name, a, b in grad_pairs(ret, moved.returned):
            if a.ndim < 2:  # no batch and head axes to pick
                continue
            a, b = a[keep0], b[keep0]
            finite = np.isfinite(a) & np.isfinite(b)
            flipped = bool((np.isfinite(a) != np.isfinite(b)).any())  # a value became (or stopped being) NaN
            diff = np.where(finite, np.abs(np.where(finite, a, 0.0) - np.where(finite, b, 0.0)), 0.0)
            largest = float(diff.max(initial=0.0))
            if flipped or largest > bounds[name]:  # NaN in both runs alike is the reference probe's finding
                moved_by = "non-finite values appeared or vanished" if flipped else f"moved by {largest:.3g}"
                message = f"changing one {what} changes the gradients of another ({name})"
                found = f"{what} {changed} changed, {name} of {what} {other} {moved_by}"
                report_leak(s, "grad-batch-leak", message, base, found, bounds[name])
                return


@probe("grad-dropout")
def grad_dropout(s: Session) -> None:
    """The ``grad-dropout`` probe: with a given dropout mask, the gradients match the reference's through it."""
    if "dropout" in s.unsupported:
        raise ProbeSkip(s.unsupported["dropout"])
    p = 0.25
    cases: tuple[tuple[str, Geom, Flags], ...] = (
        ("dropout", Geom(2, 2, 6, 6, 8, 8), {"mask": "mask" in s.caps}),
        ("dropout+causal", Geom(1, 2, 7, 7, 4, 6), {"causal": "causal" in s.caps}),
    )
    for lbl, g, ex in cases:
        base = s.make(g, s.primary, label=lbl, **ex)
        keep = s.rng.random((*base.q.shape[:-2], base.q.shape[-2], base.k.shape[-2])) >= p
        case = s.grads.grad_case(base, keep=keep, dropout_p=p)
        s.case_key = s.key(case)
        out = s.call(case)
        if not out.ok:
            s.crash(out)
            continue
        ok = s.grads.compare_grads(out)
        # right without dropout (the reference grid passed), wrong with the keep mask: the dropout differs
        ref = next((r for r in s.probe_results if r.name == "grad-reference"), None)
        codes = {o.finding.code for o in s.obs if o.case == s.case_key}
        if not ok and ref is not None and ref.status == "passed" and codes == {"grad-mismatch"}:
            s.bug(
                "grad-dropout",
                "the gradients are right without dropout and wrong with the keep mask: the backward's dropout "
                "differs from the forward's (another mask, or another scaling)",
                f"case {case.label}: {case.shapes()}, dropout p={p:g}",
            )
