"""The masked-rows probe: a query row with no allowed key follows one documented policy in every dtype."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..adapters import round_to
from ..cases import LENGTH_FORMS, Geom
from ..diagnose import diagnose
from ..registry import probe
from ..runner import Case
from ..tolerance import FLOORS, compare
from .common import require

if TYPE_CHECKING:
    from ..session import Session

__all__ = ["masked_row_in_other_dtypes", "masked_rows"]


@probe("masked-rows")
def masked_rows(s: Session) -> None:
    """The ``masked-rows`` probe: a query row with no allowed key (see the module's table)."""
    require(s, "mask")
    g = Geom(2, 2, 4, 6, 4, 4) if "cross" in s.caps else Geom(2, 2, 6, 6, 4, 4)
    case = s.make(g, s.primary, label="fully masked row", mask=True)
    assert case.mask is not None  # mask=True
    m = case.mask.copy()
    form = s.mask_form
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
    s.case_key = "masked-rows: fully masked row"
    out = s.call(case)
    ev = f"case {case.label}: {case.shapes()}; {where} may attend to no key"
    if out.error is not None:
        s.row_policy_seen = "raise"
        if getattr(s.spec, "masked_rows", "any") not in ("any", "raise"):
            s.bug(
                "masked-row-policy",
                f"a fully masked row raises an error; the declared policy is masked_rows='{s.spec.masked_rows}'",
                ev + f"; {out.error_text.splitlines()[0][:200]}",
            )
            return
        s.note(
            "masked-row",
            "a fully masked row raises an error (a documented policy)",
            ev + f"; {out.error_text.splitlines()[0][:200]}",
        )
        return
    if not out.ok:
        s.crash(out)
        return
    row = out.out[sel]
    rows = s.allowed(case).any(axis=-1)
    policy = getattr(s.spec, "masked_rows", "any")
    if not np.all(np.isfinite(row)):
        s.row_policy_seen = "nan"
    if not np.all(np.isfinite(row)) and policy == "nan":
        s.note("masked-row", "a fully masked row comes back as NaN, as declared (masked_rows='nan')", ev)
    elif not np.all(np.isfinite(row)):
        s.bug(
            "masked-row-nan",
            "a query row whose keys are all masked comes back as NaN/inf",
            ev + f"; that output row holds {row.ravel()[~np.isfinite(row.ravel())][0]}",
        )
    golden, tol_g, _ = s.expected(case)
    cmp = compare(out.out, golden, tol_g, rows)
    if np.all(np.isfinite(row)):
        finite_row(s, case, row, sel, ev, others_right=cmp.ok)
    if not cmp.ok:  # the other rows are wrong: name why, in this case
        diagnose(s, case, out.out, cmp, rows)
    if not cmp.ok and cmp.nonfinite:
        s.bug(
            "masked-row-nan",
            "a fully masked row spreads NaN/inf into rows that have allowed keys",
            ev + f"; {cmp.nonfinite} non-finite values in other rows",
        )
    if "masked-row-nan" not in s.findings and policy != "nan":
        masked_row_in_other_dtypes(s, case, sel, where)


def finite_row(s: Session, case: Case, row: np.ndarray, sel: Any, ev: str, *, others_right: bool) -> None:
    """A finite fully masked ``row``: zeros or the uniform average of V (a note, as ``masked_rows="any"``
    accepts); values that are neither, or a behaviour the declared ``masked_rows`` policy does not allow, are a
    ``masked-row-policy`` bug. Under ``"any"``, values that are neither while the case's other rows are wrong too
    are that bug's (diagnosed from those rows), not a second one."""
    policy = getattr(s.spec, "masked_rows", "any")
    tol = FLOORS[s.work_dtype(case.dtype)] * 8
    vexp = s.expand(case.q, case.v)
    uniform = np.mean(vexp, axis=-2)[sel[:-1]]
    if np.all(np.abs(row) <= tol):
        kind = "zeros (as FlashAttention and PyTorch SDPA)"
    elif np.all(np.abs(row - uniform) <= tol * max(1.0, np.max(np.abs(uniform))) * 10):
        kind = "the uniform average of V (as a finfo.min additive mask gives)"
    else:
        kind = "values that are neither zeros nor a uniform average"
        assert case.mask is not None  # the masked-rows case has a mask
        m = case.mask.copy()
        m[sel] = True
        unmasked, tol_u, _ = s.expected(replace(case, mask=m))
        if np.all(np.abs(row - unmasked[sel]) <= tol_u):
            kind += " (it attends to every key, as if that row were unmasked: what any finite fill gives)"
            s.unmasked_rows.add(s.case_key or "")
    seen = "zeros" if kind.startswith("zeros") else "uniform" if kind.startswith("the uniform") else "other"
    s.row_policy_seen = seen
    if policy == "any" and seen == "other" and not others_right:
        return  # the case is wrong beyond this row: the diagnosis of the other rows names it
    if seen == "other" or policy not in ("any", seen):
        allows = "an error, zeros or the uniform average of V" if policy == "any" else None
        s.bug(
            "masked-row-policy",
            f"a fully masked row comes back as {kind}; the declared policy is masked_rows='{policy}'"
            + (f", which allows {allows}" if allows else ""),
            ev,
        )
    else:
        s.note("masked-row", f"a fully masked row comes back as {kind}; a documented behaviour, not a bug", ev)


def masked_row_in_other_dtypes(s: Session, first: Case, sel: Any, where: str) -> None:
    """The fully masked row of ``first`` in every other supported dtype: a fill that is finite in float32 can
    overflow to -inf in float16 (``-1e9``, ``-1e30``: 001 §7.2), and then the row is 0/0 = NaN there only."""
    for dtype in s.dtypes:
        if dtype == first.dtype:
            continue
        q, k, v = (round_to(x, dtype).astype(np.float64) for x in (first.q, first.k, first.v))
        case = replace(first, q=q, k=k, v=v, dtype=dtype, label=f"{first.label} {dtype}")
        s.case_key = f"masked-rows: fully masked row ({dtype})"
        out = s.call(case)
        if not out.ok or out.out.shape != (*first.q.shape[:-1], first.v.shape[-1]):
            continue  # a refusal or a crash in this dtype is the preflight's and the reference probe's
        row = out.out[sel]
        others = np.broadcast_to(s.allowed(case).any(axis=-1)[..., None], out.out.shape)
        if not np.all(np.isfinite(out.out[others])):
            continue  # the rows with keys are not finite either: not a masked-row matter (the reference's)
        if not np.all(np.isfinite(row)):
            s.bug(
                "masked-row-nan",
                f"a query row whose keys are all masked comes back as NaN/inf in {dtype} (finite in "
                f"{first.dtype}): typically a fill of the blocked scores that overflows to -inf in {dtype} "
                "(-1e9, -1e30)",
                f"case {case.label}: {case.shapes()}; {where} may attend to no key; that output row holds "
                f"{row.ravel()[~np.isfinite(row.ravel())][0]}",
            )
            return
