"""Evidence for two diagnoses, fitted from the function's output rather than read from the size of its error.

* :func:`fit_scale`: the scalar ``s`` for which ``softmax(s · q kᵀ, masked) @ v`` best matches the output (a
  search over ``log s`` on 41 points from 1e-3 to 1e3 times 1/√d_k, then a golden-section refinement around the best
  point), the fit's residual, and the formula it matches, if one does (:data:`FORMULAS`): the output under that
  formula's value must be within the tolerance and the fitted value within 5 % of it.
* :func:`precision`: whether the error pattern is that of rounding to a lower dtype (float32, float16 or
  bfloat16). The error ``out - golden`` must (1) have the size of that dtype's rounding (1/16 to 4 times the
  error of a reference computed in it), (2) not be explained by a structured alternative (a scale, one key ignored
  or one blocked key seen: each leaves at most a tenth of the error), and (3) match a rounding pattern: a
  least-squares combination of rounding patterns (each step of a computation in the dtype: inputs cast, q kᵀ
  rounded once or summed term by term, scores, weights, weights @ v; one rounding in an otherwise float64
  computation: v, the scores, the weights, the output; the whole computation in it) explains at least half of
  it, adjusted for the number of patterns chosen, or the output lies on the dtype's grid where the golden does not. A
  dropped key or a 0.2 % scale error fails (2) and (3).

>>> import numpy as np
>>> from attnlab.checker.runner import Case
>>> rng = np.random.default_rng(0)
>>> q, k, v = (rng.normal(size=(1, 2, 5, 8)) for _ in range(3))
>>> from attnlab import attention_trace
>>> out = attention_trace(q, k, v, scale=1 / 8).output  # scaled by 1/d_k
>>> fit = fit_scale(Case(q, k, v), out)
>>> round(fit.scale, 6), fit.formula
(0.125, '1/d_k')
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .adapters import round_to
from .cases import PRECISION, softmax
from .depends import allowed_of
from .runner import Case
from .tolerance import FLOORS, expand_kv, golden_output, naive_output

__all__ = ["FORMULAS", "PrecisionFit", "ScaleFit", "fit_scale", "formulas", "precision"]

#: The scale formulas a fitted scale is compared with, by name: ``f(d_k, d_v, h, scale) -> value`` (None: the
#: formula does not apply, e.g. no scale argument given).
FORMULAS: dict[str, Callable[[int, int, int, float | None], float | None]] = {
    "1/sqrt(d_k)": lambda d_k, d_v, h, s: 1 / math.sqrt(d_k),
    "1": lambda d_k, d_v, h, s: 1.0,
    "1/d_k": lambda d_k, d_v, h, s: 1 / d_k,
    "sqrt(d_k)": lambda d_k, d_v, h, s: math.sqrt(d_k),
    "1/sqrt(d_model)": lambda d_k, d_v, h, s: 1 / math.sqrt(h * d_k),
    "1/sqrt(d_v)": lambda d_k, d_v, h, s: 1 / math.sqrt(d_v),
    "2/sqrt(d_k)": lambda d_k, d_v, h, s: 2 / math.sqrt(d_k),
    "1/(2 sqrt(d_k))": lambda d_k, d_v, h, s: 1 / (2 * math.sqrt(d_k)),
    "the scale argument": lambda d_k, d_v, h, s: s,
    "1/(the scale argument)": lambda d_k, d_v, h, s: None if not s else 1 / s,
}

#: How far (relative) a fitted scale may be from a formula's value and still match it.
FORMULA_TOLERANCE = 0.05


@dataclass(frozen=True)
class ScaleFit:
    """The effective scale of an output: ``scale`` (fitted), ``residual`` (max |out - attention at that scale|
    on the compared rows), ``fits`` (the residual is within the tolerance: a scalar explains the output),
    ``formula`` (the name of the matching :data:`FORMULAS` entry, or ``""``), ``value`` (that formula's value),
    ``expected`` (the scale the case asks for), ``identifiable`` (the output changes with the scale at all)."""

    scale: float
    residual: float
    fits: bool
    formula: str
    value: float | None
    expected: float
    identifiable: bool

    @property
    def text(self) -> str:
        """The fit in words, for a finding's evidence."""
        if not self.identifiable:
            return "the scale cannot be fitted from this case (its output does not depend on the scale)"
        if not self.fits:
            return f"no single scale explains the output (best fit s = {self.scale:.6g}, residual {self.residual:.2g})"
        ratio = self.scale / self.expected
        said = f"fitted scale s = {self.scale:.6g} ({ratio:.4g} × the expected {self.expected:.6g})"
        if self.formula:
            return said + f", which matches {self.formula} = {self.value:.6g}; residual {self.residual:.2g}"
        return said + f", which matches no formula; residual {self.residual:.2g}"


def formulas(d_k: int, d_v: int, h: int, scale: float | None) -> dict[str, float]:
    """The values of :data:`FORMULAS` for a case (those that apply)."""
    out = {}
    for name, f in FORMULAS.items():
        value = f(d_k, d_v, h, scale)
        if value is not None and value > 0:
            out[name] = float(value)
    return out


class _Model:
    """``softmax(s · scores, masked) @ v`` for any ``s`` on one case, and its residual against an output."""

    def __init__(self, case: Case, out: np.ndarray, gqa: str):
        self.k = expand_kv(case.q, case.k, gqa)
        self.v = expand_kv(case.q, case.v, gqa)
        self.scores = case.q @ np.swapaxes(self.k, -1, -2)  # [..., n_q, n_k]
        self.allowed = allowed_of(case)
        self.rows = np.asarray(self.allowed.any(axis=-1))
        self.sel = np.broadcast_to(self.rows[..., None], out.shape)
        self.out = np.asarray(out, dtype=np.float64)

    def attend(self, s: float) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            return softmax(np.where(self.allowed, self.scores * s, -np.inf)) @ self.v

    def residual(self, s: float) -> float:
        with np.errstate(invalid="ignore"):
            d = np.abs(self.attend(s) - self.out)[self.sel]
        return float(np.max(d, initial=0.0)) if np.isfinite(d).all() else math.inf


def fit_scale(case: Case, out: Any, *, gqa: str = "interleave", tol: float | None = None) -> ScaleFit:
    """The scalar scale that best explains ``out`` ``[..., h, n_q, d_v]`` on ``case`` (see the module doc).

    ``tol``: the largest acceptable entry error (default: the case dtype's floor times the output's magnitude,
    × 4, as the perturbation probes use).
    """
    out = np.asarray(out, dtype=np.float64)
    d_k, d_v = case.q.shape[-1], case.v.shape[-1]
    h = case.q.shape[-3] if case.q.ndim >= 3 else 1
    expected = case.scale if case.scale is not None else 1 / math.sqrt(d_k)
    model = _Model(case, out, gqa)
    if tol is None:
        tol = FLOORS.get(case.dtype, 1e-5) * max(1.0, float(np.max(np.abs(out[np.isfinite(out)]), initial=0.0))) * 4
    base = 1 / math.sqrt(d_k)
    grid = base * np.exp(np.linspace(math.log(1e-3), math.log(1e3), 41))
    res = np.array([model.residual(float(s)) for s in grid])
    i = int(np.argmin(res))
    lo, hi = math.log(grid[max(0, i - 1)]), math.log(grid[min(len(grid) - 1, i + 1)])
    best, best_r = float(grid[i]), float(res[i])
    phi = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - phi * (b - a), a + phi * (b - a)
    rc, rd = model.residual(math.exp(c)), model.residual(math.exp(d))
    for _ in range(60):
        if rc <= rd:
            b, d, rd = d, c, rc
            c = b - phi * (b - a)
            rc = model.residual(math.exp(c))
        else:
            a, c, rc = c, d, rd
            d = a + phi * (b - a)
            rd = model.residual(math.exp(d))
    for s, r in ((math.exp(c), rc), (math.exp(d), rd)):
        if r < best_r:
            best, best_r = s, r
    spread = float(np.nanmax(res[np.isfinite(res)]) - best_r) if np.isfinite(res).any() else 0.0
    identifiable = spread > tol
    fits = best_r <= tol
    formula, value = "", None
    if fits and identifiable:
        ranked = sorted(formulas(d_k, d_v, h, case.scale).items(), key=lambda kv: abs(math.log(kv[1] / best)))
        for name, val in ranked:
            if abs(val / best - 1) <= FORMULA_TOLERANCE and model.residual(val) <= tol:
                formula, value = name, val
                break
    return ScaleFit(best, best_r, fits, formula, value, expected, identifiable)


# ---------------------------------------------------------------------------------------------------------------
# precision


@dataclass(frozen=True)
class PrecisionFit:
    """Whether an output's error is rounding to a lower dtype: ``dtype`` (the one it matches, or ``""``),
    ``pattern`` (the rounding point that contributes most, or ``"on the grid"``), ``explained`` (the share of the
    error's squared norm that rounding patterns explain), ``ratio``
    (its error over the dtype's reference error), ``structured`` (the alternative that explains it, or ``""``)
    and ``text``."""

    dtype: str
    pattern: str
    explained: float
    ratio: float
    structured: str
    text: str


def _patterns(case: Case, low: str, gqa: str, golden: np.ndarray) -> dict[str, np.ndarray]:
    """The error patterns ``[..., h, n_q, d_v]`` of rounding to ``low``: along a computation in ``low`` (inputs
    cast, then q kᵀ rounded once or summed term by term, the scaled scores, the weights, weights @ v), each step's
    increment over the step before; a single rounding in an otherwise float64 computation (v, the scores, the
    weights, the output); and the whole computation in ``low``."""

    def r(x: np.ndarray) -> np.ndarray:
        return round_to(x, low).astype(np.float64)

    def accumulated(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a @ b`` summed term by term, every product and partial sum rounded to ``low``."""
        acc = np.zeros((*a.shape[:-1], b.shape[-1]))
        for i in range(a.shape[-1]):
            acc = r(acc + r(a[..., :, i : i + 1] * b[..., i : i + 1, :]))
        return acc

    allowed = allowed_of(case)
    s0 = case.scale if case.scale is not None else 1 / math.sqrt(case.q.shape[-1])
    k, v = expand_kv(case.q, case.k, gqa), expand_kv(case.q, case.v, gqa)
    q, kt = case.q, np.swapaxes(k, -1, -2)

    def weights(scores: np.ndarray) -> np.ndarray:
        return softmax(np.where(allowed, scores, -np.inf))  # [..., n_q, n_k]

    rq, rkt = r(q), r(kt)
    chain = {
        "q and k cast": weights(rq @ rkt * s0) @ v,
        "q kᵀ rounded": weights(r(rq @ rkt) * s0) @ v,
        "q kᵀ summed": weights(accumulated(rq, rkt) * s0) @ v,
    }
    chain["scores rounded"] = weights(r(r(rq @ rkt) * s0)) @ v
    w_low = r(weights(r(r(rq @ rkt) * s0)))
    chain["weights rounded"] = w_low @ v
    chain["weights @ v rounded"] = r(w_low @ r(v))
    steps = {
        f"{low}: q and k cast": chain["q and k cast"] - golden,
        f"{low}: q kᵀ rounded": chain["q kᵀ rounded"] - chain["q and k cast"],
        f"{low}: q kᵀ summed in {low}": chain["q kᵀ summed"] - chain["q and k cast"],
        f"{low}: scores rounded": chain["scores rounded"] - chain["q kᵀ rounded"],
        f"{low}: weights rounded": chain["weights rounded"] - chain["scores rounded"],
        f"{low}: weights @ v rounded": chain["weights @ v rounded"] - chain["weights rounded"],
    }
    w = weights(q @ kt * s0)
    single = {
        f"only v rounded to {low}": w @ r(v) - golden,
        f"only the scores rounded to {low}": weights(r(q @ kt * s0)) @ v - golden,
        f"only the weights rounded to {low}": r(w) @ v - golden,
        f"only the output rounded to {low}": r(golden) - golden,
        f"computed in {low}": naive_output(q, case.k, case.v, allowed, dtype=low, scale=case.scale, gqa=gqa) - golden,
    }
    return {**steps, **single}


def _explained(e: np.ndarray, patterns: dict[str, np.ndarray]) -> tuple[float, str]:
    """How much of the error ``e`` (its squared norm, 0..1) a least-squares combination of the rounding
    ``patterns`` explains, and the pattern that contributes most. Patterns are chosen one at a time (the one that
    explains most next), at most one per three entries, and the share is adjusted for how many were chosen (``k``
    free coefficients on ``n`` entries explain about ``k/n`` of noise: ``1 - (1 - R²)(n - 1)/(n - k - 1)``)."""
    names = [n for n, p in patterns.items() if np.any(p)]
    if not names or not np.any(e):
        return 0.0, ""
    n, total = e.size, float(e @ e)
    chosen: list[str] = []
    best_adj, main = 0.0, ""
    for _ in range(min(len(names), max(1, (n - 2) // 3))):
        step: tuple[float, str] | None = None
        for name in names:
            if name in chosen:
                continue
            a = np.stack([patterns[c] for c in (*chosen, name)], axis=1)
            coef, *_ = np.linalg.lstsq(a, e, rcond=None)
            rest = e - a @ coef
            r2 = 1.0 - float(rest @ rest) / total
            if step is None or r2 > step[0]:
                step = (r2, name)
        assert step is not None  # a name is left: the loop runs at most len(names) times
        k = len(chosen) + 1
        adj = 1.0 - (1.0 - step[0]) * (n - 1) / max(1, n - k - 1)
        if adj <= best_adj + 1e-3:
            break
        chosen.append(step[1])
        best_adj, main = adj, main or step[1]
    return max(0.0, best_adj), main


def _structured(case: Case, out: np.ndarray, err: float, gqa: str) -> str:
    """A structured alternative that explains most (all but a tenth) of the error: a scale, one key ignored, one
    blocked key seen; ``""`` when none does."""
    model = _Model(case, out, gqa)
    fit = fit_scale(case, out, gqa=gqa, tol=0.1 * err)
    s0 = case.scale if case.scale is not None else 1 / math.sqrt(case.q.shape[-1])
    if fit.residual <= 0.1 * err and abs(fit.scale / s0 - 1) > 1e-9:
        return f"a scale of {fit.scale:.6g} ({fit.scale / s0:.5g} × the expected) explains it"
    allowed = model.allowed
    n_k = allowed.shape[-1]
    for j in sorted({*range(min(n_k, 4)), *range(max(0, n_k - 4), n_k)}):  # the first and the last keys
        col = np.zeros(n_k, bool)
        col[j] = True
        for alt, what in ((allowed & ~col, f"key {j} ignored"), (allowed | col, f"key {j} seen although blocked")):
            if np.array_equal(alt, allowed):
                continue
            with np.errstate(over="ignore", invalid="ignore"):
                ref = softmax(np.where(alt, model.scores * s0, -np.inf)) @ model.v
                d = np.abs(ref - model.out)[model.sel]
            if d.size and float(np.max(d)) <= 0.1 * err:
                return f"{what} explains it"
    return ""


def precision(case: Case, out: Any, *, gqa: str = "interleave", below: str | None = None) -> PrecisionFit:
    """Which lower dtype's rounding the error of ``out`` ``[..., h, n_q, d_v]`` matches, if any (see the module
    doc; of several, the one whose patterns explain most of it). ``below``: only dtypes less precise than this one
    are tried (default: the case's dtype)."""
    out = np.asarray(out, dtype=np.float64)
    allowed = allowed_of(case)
    rows = np.asarray(allowed.any(axis=-1))
    sel = np.broadcast_to(rows[..., None], out.shape)
    golden = golden_output(case.q, case.k, case.v, allowed, scale=case.scale, gqa=gqa)
    with np.errstate(invalid="ignore"):
        e = (out - golden)[sel]
    top = below or case.dtype
    if not e.size or not np.isfinite(e).all():
        return PrecisionFit("", "", 0.0, 0.0, "", "the output is not finite: not a rounding error")
    err = float(np.max(np.abs(e)))
    if err == 0:
        return PrecisionFit("", "", 0.0, 0.0, "", "the output equals the reference")
    structured: str | None = None  # computed when a dtype's error has the right size
    tried: list[str] = []
    fits: list[PrecisionFit] = []
    for low in ("float32", "float16", "bfloat16"):
        if PRECISION[low] >= PRECISION.get(top, 53):
            continue
        naive = naive_output(case.q, case.k, case.v, allowed, dtype=low, scale=case.scale, gqa=gqa)
        size = float(np.max(np.abs(naive - golden)[sel]))
        ratio = err / size if size > 0 else math.inf
        tried.append(f"{low}: error {ratio:.2g} × its rounding error")
        if not 1 / 16 <= ratio <= 4:
            continue
        structured = _structured(case, out, err, gqa) if structured is None else structured
        if structured:
            tried[-1] += f", but {structured}"
            continue
        patterns = _patterns(case, low, gqa, golden)
        share, main = _explained(e, {n: p[sel] for n, p in patterns.items()})
        on_grid = bool(np.mean(round_to(out[sel], low) == out[sel]) >= 0.9) and not bool(
            np.mean(round_to(golden[sel], low) == golden[sel]) >= 0.9
        )
        if share >= 0.5 or on_grid:
            said = (
                f"the error pattern is rounding to {low} ({share:.0%} of it explained; mostly {main})"
                if share >= 0.5
                else f"the output lies on {low}'s grid (every value representable in {low})"
            )
            pattern = main if share >= 0.5 else "on the grid"
            fits.append(PrecisionFit(low, pattern, share, ratio, "", said + f"; error {ratio:.2g} × {low}'s"))
            continue
        tried[-1] += f", pattern unlike its rounding ({share:.0%} explained)"
    if fits:  # the dtype whose patterns explain most of the error (on the grid counts as all of it)
        return max(fits, key=lambda f: (1.0 if f.pattern == "on the grid" else f.explained, -abs(math.log(f.ratio))))
    text = "the error matches no lower dtype's rounding" + (f" ({'; '.join(tried)})" if tried else "")
    if structured:
        text += f"; {structured}"
    return PrecisionFit("", "", 0.0, 0.0, structured or "", text)
