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
from ..errors import MaskError, OptionError, ShapeError
from ..i18n import Word, localized
from ..validate import check_choice, check_float, check_int
from .fmt import num, vec
from .i18n import check_lang, tr

__all__ = [
    "MAX_WRITTEN",
    "Explanation",
    "Setup",
    "Step",
    "explain",
    "explain_setup",
    "explain_softmax",
    "explain_weighted_average",
    "setup_from_example",
]

#: How many entries of QKᵀ (and output rows) are written out term by term; larger inputs show the matrices only.
MAX_WRITTEN = 16
#: How many terms of a dot product are written before "…".
MAX_TERMS = 8


def causal_align_error(n_q: int, n_k: int, how: str = "hint.causal_python") -> MaskError:
    """The error for ``causal=True`` with ``n_q != n_k`` (the diagonal's placement drawn both ways); ``how`` is the
    catalogue key of the fix (Python's keyword, or the command line's ``--causal-align``)."""
    a, b = min(n_q, 4), min(n_k, 5)
    indent = "\n    "
    draw = {
        align: indent + _masks.to_string(_masks.causal(a, b, align=align)).replace("\n", indent)
        for align in ("top_left", "bottom_right")
    }
    err = localized(
        MaskError,
        "input.causal_align",
        n_q=n_q,
        n_k=n_k,
        a=a,
        b=b,
        top=draw["top_left"],
        bottom=draw["bottom_right"],
        how=Word(how),
    )
    return err


