"""Attention computed by hand, as data: each step a person would write on paper, with the numbers attnlab computed.

Every number comes from :func:`attnlab.attention_trace` (scores, logits, mask, weights, output, lse); the
intermediate columns a person writes between logits and weights (row max, ``exp(x - max)``, row sums) are
derived from the trace and checked against it.

>>> e = explain([[1, 0]], [[1, 0], [0, 1]], [[10, 0], [0, 20]])
>>> [s.key for s in e.steps]
['inputs', 'scores', 'scale', 'row_max', 'exp', 'row_sum', 'weights', 'output']
>>> e.step("scores").lines[0]
's[q0,k0] = q0·k0 = 1×1 + 0×0 = 1'
>>> e.step("output").lines[0]
'o[q0] = 0.6698×[10, 0] + 0.3302×[0, 20] = [6.6976, 6.6048]'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import masks as _masks
from ..core import attention_trace, softmax
from ..core.attention import AttentionTrace
from ..errors import MaskError, ShapeError
from .fmt import num, vec

__all__ = [
    "MAX_WRITTEN",
    "Explanation",
    "Setup",
    "Step",
    "explain",
    "explain_example",
    "explain_setup",
    "explain_softmax",
    "explain_weighted_average",
    "setup_from_example",
]

#: How many entries of QKᵀ (and output rows) are written out term by term; larger inputs show the matrices only.
MAX_WRITTEN = 16
#: How many terms of a dot product are written before "…".
MAX_TERMS = 8


@dataclass(frozen=True)
class Setup:
    """One attention problem as a learner states it: one head, small matrices, the options of ``explain``.

    Shapes: ``q [n_q, d_k]``, ``k [n_k, d_k]``, ``v [n_k, d_v]``, ``mask [n_q, n_k]`` (bool, True = may attend).
    ``padding`` is the number of real key positions (the rest are padding, on ``padding_side``); ``shift`` is a
    constant added to every score after scaling; ``temperature`` divides the logits.
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    mask: np.ndarray | None = None
    causal: bool = False
    padding: int | None = None
    padding_side: str = "right"
    temperature: float = 1.0
    shift: float = 0.0
    scale: float | None = None
    masked_rows: str = "raise"
    query_labels: tuple[str, ...] | None = None
    key_labels: tuple[str, ...] | None = None
    title: str = "Your matrices"
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("q", "k", "v"):
            a = np.asarray(getattr(self, name))
            if a.ndim != 2:
                raise ShapeError(
                    f"{name}: explain works on one head, a matrix [{'n_q' if name == 'q' else 'n_k'}, "
                    f"{'d_v' if name == 'v' else 'd_k'}]; got shape {a.shape} (index one batch/head first)"
                )
        n_q, n_k = np.shape(self.q)[0], np.shape(self.k)[0]
        if self.query_labels is not None and len(self.query_labels) != n_q:
            raise ShapeError(f"query_labels: {len(self.query_labels)} label(s) for n_q={n_q} queries")
        if self.key_labels is not None and len(self.key_labels) != n_k:
            raise ShapeError(f"key_labels: {len(self.key_labels)} label(s) for n_k={n_k} keys")
        if self.padding is not None:
            if isinstance(self.padding, bool) or not isinstance(self.padding, (int, np.integer)):
                raise ShapeError(f"padding: expected the number of real key positions (an int), got {self.padding!r}")
            if not 0 <= self.padding <= n_k:
                raise ShapeError(f"padding: {self.padding} real key positions; expected 0 <= padding <= n_k={n_k}")
        if self.padding_side not in ("left", "right"):
            raise ShapeError(f"padding_side: expected 'left' or 'right', got {self.padding_side!r}")
        if self.causal and n_q != n_k:
            raise MaskError(_masks.causal_alignment_message(n_q, n_k, "causal"))
        if not math.isfinite(float(self.shift)):
            raise ShapeError(f"shift: expected a finite number, got {self.shift!r}")

    @property
    def n_q(self) -> int:
        return int(np.shape(self.q)[0])

    @property
    def n_k(self) -> int:
        return int(np.shape(self.k)[0])

    @property
    def d_k(self) -> int:
        return int(np.shape(self.q)[1])

    @property
    def qlabels(self) -> tuple[str, ...]:
        return self.query_labels or tuple(f"q{i}" for i in range(self.n_q))

    @property
    def klabels(self) -> tuple[str, ...]:
        return self.key_labels or tuple(f"k{j}" for j in range(self.n_k))

    def padding_mask(self) -> np.ndarray | None:
        """Key padding ``[1, n_k]`` (True = real token) or None."""
        if self.padding is None:
            return None
        real = _masks.key_padding([self.padding], self.n_k, ndim=2)  # [1, n_k], real tokens first
        return real[:, ::-1].copy() if self.padding_side == "left" else real

    def user_mask(self) -> np.ndarray | None:
        """``mask`` AND padding, broadcast to ``[n_q, n_k]`` (causal is added by the core); None if neither."""
        parts = [m for m in (self.mask, self.padding_mask()) if m is not None]
        if not parts:
            return None
        out = np.ones((self.n_q, self.n_k), dtype=bool)
        for m in parts:
            m = np.asarray(m)
            try:
                out = out & np.broadcast_to(m, out.shape)
            except ValueError:
                raise ShapeError(f"mask: shape {m.shape} does not fit the scores [n_q, n_k] = {out.shape}") from None
        return out

    def trace(self, **overrides: Any) -> AttentionTrace:
        """:func:`attnlab.attention_trace` of this setup (``overrides`` replace its keyword options)."""
        kw: dict[str, Any] = {
            "causal": self.causal,
            "scale": self.scale,
            "temperature": self.temperature,
            "masked_rows": self.masked_rows,
        }
        if self.shift:
            kw["bias"] = np.full((self.n_q, self.n_k), float(self.shift))
        kw.update(overrides)
        mask = kw.pop("mask", self.user_mask())
        return attention_trace(self.q, self.k, self.v, mask, **kw)

    def with_options(self, **changes: Any) -> Setup:
        return replace(self, **changes)


