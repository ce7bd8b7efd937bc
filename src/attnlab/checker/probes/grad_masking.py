"""The gradient probes of masking: masked keys get no gradient, fully masked rows follow the forward's policy."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..adapters import round_to
from ..cases import LENGTH_FORMS, Geom
from ..grad_hypotheses import Variant, attention_grads, reduce_kv
from ..gradient_oracle import GradCase, GradReturned, golden_grads
from ..registry import ProbeSkip, probe
from ..tolerance import expand_kv
from .common import grad_pairs, report_leak

if TYPE_CHECKING:
    from ..session import Session

__all__ = [
    "additive_fits",
    "grad_masked_keys",
    "grad_masked_rows",
    "row_problems",
    "rows_leak",
    "same",
]


@probe("grad-masked-keys")
def grad_masked_keys(s: Session) -> None:
    """The ``grad-masked-keys`` probe: a key masked for every query gets dK = dV = 0 and moves no other gradient."""
    if "mask" not in s.caps:
        raise ProbeSkip("needs a mask argument")
    g = Geom(2, 2, 6, 8, 8, 8)
    base = s.make(g, s.primary, label="masked keys", mask=True)
    # the last key is blocked for every query (random_mask's promise); give it huge K and V
    k, v = base.k.copy(), base.v.copy()
    k[..., -1, :] = round_to(np.full(k.shape[-1], 30.0), base.dtype)
    v[..., -1, :] = round_to(np.full(v.shape[-1], 1e3), base.dtype)
    assert base.mask is not None  # mask=True
    m = base.mask.copy()
    m[..., -1] = False
    case = s.grads.grad_case(replace(base, k=k, v=v, mask=m))
    s.case_key = s.key(case)
    out = s.call(case)
    if not out.ok:
        s.crash(out)
        return
    ret = cast(GradReturned, out.returned)
    leak = []
    for name in ("dk", "dv"):
        x = ret.grads.get(name)
        if x is not None and x.ndim >= 2 and x.shape[-2] == g.n_k:
            col = x[..., -1, :]
            if not np.all(col == 0):
                leak.append(f"max |{name}| of the masked key = {float(np.nanmax(np.abs(col))):.3g}")
    if leak:
        s.bug(
            "grad-masked-leak",
            "a key that every query has masked gets gradient in dK/dV (it must be exactly 0)",
            f"case {case.label}: {case.shapes()}, the last key masked for every query, its K = 30 and V = 1e3; "
            + "; ".join(leak),
        )
    ok = s.grads.compare_grads(out)
    # the masked key's K and V changed: no other gradient may move
    k2, v2 = case.k.copy(), case.v.copy()
    k2[..., -1, :] = -k2[..., -1, :]
    v2[..., -1, :] = round_to(np.full(v.shape[-1], -7.0), base.dtype)
    moved = s.call(replace(case, k=k2, v=v2))
    unexplained = set(s.findings) <= {"grad-mismatch"}  # a named bug (a wrong lse, delta) moves them too
    if not ok and moved.ok and unexplained:  # wrong elsewhere: a move is a leak if the same call repeats exactly
        again = s.call(case)
        ok = (
            again.ok
            and isinstance(again.returned, GradReturned)
            and all(same(ret.grads.get(n), again.returned.grads.get(n)) for n in ("dq", "dk", "dv"))
        )
    if moved.ok and ok and isinstance(moved.returned, GradReturned):
        _, bounds = s.expected(case)
        for name, a, b in grad_pairs(ret, moved.returned):
            sel = (slice(None),) * (a.ndim - 2) + (slice(0, -1),) if name != "dq" else (Ellipsis,)
            with np.errstate(invalid="ignore"):
                same_nan = np.isnan(a[sel]) & np.isnan(b[sel])  # NaN in both calls is no move
                diff = np.where(same_nan, 0.0, np.abs(a[sel] - b[sel]))
            worst = float(np.nanmax(diff))
            if np.isnan(diff).any() or worst > bounds[name]:
                message = f"changing a masked key's K and V changes {name} of the others"
                report_leak(s, "grad-masked-leak", message, case, f"max change {worst:.3g}", bounds[name])
                break


def _rows_case(s: Session) -> tuple[GradCase, str]:
    """The gradient case with fully masked rows (as the mask form can express them) and where they are."""
    g = Geom(2, 2, 5, 6, 8, 8)
    base = s.make(g, s.primary, label="masked rows", mask=True)
    assert base.mask is not None  # mask=True
    m = base.mask.copy()
    if s.mask_form in LENGTH_FORMS:  # lengths or key padding: only a whole sequence can have no key
        m[1] = False
        where = "batch element 1 has no valid key (length 0)"
    else:
        if s.mask_form != "batch":  # a per-batch mask is the same for every head
            m[0, 0, 1, :] = False
        m[1, :, -1, :] = False
        where = "query 1 of batch 0, head 0 and the last query of batch 1 have no allowed key"
        if s.mask_form == "batch":
            where = "the last query of batch 1 has no allowed key"
    return s.grads.grad_case(replace(base, mask=m)), where


@probe("grad-masked-rows")
def grad_masked_rows(s: Session) -> None:
    """Rows with no allowed key: finite gradients; their dQ is 0, and their d_out moves dK not at all and dV
    not at all (zeros policy) or by d_out / n_k on every key (uniform policy). Measured as the difference
    between two calls whose d_out differs only on those rows, so that a bug elsewhere does not show here."""
    if "mask" not in s.caps:
        raise ProbeSkip("needs a mask argument")
    case, where = _rows_case(s)
    s.case_key = s.key(case)
    out = s.call(case)
    policy = s.spec.masked_rows
    if out.error is not None and not out.error.died:
        if policy in ("any", "raise"):
            s.note(
                "masked-row-raise",
                "the backward raises on fully masked rows (the forward's raise policy)",
                f"case {case.label}: {out.error_text.splitlines()[0][:200]}",
            )
            return
        s.crash(out)
        return
    if not out.ok:
        return
    ret = cast(GradReturned, out.returned)
    nonfinite = [n for n, x in ret.grads.items() if not np.all(np.isfinite(x))]
    if nonfinite:
        if policy != "nan":
            if s.grads.seen.row_policy == "nan":  # the forward's own NaN row, differentiated: its masked-row-nan
                s.grads.nan_rows.add(s.case_key)
            s.bug(
                "grad-masked-row",
                f"fully masked rows give NaN/inf gradients ({', '.join(nonfinite)})",
                f"case {case.label}: {case.shapes()}; {where}",
            )
        return
    rows = ~s.allowed(case).any(axis=-1)  # [B, h, n_q]
    d2 = np.where(rows[..., None], 0.0, case.d_out)
    again = s.call(replace(case, d_out=d2))
    if not again.ok or not isinstance(again.returned, GradReturned):
        return
    _, bounds = s.expected(case)
    a, b = ret.grads, again.returned.grads
    problems = row_problems(s, case, rows, a, b, bounds)
    uniform_forward = s.spec.mask_convention == "additive" or s.grads.seen.row_policy == "uniform"
    if problems and uniform_forward and additive_fits(s, case, d2, rows, a, b, bounds):
        s.note(
            "masked-row-additive",
            "fully masked rows pass gradient: an additive finfo.min mask makes them uniform (s + c rounds to c), "
            "and the softmax Jacobian at those uniform weights sends their d_out to dQ, dK and dV",
            f"case {case.label}: {case.shapes()}; their d_out moves dQ, dK and dV as for unmasked rows",
            "give fully masked rows zero gradient (a boolean mask, or zero them explicitly) if masked keys must "
            "not learn from them",
        )
        return
    n_k = case.k.shape[-2]
    if problems and uniform_forward and additive_fits(s, case, d2, rows, a, b, bounds, factor=n_k):
        s.bug(
            "grad-masked-row",
            f"the gradients of fully masked rows are {n_k} (n_k) times those of the forward's uniform weights: the "
            "backward recomputes P = exp(s - lse) with an lse that lost log(n_k) to rounding (a finfo.min fill "
            "makes s + log(n_k) round to s), so P = 1 on every key instead of 1/n_k",
            f"case {case.label}: {case.shapes()}; {where}; " + "; ".join(problems),
        )
        return
    if problems and rows_leak(s, case, replace(case, d_out=d2), a, b, bounds):
        s.bug(
            "grad-masked-leak",
            "the backward ignores the mask: the fully masked rows get the gradients of the unmasked scores",
            f"case {case.label}: {case.shapes()}; {where}; " + "; ".join(problems),
        )
        return
    if problems:
        s.bug(
            "grad-masked-row",
            "the gradients of fully masked rows do not follow the forward's policy (zeros or the uniform average)"
            if policy not in ("zeros", "uniform")
            else f"the gradients of fully masked rows do not follow the declared policy masked_rows={policy!r}",
            f"case {case.label}: {case.shapes()}; {where}; " + "; ".join(problems),
        )


def row_problems(
    s: Session, case: GradCase, rows: np.ndarray, a: dict[str, np.ndarray], b: dict[str, np.ndarray], bounds: Any
) -> list[str]:
    """How the gradients ``a`` (and ``b``, the same call with the masked ``rows``' d_out zeroed) break the
    declared policy: dQ of those rows not 0, their d_out moving dK, or dV other than zeros / the uniform average."""
    policy = s.spec.masked_rows
    n_k = case.k.shape[-2]
    problems = []
    dq = a.get("dq")
    if dq is not None and dq.shape == case.q.shape:
        worst = float(np.max(np.abs(dq[rows]), initial=0.0))
        if worst > bounds["dq"]:
            problems.append(f"dQ of the masked rows is not 0 (max |dq| = {worst:.3g})")
    add = np.einsum("...q,...qd->...d", rows.astype(float), case.d_out)[..., None, :] / n_k
    add = reduce_kv(np.broadcast_to(add, (*add.shape[:-2], n_k, add.shape[-1])), case.k.shape[-3], s.gqa_map)
    for name in ("dk", "dv"):
        x, y = a.get(name), b.get(name)
        if x is None or y is None or x.shape != y.shape:
            continue
        diff = x - y
        tol = bounds[name]
        zero = float(np.max(np.abs(diff))) <= tol
        uniform = name == "dv" and diff.shape == add.shape and float(np.max(np.abs(diff - add))) <= tol
        fine = {"zeros": zero, "uniform": uniform or (name == "dk" and zero)}.get(policy, zero or uniform)
        if not fine:
            problems.append(
                f"the masked rows' d_out moves {name} by up to {float(np.max(np.abs(diff))):.3g} (tolerance {tol:.2g})"
            )
    return problems


def additive_fits(
    s: Session,
    case: GradCase,
    d2: np.ndarray,
    rows: np.ndarray,
    a: dict[str, np.ndarray],
    b: dict[str, np.ndarray],
    bounds: dict[str, float],
    *,
    factor: float = 1.0,
) -> bool:
    """Whether the masked ``rows``' d_out moves the gradients (``a`` - ``b``, the second call with their d_out
    zeroed as in ``d2``) by ``factor`` times what the softmax Jacobian at uniform weights gives.

    An additive ``finfo.min`` mask (declared, or the mask a forward whose fully masked rows came back uniform
    turns it into): a fully masked row is ``softmax(s + c)``, uniform in floating point, and autograd of such a
    forward takes the softmax Jacobian at those uniform weights, so the row's d_out reaches dQ, dK and dV: the
    policy of additive masks (a note), not a bug of the backward. ``factor = n_k``: weights 1 on every key, a
    backward whose lse lost log(n_k) (a bug)."""
    assert case.mask is not None  # a masked-rows case has a mask
    m = np.array(np.broadcast_to(case.mask, (*rows.shape, case.k.shape[-2])))
    m[rows] = True
    # those rows' weights are uniform (s + c rounds to c) and the Jacobian is taken there: a bias of -s on them
    sc = 1 / math.sqrt(case.q.shape[-1]) if case.scale is None else case.scale
    logits = case.q @ np.swapaxes(expand_kv(case.q, case.k, s.gqa_map), -1, -2) * sc
    c1 = replace(case, mask=m, bias=np.where(rows[..., None], -logits, 0.0))
    g1, g2 = golden_grads(c1, s.gqa_map), golden_grads(replace(c1, d_out=d2), s.gqa_map)
    for name in ("dq", "dk", "dv"):
        x, y, want1, want2 = a.get(name), b.get(name), g1[name], g2[name]
        assert want1 is not None and want2 is not None  # golden_grads always computes dq, dk and dv
        if x is None or y is None or x.shape != want1.shape:
            continue
        if float(np.max(np.abs((x - y) - factor * (want1 - want2)))) > bounds[name] * factor:
            return False
    return True


def rows_leak(
    s: Session, c1: GradCase, c2: GradCase, a: dict[str, np.ndarray], b: dict[str, np.ndarray], bounds: dict[str, float]
) -> bool:
    """Whether the difference between two calls is that of a backward that recomputes P without the mask."""
    for var in (Variant(p_mask="softmax", delta="self"), Variant(p_mask="none"), Variant(p_mask="softmax")):
        g1, g2 = (
            attention_grads(c.q, c.k, c.v, c.d_out, s.allowed(c), scale=c.scale, mapping=s.gqa_map, variant=var)
            for c in (c1, c2)
        )
        fits, shows = True, False
        for name in ("dq", "dk", "dv"):
            x, y = a.get(name), b.get(name)
            if x is None or y is None or x.shape != g1[name].shape:
                continue
            if float(np.max(np.abs((x - y) - (g1[name] - g2[name])))) > bounds[name]:
                fits = False
                break
            shows = shows or float(np.max(np.abs(g1[name] - g2[name]))) > bounds[name]
        if fits and shows:
            return True
    return False


def same(a: Any, b: Any) -> bool:
    """Whether two gradients of two identical calls are the same (both absent, or equal with NaN equal to NaN)."""
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))