@dataclass(frozen=True)
class Setup:
    """One attention problem as a learner states it: one head, small matrices, the options of ``explain``.

    Shapes: ``q [n_q, d_k]``, ``k [n_k, d_k]``, ``v [n_k, d_v]``, ``mask [n_q, n_k]`` (bool, True = may attend).
    ``padding`` is the number of real key positions (the rest are padding, on ``padding_side``); ``shift`` is a
    constant added to every score after scaling; ``bias`` an additive term broadcastable to ``[n_q, n_k]`` (a row
    ``[1, n_k]`` is one bias per column, article 000's self-test); ``temperature`` divides the logits. ``causal``
    is True or, when ``n_q != n_k``, ``"top_left"`` / ``"bottom_right"`` (a decoding query: the last query is the
    newest token and sees every key).
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    mask: np.ndarray | None = None
    causal: bool | str = False
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
    bias: np.ndarray | None = None

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
            if check_int("padding", self.padding, minimum=0) > n_k:
                raise OptionError(f"padding: {self.padding} real key positions; expected 0 <= padding <= n_k={n_k}")
        check_choice("padding_side", self.padding_side, ("left", "right"))
        if self.causal not in (False, True, "top_left", "bottom_right"):
            raise MaskError(f"causal: expected True, False, 'top_left' or 'bottom_right', got {self.causal!r}")
        if self.causal is True and n_q != n_k:
            raise causal_align_error(n_q, n_k)
        if self.bias is not None:
            b = np.asarray(self.bias)
            try:
                np.broadcast_to(b, (n_q, n_k))
            except ValueError:
                raise ShapeError(
                    f"bias: shape {b.shape} does not broadcast to the scores [n_q, n_k] = {(n_q, n_k)}; give one "
                    f"number per key [1, n_k] or a full [n_q, n_k]"
                ) from None
        check_float("shift", self.shift)

    @property
    def n_q(self) -> int:
        """The number of queries (rows of ``q``)."""
        return int(np.shape(self.q)[0])

    @property
    def n_k(self) -> int:
        """The number of keys (rows of ``k``)."""
        return int(np.shape(self.k)[0])

    @property
    def d_k(self) -> int:
        """The width of a query or key vector."""
        return int(np.shape(self.q)[1])

    @property
    def qlabels(self) -> tuple[str, ...]:
        """The queries' labels: ``query_labels``, or ``q0, q1, ...``."""
        return self.query_labels or tuple(f"q{i}" for i in range(self.n_q))

    @property
    def klabels(self) -> tuple[str, ...]:
        """The keys' labels: ``key_labels``, or ``k0, k1, ...``."""
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
                raise localized(ShapeError, "input.mask_shape", shape=m.shape, scores=out.shape) from None
        return out

    def trace(self, **overrides: Any) -> AttentionTrace:
        """:func:`attnlab.attention_trace` of this setup (``overrides`` replace its keyword options)."""
        kw: dict[str, Any] = {
            "causal": self.causal,
            "scale": self.scale,
            "temperature": self.temperature,
            "masked_rows": self.masked_rows,
        }
        bias = (
            None
            if self.bias is None
            else np.broadcast_to(np.asarray(self.bias, dtype=np.float64), (self.n_q, self.n_k))
        )
        if self.shift:
            bias = np.full((self.n_q, self.n_k), float(self.shift)) + (0.0 if bias is None else bias)
        if bias is not None:
            kw["bias"] = bias
        kw.update(overrides)
        mask = kw.pop("mask", self.user_mask())
        return attention_trace(self.q, self.k, self.v, mask, **kw)

    def with_options(self, **changes: Any) -> Setup:
        """A copy of this setup with the given fields changed (``dataclasses.replace``)."""
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
    examples, which do not start from Q and K); ``setup`` the problem it was computed from; ``lang`` the language of
    its text ("en" or "zh", see :mod:`attnlab.explain.i18n`).
    """

    title: str
    source: str
    steps: tuple[Step, ...]
    weights: np.ndarray | None
    output: np.ndarray | None
    setup: Setup | None = None
    trace: AttentionTrace | None = None
    notes: tuple[str, ...] = ()
    lang: str = "en"

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
    lang: str = "en",
) -> list[Step]:
    """Row max, exp(x - max), row sums and weights, checked against the weights (and lse) the core computed."""
    masked = np.where(allowed, logits, -np.inf)  # [n_q, n_k]
    m = masked.max(axis=-1)  # [n_q]
    empty = np.asarray(~allowed.any(axis=-1))
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
        tr("step.max.line", lang, r=r, vals=vec(masked[i][allowed[i]]), m=num(m[i]))
        if not empty[i]
        else tr("step.max.none", lang, r=r)
        for i, r in enumerate(rows)
    )
    limit = math.log(float(np.finfo(np.float64).max))  # exp(x) is inf above 709.78
    low = math.log(float(np.finfo(np.float64).smallest_subnormal))  # exp(x) is 0 below -744.44
    exp_lines = []
    for i, r in enumerate(rows):
        if empty[i]:
            continue
        js = np.flatnonzero(allowed[i])
        parts = [f"exp({num(masked[i, j])} - {num(m[i])}) = {num(e[i, j])}" for j in js[:6]]
        exp_lines.append(f"{r}: " + ", ".join(parts) + (" …" if len(js) > 6 else ""))
        legal = masked[i, js]
        if len(js) <= 6 and m[i] != 0:
            if legal.max() > limit:  # exactly where the naive way breaks: show it breaking
                big = legal[legal > limit]
                exp_lines.append(
                    "    " + tr("step.exp.overflow", lang, x=num(big.max()), lim=num(limit, 2), n=int(big.size))
                )
            elif legal.max() < low:  # every exp underflows: 0 / 0
                exp_lines.append("    " + tr("step.exp.underflow", lang, lim=num(low, 2)))
            else:
                raw = np.exp(legal)
                exp_lines.append(
                    "    " + tr("step.exp.raw", lang, raw=vec(raw), sum=num(raw.sum()), w=vec(raw / raw.sum()))
                )
    sum_lines = tuple(
        f"l[{r}] = "
        + " + ".join(num(x) for x in e[i][allowed[i]][:8])
        + (" …" if allowed[i].sum() > 8 else "")
        + (f" = {num(l[i])}" if allowed[i].sum() > 1 else "")
        for i, r in enumerate(rows)
        if not empty[i]
    )
    weight_lines = tuple(tr("step.weights.row_sum", lang, r=r, s=num(weights[i].sum())) for i, r in enumerate(rows))
    notes_w = tr("step.weights.note", lang)
    if empty.any():
        bad = ", ".join(r for r, x in zip(rows, empty, strict=True) if x)
        notes_w = tr("step.weights.note_empty", lang, rows=bad)
    return [
        Step(
            "row_max",
            tr("step.max.title", lang),
            "m_i = max_j x_ij",
            m[:, None],
            rows,
            (tr("label.max", lang),),
            max_lines,
            tr("step.max.note", lang),
        ),
        Step(
            "exp",
            tr("step.exp.title", lang),
            "e_ij = exp(x_ij - m_i)   (exp(-inf) = 0)",
            e,
            rows,
            cols,
            tuple(exp_lines),
            tr("step.exp.note", lang),
        ),
        Step(
            "row_sum",
            tr("step.sum.title", lang),
            "l_i = Σ_j e_ij",
            l[:, None],
            rows,
            (tr("label.sum", lang),),
            sum_lines,
            "",
        ),
        Step(
            "weights", tr("step.weights.title", lang), "A_ij = e_ij / l_i", weights, rows, cols, weight_lines, notes_w
        ),
    ]


def _output_step(
    weights: np.ndarray,
    v: np.ndarray,
    out: np.ndarray,
    rows: tuple[str, ...],
    vrows: tuple[str, ...],
    lang: str = "en",
) -> Step:
    lines = []
    if weights.shape[0] * weights.shape[1] <= MAX_WRITTEN * 4:
        for i, r in enumerate(rows):
            js = np.flatnonzero(weights[i] != 0)
            if js.size == 0:
                lines.append(tr("step.output.none", lang, r=r))
                continue
            terms = " + ".join(f"{num(weights[i, j])}×{vec(v[j])}" for j in js[:6]) + (" + …" if js.size > 6 else "")
            lines.append(f"o[{r}] = {terms} = {vec(out[i])}")
    dv = v.shape[1]
    return Step(
        "output",
        tr("step.output.title", lang),
        "O = A V   (o_i = Σ_j A_ij v_j)",
        out,
        rows,
        tuple(f"d{c}" for c in range(dv)),
        tuple(lines),
        tr("step.output.note", lang),
    )


def explain_setup(setup: Setup, *, lang: str = "en") -> Explanation:
    """Every step of ``setup`` (a :class:`Setup`), computed with :func:`attnlab.attention_trace`; text in ``lang``."""
    lang = check_lang(lang)
    t = setup.trace()
    q, k, v = np.asarray(t.q), np.asarray(t.k), np.asarray(t.v)
    ql, kl = setup.qlabels, setup.klabels
    scores = np.asarray(t.scores)  # [n_q, n_k]
    allowed = np.asarray(t.allowed)  # [n_q, n_k]
    inputs_note = ""
    if setup.n_q != setup.n_k:
        inputs_note = tr("step.inputs.cross", lang, n_q=setup.n_q, n_k=setup.n_k)
    steps: list[Step] = [
        Step(
            "inputs",
            tr("step.inputs.title", lang),
            f"Q [n_q={setup.n_q}, d_k={setup.d_k}], K [n_k={setup.n_k}, d_k={setup.d_k}], V [n_k={setup.n_k}, "
            f"d_v={v.shape[1]}]",
            None,
            note=inputs_note,
            extra=(
                ("Q", q, ql, tuple(f"d{c}" for c in range(q.shape[1]))),
                ("K", k, kl, tuple(f"d{c}" for c in range(k.shape[1]))),
                ("V", v, kl, tuple(f"d{c}" for c in range(v.shape[1]))),
            ),
        )
    ]
    written = [(i, j) for i in range(setup.n_q) for j in range(setup.n_k)][:MAX_WRITTEN]
    lines = [_dot_line(i, j, q, k, scores[i, j], ql[i], kl[j]) for i, j in written]
    more = setup.n_q * setup.n_k - len(written)
    if setup.n_q <= MAX_WRITTEN:
        lines += [tr("step.scores.row_sum", lang, r=r, s=num(scores[i].sum())) for i, r in enumerate(ql)]
    score_note = tr("step.scores.note", lang)
    if more > 0:
        score_note = tr("step.scores.more", lang, n=more) + " " + score_note
    steps.append(
        Step(
            "scores",
            tr("step.scores.title", lang),
            "S = Q Kᵀ   (s_ij = q_i · k_j)",
            scores,
            ql,
            kl,
            tuple(lines),
            score_note,
        )
    )
    x = scores * t.scale
    if setup.scale is None:
        how = f"scale = 1/sqrt(d_k) = 1/sqrt({setup.d_k}) = {num(t.scale)}"
    else:
        default = num(1 / math.sqrt(setup.d_k))
        how = tr("step.scale.given", lang, s=num(t.scale), d=setup.d_k, x=default)
    steps.append(
        Step(
            "scale",
            tr("step.scale.title", lang),
            "S · scale" + ("" if setup.scale is not None else f" = S / sqrt({setup.d_k})"),
            x,
            ql,
            kl,
            (how,),
            tr("step.scale.note", lang),
        )
    )
    if setup.shift:
        x = x + setup.shift
        steps.append(
            Step(
                "shift",
                tr("step.shift.title", lang),
                f"x + {num(setup.shift)}",
                x,
                ql,
                kl,
                (),
                tr("step.shift.note", lang),
            )
        )
    if setup.bias is not None:
        b = np.broadcast_to(np.asarray(setup.bias, dtype=np.float64), x.shape)
        x = x + b
        per_column = bool(np.all(b == b[:1]))
        rowconst = bool(np.all(b == b[:, :1]))
        note = tr("step.bias.rowconst" if rowconst else ("step.bias.columns" if per_column else "step.bias.note"), lang)
        steps.append(
            Step(
                "bias",
                tr("step.bias.title", lang),
                "x + b",
                x,
                ql,
                kl,
                (f"b = {vec(b[0])}",) if per_column else (),
                note,
                extra=(("b", np.asarray(b), ql, kl),) if not per_column else (),
            )
        )
    if setup.temperature != 1.0:
        x = x / t.temperature
        steps.append(
            Step(
                "temperature",
                tr("step.temperature.title", lang),
                f"x / T = x / {num(t.temperature)}",
                x,
                ql,
                kl,
                (),
                tr("step.temperature.note", lang),
            )
        )
    logits = np.asarray(t.logits)
    if not allowed.all():
        what = []
        if setup.causal:
            what.append(
                tr("step.mask.causal", lang)
                if setup.causal is True
                else tr("step.mask.causal_align", lang, align=setup.causal, shift=setup.n_k - setup.n_q)
            )
        if setup.padding is not None:
            what.append(tr("step.mask.padding", lang, n=setup.padding, side=tr(f"side.{setup.padding_side}", lang)))
        if setup.mask is not None:
            what.append(tr("step.mask.yours", lang))
        steps.append(
            Step(
                "mask",
                tr("step.mask.title", lang),
                tr("step.mask.formula", lang),
                logits,
                ql,
                kl,
                tuple(_masks.to_string(allowed).splitlines()),
                tr("step.mask.note", lang, what=tr("step.mask.and", lang).join(what)),
            )
        )
    steps += _softmax_steps(logits, allowed, np.asarray(t.weights), ql, kl, np.asarray(t.lse), lang)
    steps.append(_output_step(np.asarray(t.weights), v, np.asarray(t.output), ql, kl, lang))
    notes = []
    if t.masked_rows:
        rows = ", ".join(ql[r[-1]] for r in t.masked_rows)
        notes.append(
            tr("step.note.masked_rows", lang, rows=rows, policy=repr(t.policy))
            + tr("step.note.policy_zero" if t.policy == "zero" else "step.note.policy_nan", lang)
        )
    if setup.padding is not None and setup.padding < setup.n_k and setup.n_q == setup.n_k:
        notes.append(tr("step.note.pad_query", lang))
    return Explanation(
        title=setup.title if setup.title != "Your matrices" else tr("label.your_matrices", lang),
        source=setup.source,
        steps=tuple(steps),
        weights=np.asarray(t.weights),
        output=np.asarray(t.output),
        setup=setup,
        trace=t,
        notes=tuple(notes),
        lang=lang,
    )


def explain(
    q: Any,
    k: Any,
    v: Any,
    mask: Any = None,
    *,
    causal: bool | str = False,
    padding: int | None = None,
    padding_side: str = "right",
    temperature: float = 1.0,
    shift: float = 0.0,
    scale: float | None = None,
    bias: Any = None,
    masked_rows: str = "raise",
    query_labels: Any = None,
    key_labels: Any = None,
    title: str = "Your matrices",
    lang: str = "en",
) -> Explanation:
    """Attention of one head worked out step by step.

    Args:
        q: queries ``[n_q, d_k]``; k: keys ``[n_k, d_k]``; v: values ``[n_k, d_v]`` (arrays or nested lists).
        mask: bool ``[n_q, n_k]`` (broadcastable), True = may attend.
        causal: query i sees keys j <= i (True when n_q == n_k; "top_left" or "bottom_right" otherwise).
        padding: number of real key positions; the others (on ``padding_side``) are masked.
        temperature: divides the logits. shift: a constant added to every scaled score.
        scale: multiplies Q Kᵀ; default 1/sqrt(d_k). masked_rows: the core's policy for rows with no legal key.
        bias: additive scores broadcastable to ``[n_q, n_k]`` (``[[b_0, ..., b_{n_k-1}]]``: one per column).
        query_labels, key_labels: token labels for the rows/columns.
        lang: "en" (default) or "zh": the language of every title, line and note.

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
        causal=causal if isinstance(causal, str) else bool(causal),
        padding=padding,
        padding_side=padding_side,
        temperature=temperature,
        shift=shift,
        scale=scale,
        masked_rows=masked_rows,
        query_labels=None if query_labels is None else tuple(map(str, query_labels)),
        key_labels=None if key_labels is None else tuple(map(str, key_labels)),
        title=title,
        bias=None if bias is None else np.asarray(bias, dtype=np.float64),
    )
    return explain_setup(setup, lang=lang)