@dataclass(frozen=True)
class Step:
    """One step of the computation.

    ``matrix`` is what the step produces (``[rows, cols]``, a column vector ``[rows, 1]`` for per-row values),
    labelled by ``rows``/``cols``; ``lines`` write the arithmetic out; ``note`` says what to look at.
    """

    key: str
    title: str
    formula: str
    matrix: np.ndarray | None = None
    rows: tuple[str, ...] = ()
    cols: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()
    note: str = ""
    extra: tuple[tuple[str, np.ndarray, tuple[str, ...], tuple[str, ...]], ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Explanation:
    """A worked computation: the steps in order, plus the final ``weights [n_q, n_k]`` and ``output [n_q, d_v]``.

    ``trace`` is the core's :class:`~attnlab.AttentionTrace` (None for the weighted-average and saturation
    examples, which do not start from Q and K); ``setup`` the problem it was computed from.
    """

    title: str
    source: str
    steps: tuple[Step, ...]
    weights: np.ndarray | None
    output: np.ndarray | None
    setup: Setup | None = None
    trace: AttentionTrace | None = None
    notes: tuple[str, ...] = ()

    def step(self, key: str) -> Step:
        """The step called ``key``."""
        for s in self.steps:
            if s.key == key:
                return s
        raise KeyError(f"no step {key!r}; this explanation has {', '.join(s.key for s in self.steps)}")


# ----------------------------------------------------------------------------------------------------------------


def _dot_line(i: int, j: int, q: np.ndarray, k: np.ndarray, s: float, ql: str, kl: str) -> str:
    terms = [f"{num(a)}×{num(b) if b >= 0 else '(' + num(b) + ')'}" for a, b in zip(q[i], k[j], strict=True)]
    if len(terms) > MAX_TERMS:
        terms = [*terms[: MAX_TERMS - 1], f"… ({len(terms) - MAX_TERMS + 1} more)"]
    return f"s[{ql},{kl}] = {ql}·{kl} = {' + '.join(terms)} = {num(s)}"


def _softmax_steps(
    logits: np.ndarray,
    allowed: np.ndarray,
    weights: np.ndarray,
    rows: tuple[str, ...],
    cols: tuple[str, ...],
    lse: np.ndarray | None = None,
) -> list[Step]:
    """Row max, exp(x - max), row sums and weights, checked against the weights (and lse) the core computed."""
    masked = np.where(allowed, logits, -np.inf)  # [n_q, n_k]
    m = masked.max(axis=-1)  # [n_q]
    empty = ~allowed.any(axis=-1)
    m_safe = np.where(empty, 0.0, m)
    e = np.where(allowed, np.exp(masked - m_safe[:, None]), 0.0)  # [n_q, n_k], exactly 0 where masked
    l = e.sum(axis=-1)  # [n_q]
    ref = np.where(empty[:, None], 0.0, e / np.where(empty, 1.0, l)[:, None])
    ok = np.where(empty[:, None], True, np.isclose(ref, weights, rtol=1e-9, atol=1e-12))
    if lse is not None:  # m + log(l) is the core's log-sum-exp
        lse_ok = np.allclose(np.where(empty, 0.0, m_safe + np.log(np.where(empty, 1.0, l))), np.where(empty, 0.0, lse))
        ok = ok & lse_ok
    if not bool(np.all(ok)):  # a core regression would show here, never a user's input
        raise AssertionError("explain: the hand computation disagrees with attnlab.attention_trace")
    max_lines = tuple(
        f"m[{r}] = max of {vec(masked[i][allowed[i]])} = {num(m[i])}" if not empty[i] else f"m[{r}]: no legal key"
        for i, r in enumerate(rows)
    )
    exp_lines = []
    for i, r in enumerate(rows):
        if empty[i]:
            continue
        js = np.flatnonzero(allowed[i])
        parts = [f"exp({num(masked[i, j])} - {num(m[i])}) = {num(e[i, j])}" for j in js[:6]]
        exp_lines.append(f"{r}: " + ", ".join(parts) + (" …" if len(js) > 6 else ""))
        legal = masked[i, js]
        if len(js) <= 6 and np.abs(legal).max() <= 50 and m[i] != 0:
            raw = np.exp(legal)
            exp_lines.append(
                f"    (without subtracting the max: exp = {vec(raw)}, sum {num(raw.sum())}: the same weights "
                f"{vec(raw / raw.sum())})"
            )
    sum_lines = tuple(
        f"l[{r}] = "
        + " + ".join(num(x) for x in e[i][allowed[i]][:8])
        + (" …" if allowed[i].sum() > 8 else "")
        + (f" = {num(l[i])}" if allowed[i].sum() > 1 else "")
        for i, r in enumerate(rows)
        if not empty[i]
    )
    weight_lines = tuple(f"row {r}: sum of weights = {num(weights[i].sum())}" for i, r in enumerate(rows))
    notes_w = "Each legal row sums to 1; masked keys get exactly 0."
    if empty.any():
        bad = ", ".join(r for r, x in zip(rows, empty, strict=True) if x)
        notes_w = f"Row(s) {bad} have no legal key at all: softmax is 0/0 there (see the masked-rows policy)."
    return [
        Step(
            "row_max",
            "Row maximum over the legal keys",
            "m_i = max_j x_ij",
            m[:, None],
            rows,
            ("max",),
            max_lines,
            "Subtracting it changes nothing in the result but keeps exp from overflowing (stable softmax).",
        ),
        Step(
            "exp",
            "Exponentials",
            "e_ij = exp(x_ij - m_i)   (exp(-inf) = 0)",
            e,
            rows,
            cols,
            tuple(exp_lines),
            "The largest legal entry of each row becomes exp(0) = 1; masked entries are exactly 0.",
        ),
        Step("row_sum", "Row sums", "l_i = Σ_j e_ij", l[:, None], rows, ("sum",), sum_lines, ""),
        Step("weights", "Weights (softmax)", "A_ij = e_ij / l_i", weights, rows, cols, weight_lines, notes_w),
    ]


def _output_step(
    weights: np.ndarray, v: np.ndarray, out: np.ndarray, rows: tuple[str, ...], vrows: tuple[str, ...]
) -> Step:
    lines = []
    if weights.shape[0] * weights.shape[1] <= MAX_WRITTEN * 4:
        for i, r in enumerate(rows):
            js = np.flatnonzero(weights[i] != 0)
            if js.size == 0:
                lines.append(f"o[{r}] = 0 (no legal key)")
                continue
            terms = " + ".join(f"{num(weights[i, j])}×{vec(v[j])}" for j in js[:6]) + (" + …" if js.size > 6 else "")
            lines.append(f"o[{r}] = {terms} = {vec(out[i])}")
    dv = v.shape[1]
    return Step(
        "output",
        "Output: weighted sum of the values",
        "O = A V   (o_i = Σ_j A_ij v_j)",
        out,
        rows,
        tuple(f"d{c}" for c in range(dv)),
        tuple(lines),
        "The weights say where to read from; the values say what is read.",
    )


def explain_setup(setup: Setup) -> Explanation:
    """Every step of ``setup`` (a :class:`Setup`), computed with :func:`attnlab.attention_trace`."""
    t = setup.trace()
    q, k, v = np.asarray(t.q), np.asarray(t.k), np.asarray(t.v)
    ql, kl = setup.qlabels, setup.klabels
    scores = np.asarray(t.scores)  # [n_q, n_k]
    allowed = np.asarray(t.allowed)  # [n_q, n_k]
    steps: list[Step] = [
        Step(
            "inputs",
            "Inputs",
            f"Q [n_q={setup.n_q}, d_k={setup.d_k}], K [n_k={setup.n_k}, d_k={setup.d_k}], V [n_k={setup.n_k}, "
            f"d_v={v.shape[1]}]",
            None,
            extra=(
                ("Q", q, ql, tuple(f"d{c}" for c in range(q.shape[1]))),
                ("K", k, kl, tuple(f"d{c}" for c in range(k.shape[1]))),
                ("V", v, kl, tuple(f"d{c}" for c in range(v.shape[1]))),
            ),
        )
    ]
    written = [(i, j) for i in range(setup.n_q) for j in range(setup.n_k)][:MAX_WRITTEN]
    lines = tuple(_dot_line(i, j, q, k, scores[i, j], ql[i], kl[j]) for i, j in written)
    more = setup.n_q * setup.n_k - len(written)
    steps.append(
        Step(
            "scores",
            "Scores: every query against every key",
            "S = Q Kᵀ   (s_ij = q_i · k_j)",
            scores,
            ql,
            kl,
            lines,
            f"({more} more entries computed the same way)" if more > 0 else "",
        )
    )
    x = scores * t.scale
    if setup.scale is None:
        how = f"scale = 1/sqrt(d_k) = 1/sqrt({setup.d_k}) = {num(t.scale)}"
    else:
        default = num(1 / math.sqrt(setup.d_k))
        how = f"scale = {num(t.scale)} (given; the default would be 1/sqrt({setup.d_k}) = {default})"
    steps.append(
        Step(
            "scale",
            "Scale",
            "S · scale" + ("" if setup.scale is not None else f" = S / sqrt({setup.d_k})"),
            x,
            ql,
            kl,
            (how,),
            "Dividing by sqrt(d_k) keeps the scores' spread near 1 whatever d_k is, so softmax does not saturate.",
        )
    )
    if setup.shift:
        x = x + setup.shift
        steps.append(
            Step(
                "shift",
                "Add a constant to every score",
                f"x + {num(setup.shift)}",
                x,
                ql,
                kl,
                (),
                "Softmax subtracts each row's max, so the same constant on a whole row changes no weight.",
            )
        )
    if setup.temperature != 1.0:
        x = x / t.temperature
        steps.append(
            Step(
                "temperature",
                "Divide by the temperature",
                f"x / T = x / {num(t.temperature)}",
                x,
                ql,
                kl,
                (),
                "T > 1 pulls the scores together (flatter weights); T < 1 spreads them (sharper weights).",
            )
        )
    logits = np.asarray(t.logits)
    if not allowed.all():
        what = []
        if setup.causal:
            what.append("causal (query i sees keys j <= i)")
        if setup.padding is not None:
            what.append(f"padding ({setup.padding} real key(s), padded on the {setup.padding_side})")
        if setup.mask is not None:
            what.append("your mask")
        steps.append(
            Step(
                "mask",
                "Mask: blocked entries become -inf",
                "x_ij = -inf where query i may not attend to key j",
                logits,
                ql,
                kl,
                tuple(_masks.to_string(allowed).splitlines()),
                "Mask = " + " AND ".join(what) + ". ■ may attend, ⬚ blocked. Masking happens BEFORE softmax.",
            )
        )
    steps += _softmax_steps(logits, allowed, np.asarray(t.weights), ql, kl, np.asarray(t.lse))
    steps.append(_output_step(np.asarray(t.weights), v, np.asarray(t.output), ql, kl))
    notes = []
    if t.masked_rows:
        rows = ", ".join(ql[r[-1]] for r in t.masked_rows)
        notes.append(
            f"Fully masked row(s) {rows}: softmax over no key is 0/0. Policy {t.policy!r}: "
            + (
                "weights and output set to 0, as FlashAttention does."
                if t.policy == "zero"
                else "NaN, as naive code gives."
            )
        )
    return Explanation(
        title=setup.title,
        source=setup.source,
        steps=tuple(steps),
        weights=np.asarray(t.weights),
        output=np.asarray(t.output),
        setup=setup,
        trace=t,
        notes=tuple(notes),
    )


def explain(
    q: Any,
    k: Any,
    v: Any,
    mask: Any = None,
    *,
    causal: bool = False,
    padding: int | None = None,
    padding_side: str = "right",
    temperature: float = 1.0,
    shift: float = 0.0,
    scale: float | None = None,
    masked_rows: str = "raise",
    query_labels: Any = None,
    key_labels: Any = None,
    title: str = "Your matrices",
) -> Explanation:
    """Attention of one head worked out step by step.

    Args:
        q: queries ``[n_q, d_k]``; k: keys ``[n_k, d_k]``; v: values ``[n_k, d_v]`` (arrays or nested lists).
        mask: bool ``[n_q, n_k]`` (broadcastable), True = may attend.
        causal: query i sees keys j <= i (n_q == n_k).
        padding: number of real key positions; the others (on ``padding_side``) are masked.
        temperature: divides the logits. shift: a constant added to every scaled score.
        scale: multiplies Q Kᵀ; default 1/sqrt(d_k). masked_rows: the core's policy for rows with no legal key.
        query_labels, key_labels: token labels for the rows/columns.

    Returns:
        an :class:`Explanation`; ``weights [n_q, n_k]`` and ``output [n_q, d_v]`` are the core's.

    Shapes:
        scores, logits, weights ``[n_q, n_k]``; row max / row sums ``[n_q, 1]``; output ``[n_q, d_v]``.
    """
    setup = Setup(
        np.asarray(q),
        np.asarray(k),
        np.asarray(v),
        None if mask is None else np.asarray(mask),
        causal=bool(causal),
        padding=padding,
        padding_side=padding_side,
        temperature=temperature,
        shift=shift,
        scale=scale,
        masked_rows=masked_rows,
        query_labels=None if query_labels is None else tuple(map(str, query_labels)),
        key_labels=None if key_labels is None else tuple(map(str, key_labels)),
        title=title,
    )
    return explain_setup(setup)


def explain_weighted_average(weights: Any, v: Any, *, title: str = "Weighted average", source: str = "") -> Explanation:
    """The output from given weights ``[n_q, n_k]`` and values ``v [n_k, d_v]``: ``o = Σ_j a_j v_j``.

    >>> explain_weighted_average([[0.6, 0.3, 0.1]], [[10, 0], [0, 10], [5, 5]]).step("output").lines[0]
    'o[q0] = 0.6×[10, 0] + 0.3×[0, 10] + 0.1×[5, 5] = [6.5, 3.5]'
    """
    w = np.asarray(weights, dtype=np.float64)
    vv = np.asarray(v, dtype=np.float64)
    if w.ndim != 2 or vv.ndim != 2 or w.shape[1] != vv.shape[0]:
        raise ShapeError(f"weights {w.shape} [n_q, n_k] and v {vv.shape} [n_k, d_v] do not fit")
    out = w @ vv  # [n_q, d_v]
    rows = tuple(f"q{i}" for i in range(w.shape[0]))
    kl = tuple(f"v{j}" for j in range(vv.shape[0]))
    steps = (
        Step(
            "inputs",
            "Inputs: given weights and values",
            f"a [n_q={w.shape[0]}, n_k={w.shape[1]}], V [n_k={vv.shape[0]}, d_v={vv.shape[1]}]",
            None,
            extra=(("a", w, rows, kl), ("V", vv, kl, tuple(f"d{c}" for c in range(vv.shape[1])))),
        ),
        _output_step(w, vv, out, rows, kl),
    )
    return Explanation(
        title, source, steps, w, out, notes=("Attention computes these weights from Q and K instead of fixing them.",)
    )


def explain_softmax(*logit_rows: Any, title: str = "Softmax", source: str = "") -> Explanation:
    """Softmax of each given row of logits, step by step (the saturation example: [1, 2] vs [10, 20]).

    >>> explain_softmax([1, 2], [10, 20]).weights.round(6).tolist()
    [[0.268941, 0.731059], [4.5e-05, 0.999955]]
    """
    rows_ = [np.asarray(r, dtype=np.float64).ravel() for r in logit_rows]
    if not rows_ or any(r.shape != rows_[0].shape for r in rows_):
        raise ShapeError(f"logits: expected rows of one length, got {[r.shape for r in rows_]}")
    x = np.stack(rows_)  # [rows, n]
    w = np.asarray(softmax(x, axis=-1))
    labels = tuple(vec(r) for r in rows_)
    cols = tuple(f"x{j}" for j in range(x.shape[1]))
    steps = [Step("logits", "Logits", "x", x, labels, cols)]
    steps += _softmax_steps(x, np.ones_like(x, dtype=bool), w, labels, cols)
    return Explanation(title, source, tuple(steps), w, None)


def setup_from_example(name: str, **options: Any) -> Setup:
    """The :class:`Setup` of a named worked example (``options`` override causal, temperature, ...)."""
    from ..articles import example

    ex = example(name)
    if ex.q is None or ex.k is None:
        raise ShapeError(f"example {name!r} does not start from Q and K ({ex.title}); it has no attention setup")
    base: dict[str, Any] = {
        "causal": ex.causal,
        "scale": ex.scale,
        "mask": None if ex.mask is None else np.asarray(ex.mask),
        "title": ex.title,
        "source": f"article {ex.source}",
    }
    for key, value in options.items():
        if value is not None and not (key == "causal" and value is False):
            base[key] = value
    return Setup(np.asarray(ex.q), np.asarray(ex.k), np.asarray(ex.v), **base)


def explain_example(name: str, **options: Any) -> Explanation:
    """The worked example ``name`` of :mod:`attnlab.articles`, step by step (``options`` as for :func:`explain`).

    >>> explain_example("2x2").weights.round(4).tolist()
    [[0.6698, 0.3302], [0.3302, 0.6698]]
    """
    from ..articles import example

    ex = example(name)
    if ex.weights is not None:
        return explain_weighted_average(ex.weights, ex.v, title=ex.title, source=f"article {ex.source}")
    if ex.logits:
        return explain_softmax(*ex.logits, title=ex.title, source=f"article {ex.source}")
    return explain_setup(setup_from_example(name, **options))
