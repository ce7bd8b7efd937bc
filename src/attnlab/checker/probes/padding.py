"""The padding probes: what padded keys hold must not move valid outputs, whatever their values or scores."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ... import masks as _masks
from ..adapters import round_to
from ..cases import Geom
from ..registry import probe
from ..runner import Case
from ..tolerance import FLOORS, Comparison, compare
from .common import base_call, change, golden_logit_range, largest, require

if TYPE_CHECKING:
    from ..session import Session

__all__ = ["large_scores", "padding"]


@probe("padding")
def padding(s: Session) -> None:
    """The ``padding`` probe: what padded keys hold moves no valid output (see the module's table)."""
    require(s, "mask")
    n = 6
    n_q = 5 if "cross" in s.caps else n  # rectangular where the function takes n_q != n_k
    lengths = np.array([n, 3])
    kp = _masks.key_padding(lengths, n)  # [B, 1, 1, n_k]
    case = s.make(Geom(2, 2, n_q, n, 4, 4), s.primary, label="key padding", mask=kp)
    base = base_call(s, case, "padding: key padding")
    if base is None:
        return
    rows = s.allowed(case).any(axis=-1)
    padded = (1, slice(None), slice(3, None), slice(None))  # batch 1, keys 3..5
    big = 1e10 if case.dtype in ("float64", "float32") else 1e3
    tol = FLOORS[case.dtype] * max(1.0, float(np.max(np.abs(base.out)))) * 4
    leaks: dict[str, tuple[float | None, Comparison]] = {}
    for what, value in (("large", big), ("random", None)):
        out = s.call(s.perturbed(case, {"k": padded, "v": padded}, what="kv", value=value))
        if not out.ok:
            s.crash(out)
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
        if what == "large" and "random" not in leaks and not cmp.nonfinite and cmp.max_error < big * 1e-9:
            # a weight w on the padded keys would move the outputs by about w·1e10 toward their V; a change this
            # small is no weight (a softmax over scores of ~1e10 gives ~0 or ~1), only rounding: the padded K
            # enter a shared computation (a mean or norm over all keys) that the softmax then cancels
            s.note(
                "masked-values-rounding",
                "the padded keys' K enter the computation of valid outputs without getting weight (such as a mean "
                "or norm over all keys): with padded K of 1e10 the valid outputs move only by rounding",
                ev,
                "compute such statistics over the valid keys only if padded inputs can be large",
            )
            return
        if what == "large" and "random" not in leaks and not cmp.nonfinite:  # blocked while scores are small
            s.bug(
                "finite-fill",
                "the output of valid positions changes when padded keys get scores of about "
                f"{big:g}·q (their K set to {big:g}), and only then: the blocked scores are shifted by a finite "
                "value (an additive mask such as (1 - mask) * -10000.0) instead of -inf or finfo(dtype).min",
                ev,
            )
        else:
            s.bug(
                "padding-leak",
                f"the output of valid positions changes when the K/V of padded (masked) keys change ({what} values)",
                ev,
            )
        return
    if large_scores(s, kp):
        return
    out = s.call(s.perturbed(case, {"k": padded, "v": padded}, what="kv", value=math.nan))
    if out.ok and not np.all(np.isfinite(out.out[1][rows[1]])):
        s.note(
            "padding-nan",
            "NaN in the K/V of padded keys spreads into valid outputs (0 × NaN = NaN in weights @ V)",
            f"case {case.label}: {case.shapes()}, padded K/V set to NaN; PyTorch SDPA and NumPy behave the same",
            "make padded inputs finite (e.g. zeros) before attention; masking cannot remove a NaN from V",
        )


def large_scores(s: Session, kp: np.ndarray) -> bool:
    """Key padding ``kp`` with scores of large magnitude: allowed keys score about -1e11 (-1.4e4 to -2.4e4
    in float16), so a finite fill (-1e4, -1e9) outscores them, while -inf and finfo(dtype).min still block.
    Changing the V of the padded keys must not move the valid outputs. Returns True when it found a leak."""
    dtype = s.primary
    b, h, n_q, n_k, d = 2, 2, 5 if "cross" in s.caps else kp.shape[-1], kp.shape[-1], 4
    a = 6000.0 if dtype == "float16" else 3e10  # q = a; k = -c per key: scores = -a·c·d / sqrt(d)
    c = 1.2 + 0.8 * np.argsort(s.rng.random((b, h, n_k)), axis=-1) / max(1, n_k - 1)  # distinct per key
    q = np.full((b, h, n_q, d), a)
    k = np.broadcast_to(-c[..., None], (b, h, n_k, d))
    v = s.rng.normal(0, 1, (b, h, n_k, d))
    q, k, v = (round_to(x, dtype).astype(np.float64) for x in (q, k, v))
    case = Case(q, k, v, dtype, np.broadcast_to(kp, (b, h, n_q, n_k)).copy(), None, None, "large scores")
    s.case_key = "padding: large scores"
    base = s.call(case)
    if not base.ok:  # a function may refuse scores this large (a range check): no evidence either way
        return False
    padded = (1, slice(None), slice(3, None), slice(None))
    out = s.call(s.perturbed(case, {"v": padded}, what="v"))
    if not out.ok or out.out.shape != base.out.shape:
        return False
    rows = s.allowed(case).any(axis=-1)[1]
    d_ = np.where(rows[..., None], change(out.out[1], base.out[1]), 0.0)
    finite = np.abs(base.out[1][np.isfinite(base.out[1])])
    tol = FLOORS[dtype] * max(1.0, float(finite.max()) if finite.size else 1.0) * 4
    if not np.any(d_ > tol) or np.isinf(d_).any():  # inf/NaN appearing is overflow, not a fill
        return False
    lg = golden_logit_range(case)
    s.bug(
        "finite-fill",
        "blocked keys get weight once the scores are large: the padded keys' V moves the valid outputs when the "
        f"allowed scores are about {lg[1]:.2g}; the mask fills with a finite value the scores exceed (such as "
        "-1e4 or -1e9) instead of -inf or finfo(dtype).min",
        f"case {case.label}: {case.shapes()}, key lengths {kp.sum(axis=-1).ravel().tolist()}, scores in "
        f"[{lg[0]:.3g}, {lg[1]:.3g}]; changing the padded keys' V moves valid outputs by up to "
        f"{largest(d_):.3g} (tolerance {tol:.2g})",
    )
    return True