def explain_weighted_average(
    weights: Any, v: Any, *, title: str = "Weighted average", source: str = "", lang: str = "en"
) -> Explanation:
    """The output from given weights ``[n_q, n_k]`` and values ``v [n_k, d_v]``: ``o = Σ_j a_j v_j``.

    >>> explain_weighted_average([[0.6, 0.3, 0.1]], [[10, 0], [0, 10], [5, 5]]).step("output").lines[0]
    'o[q0] = 0.6×[10, 0] + 0.3×[0, 10] + 0.1×[5, 5] = [6.5, 3.5]'
    """
    lang = check_lang(lang)
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
            tr("step.wavg.inputs", lang),
            f"a [n_q={w.shape[0]}, n_k={w.shape[1]}], V [n_k={vv.shape[0]}, d_v={vv.shape[1]}]",
            None,
            extra=(("a", w, rows, kl), ("V", vv, kl, tuple(f"d{c}" for c in range(vv.shape[1])))),
        ),
        _output_step(w, vv, out, rows, kl, lang),
    )
    return Explanation(title, source, steps, w, out, notes=(tr("step.wavg.note", lang),), lang=lang)


def explain_softmax(*logit_rows: Any, title: str = "Softmax", source: str = "", lang: str = "en") -> Explanation:
    """Softmax of each given row of logits, step by step (the saturation example: [1, 2] vs [10, 20]).

    >>> explain_softmax([1, 2], [10, 20]).weights.round(6).tolist()
    [[0.268941, 0.731059], [4.5e-05, 0.999955]]
    """
    lang = check_lang(lang)
    rows_ = [np.asarray(r, dtype=np.float64).ravel() for r in logit_rows]
    if not rows_ or any(r.shape != rows_[0].shape for r in rows_):
        raise ShapeError(f"logits: expected rows of one length, got {[r.shape for r in rows_]}")
    x = np.stack(rows_)  # [rows, n]
    w = np.asarray(softmax(x, axis=-1))
    labels = tuple(vec(r) for r in rows_)
    cols = tuple(f"x{j}" for j in range(x.shape[1]))
    steps = [Step("logits", tr("step.logits.title", lang), "x", x, labels, cols)]
    steps += _softmax_steps(x, np.ones_like(x, dtype=bool), w, labels, cols, lang=lang)
    return Explanation(title, source, tuple(steps), w, None, lang=lang)


