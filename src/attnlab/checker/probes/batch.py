"""The batch/heads and determinism probes: one batch element or head moves no other; repeated calls agree."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..cases import Geom
from ..registry import ProbeSkip, probe
from ..tolerance import FLOORS
from .common import base_call, change, largest, repeated, report_leak

if TYPE_CHECKING:
    from ..session import Session

__all__ = ["batch", "determinism"]


@probe("batch")
def batch(s: Session) -> None:
    """The ``batch`` probe: changing one batch element or head moves no other (see the module's table)."""
    g = Geom(3, 2, 5, 5, 4, 4)
    case = s.make(g, s.primary, label="batch")
    base = base_call(s, case, "batch: batch and head perturbation")
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
        out = s.call(s.perturbed(case, sel))
        if not out.ok:
            s.crash(out)
            continue
        for kidx in keep:
            diff = change(out.out[kidx], base.out[kidx])
            if not np.all(diff <= tol):
                other = "batch element" if what.startswith("batch") else "head"
                found = f"max change {largest(diff):.3g}"
                message = f"the output of {other} {kidx[-1]} changes when only {what} changes"
                report_leak(s, "batch-leak", message, case, found, tol, where=f" (layout {s.spec.layout})")
                return


@probe("determinism")
def determinism(s: Session) -> None:
    """The ``determinism`` probe: the same call three times gives bitwise equal outputs."""
    first = next((o for o in s.grid if o.ok and o.case.label.startswith("base")), None)
    if first is None:
        raise ProbeSkip("no successful base call")
    s.case_key = s.key(first.case)
    for _ in range(2):
        if not repeated(s, first):
            return
