"""The precision probes: logits of large magnitude must not overflow or underflow the softmax, forward or backward."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..adapters import round_to
from ..cases import Geom
from ..registry import ProbeSkip, probe
from ..runner import Case
from .common import golden_logit_range

if TYPE_CHECKING:
    from ..session import Session

__all__ = ["large_logits"]


@probe("grad-large-logits")
@probe("large-logits")
def large_logits(s: Session) -> None:
    """The ``large-logits`` probe: logits of about ±1000 (see the module's table); as ``grad-large-logits`` the
    same cases hold the gradients to the golden (a backward that recomputes lse or P without the row maximum)."""
    dts = [s.primary] + (["float32"] if "float32" in s.dtypes and s.primary != "float32" else [])
    dts = [d for d in dts if s.base_ok.get(d) is not False]
    if not dts:
        raise ProbeSkip("the ordinary base cases already differ from the reference")
    for dtype in dts:
        g = Geom(2, 2, 6, 6, 8, 8)
        pos = s.make(g, dtype, label="logits ~ +1000", std=20.0)
        neg = s.make(g, dtype, label="logits ~ -1000")
        qn = round_to(np.abs(s.rng.normal(0, 1, neg.q.shape)) * 20 + 5, dtype).astype(np.float64)
        kn = round_to(-np.abs(s.rng.normal(0, 1, neg.k.shape)) * 20 - 5, dtype).astype(np.float64)
        neg = Case(qn, kn, neg.v, dtype, None, neg.causal, None, neg.label)
        for case in (pos, neg):
            s.case_key = f"large-logits: {case.label} ({dtype})"
            out = s.call(case)
            if not out.ok:
                s.crash(out)
                continue
            wrong = s.strategy.gross_error(out, s.strategy.unstable_rel)  # only gross errors count here
            if wrong:
                lg = golden_logit_range(case)
                s.bug(
                    s.strategy.unstable_code,
                    f"large logits break your {s.strategy.softmax_words} (exp overflows to inf or underflows to 0)",
                    f"case {case.label}: {case.shapes()}; logits in [{lg[0]:.0f}, {lg[1]:.0f}]; {wrong}",
                )
                return