def setup_from_example(name: str, **options: Any) -> Setup:
    """The :class:`Setup` of a named worked example (``options`` override causal, temperature, ...).

    ``causal=True`` on an example with ``n_q != n_k`` takes the example's alignment (the one-query example is a
    decoding query: ``"bottom_right"``); ``causal=False`` keeps the example's own mask, ``no_causal=True`` drops it.
    """
    from ..articles import example

    ex = example(name)
    if ex.q is None or ex.k is None:
        raise OptionError(f"example {name!r} does not start from Q and K ({ex.title}); it has no attention setup")
    base: dict[str, Any] = {
        "causal": ex.causal,
        "scale": ex.scale,
        "mask": None if ex.mask is None else np.asarray(ex.mask),
        "bias": None if ex.bias is None else np.asarray(ex.bias),
        "padding": ex.padding,
        "masked_rows": ex.masked_rows or "raise",
        "query_labels": ex.tokens,
        "key_labels": ex.tokens,
        "title": ex.title,
        "source": f"article {ex.source}",
    }
    lang = options.pop("lang", None)
    if lang is not None and check_lang(lang) != "en":
        base["title"] = tr(f"title.{name}", lang)
        base["source"] = tr("render.article", lang, source=tr(f"source.{name}", lang))
    no_causal = bool(options.pop("no_causal", False))
    for key, value in options.items():
        if value is not None and not (key == "causal" and value is False):
            base[key] = value
    if no_causal:
        base["causal"] = False
    if base["causal"] is True and ex.align is not None and np.shape(ex.q)[0] != np.shape(ex.k)[0]:
        base["causal"] = ex.align
    return Setup(np.asarray(ex.q), np.asarray(ex.k), np.asarray(ex.v), **base)
