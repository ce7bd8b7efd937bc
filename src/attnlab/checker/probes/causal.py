"""The causal probes: future tokens must not move earlier outputs (with a mask too, with large scores, with
the flag and a mask together)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..adapters import round_to
from ..cases import Geom
from ..diagnose import diagnose, own_alignments
from ..registry import probe
from ..runner import Case
from ..tolerance import FLOORS, compare
from .common import base_call, change, golden_logit_range, largest, require

if TYPE_CHECKING:
    from ..session import Session

__all__ = ["causal", "flag_and_mask_together", "future_within_mask", "large_scores_causal"]


@probe("causal")
def causal(s: Session) -> None:
    """The ``causal`` probe: changing future tokens moves no earlier output (see the module's table)."""
    require(s, "causal")
    n = 8
    case = s.make(Geom(2, 2, n, n, 4, 4), s.primary, label="future", causal=True)
    base = base_call(s, case, "causal: future tokens")
    if base is None:
        return
    tol = FLOORS[case.dtype] * max(1.0, float(np.max(np.abs(base.out)))) * 4
    for t in (1, 4):
        sel = {
            "q": (..., slice(t + 1, None), slice(None)),
            "k": (..., slice(t + 1, None), slice(None)),
            "v": (..., slice(t + 1, None), slice(None)),
        }
        out = s.call(s.perturbed(case, sel))
        if not out.ok:
            s.crash(out)
            continue
        diff = change(out.out[..., : t + 1, :], base.out[..., : t + 1, :])
        if not np.all(diff <= tol):
            idx = np.argwhere(~(diff <= tol))[0]
            s.bug(
                "causal-leak",
                f"query {int(idx[-2])} changes when tokens {t + 1}..{n - 1} (its future) change",
                f"case {case.label}: {case.shapes()}, causal; max change {largest(diff):.3g} in "
                f"outputs of queries 0..{t} (tolerance {tol:.2g})",
            )
            return
    large_scores_causal(s, case)
    if "mask" in s.caps:
        future_within_mask(s)
        flag_and_mask_together(s)


def future_within_mask(s: Session) -> None:
    """Causal with a mask (per-sequence lengths of a KV cache, packed sequences, padding): for the first
    queries, change the K/V of keys that only later queries may see; their outputs must not move. A causal
    bound taken from the padded cache size instead of each sequence's length leaks exactly there."""
    g = Geom(2, 2, 4, 9, 4, 4) if "cross" in s.caps else Geom(2, 2, 8, 8, 4, 4)
    case = s.make(g, s.primary, label="future, with a mask", causal=True, mask=True)
    own = s.allowed(case)
    allowed = own
    for align in own_alignments(s, case)[1:]:  # the function's alignment is its own: the looser one counts
        allowed = allowed | s.allowed(case, causal=align)
    base = base_call(s, case, "causal: future tokens, with a mask")
    if base is None or base.out.shape != (*case.q.shape[:-1], case.v.shape[-1]):
        return
    tol = FLOORS[case.dtype] * max(1.0, float(np.max(np.abs(base.out[np.isfinite(base.out)]), initial=0))) * 4
    for t in (0, g.n_q // 2):
        later = allowed[..., t + 1 :, :].any(axis=-2) & ~allowed[..., : t + 1, :].any(axis=-2)  # [B, h, n_k]
        future = later.all(axis=1)  # [B, n_k]: keys no head's first queries may see (K/V heads are shared)
        for b in np.nonzero(future.any(axis=-1))[0]:  # one batch element at a time, its own rows watched
            out = s.call(s.perturbed(case, (b, slice(None), future[b], slice(None)), what="kv"))
            if not out.ok or out.out.shape != base.out.shape:
                continue
            diff = change(out.out[b, :, : t + 1, :], base.out[b, :, : t + 1, :])
            diff = np.where(own[b, :, : t + 1, :].any(axis=-1)[..., None], diff, 0.0)
            if not np.all(diff <= tol):
                idx = np.argwhere(~(diff <= tol))[0]
                lengths = np.asarray(case.mask.any(axis=-2))[:, 0].sum(axis=-1) if case.mask is not None else None
                s.bug(
                    "causal-leak",
                    f"query {int(idx[-2])} of batch element {int(b)} changes when keys only later queries may "
                    "see change (its future, under a mask: a causal bound taken from the padded size instead "
                    "of each sequence's own length leaks there)",
                    f"case {case.label}: {case.shapes()}; valid keys per batch element "
                    f"{'' if lengths is None else lengths.tolist()}; max change {largest(diff):.3g} in outputs "
                    f"of queries 0..{t} (tolerance {tol:.2g})",
                )
                return


def flag_and_mask_together(s: Session) -> None:
    """A causal flag and a mask in the same call (a full mask form, the causal part not in the mask): the
    function must apply both, or refuse the pair (PyTorch SDPA raises); silently dropping one is a leak."""
    if s.causal_mode != "flag" or s.mask_form != "full":
        return
    g = Geom(2, 2, 8, 8, 4, 4)
    logical = s.make(g, s.primary, label="mask and causal flag together", causal=True, mask=True)
    s.case_key = "causal: mask and causal flag together"
    out = s.call(replace(logical, causal=None, flag=True))  # square: both alignments are the same
    if out.timed_out:
        return
    ev = f"case {logical.label}: {logical.shapes()}; the causal flag set and a mask without the causal part"
    if out.error is not None:
        s.note(
            "causal-and-mask",
            "a causal flag together with a mask is refused (as PyTorch SDPA); the checker passes the causal part "
            "inside the mask then",
            ev + f"; {out.error_text.splitlines()[0][:200]}",
        )
        return
    if not out.ok:
        return
    golden, tol, rows = s.expected(logical)
    cmp = compare(out.out, golden, tol, rows)
    if not cmp.ok:  # the call made is not ``logical`` (its causal part went as the flag): no experiments
        diagnose(s, logical, out.out, cmp, rows, as_flag=True)


def large_scores_causal(s: Session, small: Case) -> bool:
    """The causal case ``small`` with scores of large magnitude (as :meth:`large_scores`): a finite causal fill
    (-1e4, -1e5, -1e9) then outscores the allowed keys, and the future's V moves the early outputs."""
    dtype = s.primary
    b, h, n, _ = small.q.shape
    d = 4
    a = 6000.0 if dtype == "float16" else 3e10
    c = 1.2 + 0.8 * np.argsort(s.rng.random((b, h, n)), axis=-1) / max(1, n - 1)
    q = round_to(np.full((b, h, n, d), a), dtype).astype(np.float64)
    k = round_to(np.broadcast_to(-c[..., None], (b, h, n, d)), dtype).astype(np.float64)
    v = round_to(s.rng.normal(0, 1, (b, h, n, d)), dtype).astype(np.float64)
    case = Case(q, k, v, dtype, small.mask, small.causal, None, "causal, large scores", flag=small.flag)
    s.case_key = "causal: large scores"
    base = s.call(case)
    if not base.ok or base.out.shape != (b, h, n, d):
        return False  # a range check refusing such scores: no evidence either way
    t = 1
    out = s.call(s.perturbed(case, {"v": (..., slice(t + 1, None), slice(None))}, what="v"))
    if not out.ok or out.out.shape != base.out.shape:
        return False
    d_ = change(out.out[..., : t + 1, :], base.out[..., : t + 1, :])
    finite = np.abs(base.out[np.isfinite(base.out)])
    tol = FLOORS[dtype] * max(1.0, float(finite.max()) if finite.size else 1.0) * 4
    if not np.any(d_ > tol) or np.isinf(d_).any():
        return False
    lg = golden_logit_range(case)
    s.bug(
        "finite-fill",
        "future keys get weight once the scores are large: the V of tokens "
        f"{t + 1}..{n - 1} moves the outputs of queries 0..{t} when the allowed scores are about {lg[1]:.2g}; "
        "the causal mask fills with a finite value the scores exceed (such as -1e4, -1e5 or -1e9) instead of "
        "-inf or finfo(dtype).min",
        f"case {case.label}: {case.shapes()}, scores in [{lg[0]:.3g}, {lg[1]:.3g}]; changing the future V "
        f"moves earlier outputs by up to {largest(d_):.3g} (tolerance {tol:.2g})",
    )
    return True
