"""The reference probes: the grid against the float64 reference, the invariants of returned weights, V = ones."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

import numpy as np

from ... import masks as _masks
from ...invariants import check_arrays
from ..cases import COMBOS, GRID, Geom, softmax
from ..diagnose import ones_tolerance
from ..registry import ProbeSkip, probe
from ..runner import Case
from ..tolerance import compare

if TYPE_CHECKING:
    from ..session import Session

__all__ = ["invariants", "normalization", "reference"]


@probe("reference")
def reference(s: Session) -> None:
    """The ``reference`` probe (see the module's table)."""
    for lbl, g, req, ex in COMBOS:
        if all(r in s.caps for r in req):
            s.grid.append(s.call(s.make(g, s.primary, label=lbl, **ex)))
    given = s.spec.causal_value == "align" and s.causal_mode == "flag"
    in_mask = s.causal_mode in ("mask", "flag") and s.mask_form == "full"
    if "causal-cross" in s.caps and (given or in_mask):
        # the alignment reaches the function (inside its mask, or as a string): it must follow either one
        other = "top_left" if (s.align or "bottom_right") == "bottom_right" else "bottom_right"
        with_mask = s.causal_mode == "flag" and not given
        if not with_mask or "mask" in s.caps:
            g = Geom(2, 2, 4, 9, 8, 8)
            label = f"causal+cross {other.replace('_', '-')}" + (" +mask" if with_mask else "")
            case = s.make(g, s.primary, label=label, causal=True, mask=with_mask, align=other)
            s.grid.append(s.call(case))
    for dtype in s.dtypes[1:]:
        if "causal" in s.caps:
            g = GRID[4][1]
            s.grid.append(s.call(s.make(g, dtype, label=f"causal {dtype}", causal=True)))
        if "mask" in s.caps:
            g = GRID[2][1]
            s.grid.append(s.call(s.make(g, dtype, label=f"mask {dtype}", mask=True)))
    for out in s.grid:
        s.case_key = s.key(out.case)
        if out.error is not None:
            s.crash(out)
            continue
        ok = s.compare(out)
        if out.case.label.startswith("base"):
            s.base_ok[out.case.dtype] = s.base_ok.get(out.case.dtype, True) and ok


@probe("invariants")
def invariants(s: Session) -> None:
    """The ``invariants`` probe: returned weights keep the §21 invariants (see the module's table)."""
    if not s.returns_weights:
        raise ProbeSkip("the function returns no weights")
    wanted = ("causal+mask", "mask", "causal", "base")
    pick = None
    for label in wanted:
        pick = next((o for o in s.grid if o.case.label == label and o.ok and o.weights is not None), None)
        if pick is not None:
            break
    if pick is None:
        raise ProbeSkip("no call returned weights")
    case = pick.case
    s.case_key = s.key(case)
    allowed = s.allowed(case)
    q, k, v = case.q, s.expand(case.q, case.k), s.expand(case.q, case.v)
    w = pick.weights
    assert w is not None  # picked for its weights
    if w.shape != allowed.shape:
        s.bug(
            "reference-mismatch",
            f"the returned weights have shape {w.shape}; expected {allowed.shape}",
            f"case {case.label}: {case.shapes()}",
        )
        return
    o = pick.out
    work = s.work_dtype(case.dtype)
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
                s.bug("causal-leak", "your function gives weight to keys in a query's future", ev)
            else:
                s.bug("padding-leak", "your function gives weight to keys the mask blocks", ev)
        elif viol.name == "row-sum":
            s0 = case.scale if case.scale is not None else 1 / math.sqrt(q.shape[-1])
            after = softmax(q @ np.swapaxes(k, -1, -2) * s0, -1) * allowed
            if np.allclose(w, after, atol=1e-4):
                s.bug(
                    "mask-after-softmax",
                    "the mask is applied after the softmax: the weights of valid keys are not renormalized",
                    ev,
                )
            else:
                s.bug("not-normalized", "the returned weights of a row do not sum to 1", ev)
        else:
            s.bug("reference-mismatch", f"invariant {viol.name} does not hold", ev)


@probe("normalization")
def normalization(s: Session) -> None:
    """The ``normalization`` probe: with V = ones every output is 1 (see the module's table)."""
    g = Geom(2, 2, 6, 6, 8, 5)
    dv = "dv" in s.caps
    if not dv:
        g = Geom(2, 2, 6, 6, 8, 8)
    case = s.make(g, s.primary, label="V = ones")
    case = Case(case.q, case.k, np.ones_like(case.v), case.dtype, None, case.causal, None, case.label)
    s.case_key = "normalization: V = ones"
    out = s.call(case)
    if not out.ok:
        s.crash(out)
        return
    s.compare(out)
    rows = s.allowed(case).any(axis=-1)
    cmp = compare(out.out, np.ones(out.out.shape), ones_tolerance(s, case, out), rows)
    if not cmp.ok and out.out.shape == (*case.q.shape[:-1], case.v.shape[-1]):
        sums = out.out[..., 0]
        s.bug(
            "not-normalized",
            "with V = ones every output must be 1 (the weights of a row sum to 1); yours is not",
            f"case {case.label}: {case.shapes()}; outputs range {np.nanmin(sums):.4g} .. {np.nanmax(sums):.4g}",
        )
