"""The articles' lessons that are not one attention computation, as :class:`~attnlab.explain.Explanation` values:
experiments (the variance of q·k, dropout's row sums, the leak test), the dtype traps (e^1000, -1e9 in float16),
multi-head by hand, the backward pass by hand, growth and cost. Every number is computed here by attnlab and
checked against an independent route (the core, the analytic backward, a finite difference, multi_head_attention).

>>> e = explain_lesson("self-test")
>>> bool(abs(e.step("shift").matrix - e.step("base").matrix).max() < 1e-12)
True
>>> e = explain_backward(setup_from_example("2x2"))
>>> e.step("dv").matrix.round(4).tolist()
[[1.0, 1.0], [1.0, 1.0]]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import masks as _masks
from ..core import attention_trace
from ..core.gradients import attention_backward
from ..errors import ShapeError
from ..i18n import localized
from .fmt import num, vec
from .i18n import check_lang, tr
from .steps import (
    Explanation,
    Setup,
    Step,
    explain_setup,
    explain_softmax,
    explain_weighted_average,
    setup_from_example,
)

__all__ = ["LESSON_FUNCTIONS", "explain_backward", "explain_dropout", "explain_example", "explain_lesson"]


def _labels(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(n))


def _head(name: str, lang: str) -> tuple[str, str]:
    """The title and source line of the lesson or example ``name`` in ``lang``."""
    return tr(f"title.{name}", lang), tr("render.article", lang, source=tr(f"source.{name}", lang))


# ---------------------------------------------------------------------------------------------------------- §4.1


def lesson_variance(
    lang: str = "en", *, samples: int = 8000, seed: int = 0, dks: tuple[int, ...] | None = None
) -> Explanation:
    """001 §4.1 as an experiment: ``Var(q·k) ≈ d_k`` for q, k with independent N(0, 1) entries, and
    ``Var(q·k / sqrt(d_k)) ≈ 1``; then what it does to softmax over 16 keys (the largest weight, on average).
    ``dks``: the widths, in the order drawn from one generator (default the article's, ``VARIANCE_DK``)."""
    from ..articles import VARIANCE_DK
    from ..core import softmax

    dks = VARIANCE_DK if dks is None else tuple(dks)
    rng = np.random.default_rng(seed)
    rows, sat = [], []
    for d in dks:
        q = rng.standard_normal((samples, d))
        k = rng.standard_normal((samples, d))
        dots = np.einsum("nd,nd->n", q, k)  # [samples]
        rows.append([dots.var(), dots.std(), (dots / math.sqrt(d)).var()])
        qs = rng.standard_normal((500, 1, d))
        ks = rng.standard_normal((500, 16, d))
        s = np.einsum("nod,nkd->nk", qs, ks)  # [500, 16]
        sat.append([np.asarray(softmax(s)).max(-1).mean(), np.asarray(softmax(s / math.sqrt(d))).max(-1).mean()])
    m, ms = np.array(rows), np.array(sat)
    labels = tuple(f"d_k={d}" for d in dks)
    lines = tuple(
        tr("lesson.variance.line", lang, d=d, v=num(r[0], 2), sd=num(r[1], 2), r=num(math.sqrt(d), 2), s=num(r[2], 3))
        for d, r in zip(dks, m, strict=True)
    )
    sat_lines = tuple(
        tr("lesson.variance.sat_line", lang, d=d, u=num(r[0], 3), s=num(r[1], 3)) for d, r in zip(dks, ms, strict=True)
    )
    title, source = _head("variance", lang)
    steps = (
        Step(
            "variance",
            tr("lesson.variance.step", lang, n=samples, seed=seed),
            "Var(q·k) = Σ_r Var(q_r k_r) ≈ d_k;   Var(q·k / sqrt(d_k)) = d_k / d_k = 1",
            m,
            labels,
            ("Var(q·k)", "std(q·k)", "Var(q·k/√d_k)"),
            lines,
            tr("lesson.variance.note", lang),
        ),
        Step(
            "saturation",
            tr("lesson.variance.sat_step", lang),
            "mean_n max_j softmax(s)_j",
            ms,
            labels,
            (tr("lesson.variance.col_unscaled", lang), tr("lesson.variance.col_scaled", lang)),
            sat_lines,
            tr("lesson.variance.sat_note", lang),
        ),
    )
    return Explanation(title, source, steps, None, None, notes=(tr("lesson.variance.caveat", lang),), lang=lang)


# ------------------------------------------------------------------------------------------------------------ §6


#: Largest x whose exp is finite, per dtype: log(finfo.max).
def _exp_limits() -> np.ndarray:
    return np.array([[math.log(float(np.finfo(t).max))] for t in (np.float16, np.float32, np.float64)])


def lesson_overflow(lang: str = "en") -> Explanation:
    """001 §6: softmax([1000, 999]) by hand. Without the max, ``exp(1000) = inf`` and ``inf / inf = nan``; with it,
    ``exp([0, -1])`` and the weights [0.7311, 0.2689]. Then where exp overflows in float16, float32, float64."""
    title, source = _head("overflow", lang)
    e = explain_softmax([1000.0, 999.0], lang=lang)
    with np.errstate(over="ignore", invalid="ignore"):
        raw = np.exp(np.array([[1000.0, 999.0]]))
        naive = raw / raw.sum(-1, keepdims=True)
    naive_step = Step(
        "naive",
        tr("lesson.overflow.naive", lang),
        "e_j = exp(x_j);  A_j = e_j / Σ e",
        naive,
        ("[1000, 999]",),
        ("x0", "x1"),
        (tr("lesson.overflow.naive_line", lang, raw=vec(raw[0]), w=vec(naive[0])),),
        tr("lesson.overflow.naive_note", lang),
    )
    limits = Step(
        "limits",
        tr("lesson.overflow.limits", lang),
        "x_max = log(finfo(dtype).max)",
        _exp_limits(),
        ("float16", "float32", "float64"),
        ("x_max",),
        (),
        tr("lesson.overflow.limits_note", lang),
    )
    return Explanation(title, source, (naive_step, *e.steps, limits), e.weights, None, lang=lang)


# ------------------------------------------------------------------------------------------------------------ §7


def lesson_fp16_mask(lang: str = "en") -> Explanation:
    """001 §7: an additive mask's fill value and the dtype. -1e4 and -1e9 in float32 and float16 (-1e9 overflows to
    -inf there); the 2×2 causal example with a -1e9 fill; a fully masked row with each fill."""
    title, source = _head("fp16-mask", lang)
    fills = (-1e4, -1e9, float(np.finfo(np.float16).min), -np.inf)
    with np.errstate(over="ignore"):
        stored = np.array([[float(np.float32(f)), float(np.float16(f))] for f in fills])
    fill_lines = tuple(
        tr("lesson.fp16.fill_line", lang, f=num(f), a=num(a), b=num(b))
        + (tr("lesson.fp16.overflow", lang) if np.isfinite(f) and not np.isfinite(b) else "")
        for f, (a, b) in zip(fills, stored, strict=True)
    )
    s = np.array([[1 / math.sqrt(2), 0.0], [0.0, 1 / math.sqrt(2)]])
    blocked = ~_masks.causal(2)

    def softmax_with_fill(x: np.ndarray, dtype: Any, fill: float) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            y = np.where(blocked if x.shape == (2, 2) else True, dtype(fill), x.astype(dtype))
            y = y.astype(dtype)
            z = np.exp(y - y.max(-1, keepdims=True))
            return (z / z.sum(-1, keepdims=True)).astype(np.float64)

    causal = np.concatenate([softmax_with_fill(s, np.float32, -1e9), softmax_with_fill(s, np.float16, -1e9)], 1)
    row = np.zeros((1, 2))
    empty = np.array(
        [
            softmax_with_fill(row, np.float32, -1e9)[0],
            softmax_with_fill(row, np.float16, -1e9)[0],
            softmax_with_fill(row, np.float32, -np.inf)[0],
        ]
    )
    steps = (
        Step(
            "fills",
            tr("lesson.fp16.fills", lang),
            tr("lesson.fp16.fills_formula", lang),
            stored,
            tuple(num(f) for f in fills),
            ("float32", "float16"),
            fill_lines,
            tr("lesson.fp16.fills_note", lang),
        ),
        Step(
            "causal",
            tr("lesson.fp16.causal", lang),
            "softmax(S + M),  M_01 = -1e9",
            causal,
            ("q0", "q1"),
            ("f32 k0", "f32 k1", "f16 k0", "f16 k1"),
            (tr("lesson.fp16.causal_line", lang),),
            tr("lesson.fp16.causal_note", lang),
        ),
        Step(
            "empty",
            tr("lesson.fp16.empty", lang),
            tr("lesson.fp16.empty_formula", lang),
            empty,
            ("float32, -1e9", "float16, -1e9", "-inf"),
            ("k0", "k1"),
            (tr("lesson.fp16.empty_line", lang),),
            tr("lesson.fp16.empty_note", lang),
        ),
    )
    return Explanation(title, source, steps, None, None, lang=lang)


# ------------------------------------------------------------------------------------------------- 000 self-test


def lesson_self_test(lang: str = "en") -> Explanation:
    """000's self-test on the four-position causal example: +100 on every legal score leaves the weights as they are
    (softmax ignores a shift of a whole row); a different bias per column, [0, 1, 2, 3], changes them."""
    from ..articles import example

    title, source = _head("self-test", lang)
    ex = example("causal-4")
    base = np.asarray(attention_trace(ex.q, ex.k, ex.v, causal=True).weights)
    shifted = np.asarray(attention_trace(ex.q, ex.k, ex.v, causal=True, bias=np.full((4, 4), 100.0)).weights)
    cb = np.asarray(example("column-bias").bias)
    col = np.asarray(attention_trace(ex.q, ex.k, ex.v, causal=True, bias=cb).weights)
    rows, cols = _labels("q", 4), _labels("k", 4)
    d1, d2 = float(np.abs(shifted - base).max()), float(np.abs(col - base).max())
    steps = (
        Step("base", tr("lesson.self.base", lang), "A = softmax(S + M)", base, rows, cols, (), ""),
        Step(
            "shift",
            tr("lesson.self.shift", lang),
            "softmax(S + 100 + M)",
            shifted,
            rows,
            cols,
            (tr("lesson.self.diff", lang, d=f"{d1:.1e}"),),
            tr("lesson.self.shift_note", lang),
        ),
        Step(
            "column_bias",
            tr("lesson.self.column", lang, b=vec(cb[0])),
            "softmax(S + b_j + M)",
            col,
            rows,
            cols,
            (tr("lesson.self.diff", lang, d=num(d2)),),
            tr("lesson.self.column_note", lang),
        ),
    )
    return Explanation(title, source, steps, col, None, lang=lang)


# ------------------------------------------------------------------------------------------------------ §10, §11


def lesson_multi_head(lang: str = "en") -> Explanation:
    """001 §10-§11 and 000's 512 / 8 / 64: the shape chain of a real layer, then 2 heads of width 2 by hand on
    ``x [3, 4]``: project, split, attention per head (scale 1/sqrt(d_head)), concat, ``W_O``; checked against
    :func:`attnlab.multi_head_attention`."""
    from ..articles import MULTI_HEAD as D
    from ..core.multihead import MultiHeadWeights, multi_head_attention

    title, source = _head("multi-head", lang)
    b, n, d_model, h = D.shapes
    dh = d_model // h
    chain = (
        f"X [B={b}, n={n}, d_model={d_model}]",
        f"Q = X W_Q, K = X W_K, V = X W_V: [B, n, d_model] = [{b}, {n}, {d_model}]",
        f"{tr('lesson.mh.split', lang)}: [B, n, h, d_head] = [{b}, {n}, {h}, {dh}] -> [B, h, n, d_head] = "
        f"[{b}, {h}, {n}, {dh}]",
        f"Q Kᵀ / sqrt(d_head = {dh}): [B, h, n, n] = [{b}, {h}, {n}, {n}]   softmax(dim=-1)",
        f"A V: [B, h, n, d_head] = [{b}, {h}, {n}, {dh}] -> [B, n, h, d_head] = [{b}, {n}, {h}, {dh}]",
        f"{tr('lesson.mh.concat', lang)}: [B, n, h · d_head] = [{b}, {n}, {h * dh}];  O = H W_O: [{b}, {n}, {d_model}]",
    )
    x = np.asarray(D.x, dtype=np.float64)
    q, k, v = x @ D.w_q, x @ D.w_k, x @ D.w_v  # [n, d_model]
    nn, dm = x.shape
    hh = D.heads
    w = dm // hh
    rows = _labels("x", nn)
    dcols = _labels("d", dm)
    steps = [
        Step(
            "shapes",
            tr("lesson.mh.shapes", lang),
            f"d_head = d_model / h = {d_model} / {h} = {dh}",
            None,
            lines=chain,
            note=tr("lesson.mh.shapes_note", lang),
        ),
        Step(
            "project",
            tr("lesson.mh.project", lang),
            f"Q = X W_Q, K = X W_K, V = X W_V   [n={nn}, d_model={dm}]",
            None,
            extra=(("X", x, rows, dcols), ("Q", q, rows, dcols), ("K", k, rows, dcols), ("V", v, rows, dcols)),
        ),
    ]
    split_lines = tuple(tr("lesson.mh.split_line", lang, r=r, a=r * w, b=(r + 1) * w - 1, w=w) for r in range(hh))
    steps.append(
        Step(
            "split",
            tr("lesson.mh.split", lang),
            f"Q_r = Q[:, r·d_head : (r+1)·d_head],  d_head = {dm} / {hh} = {w}",
            None,
            lines=split_lines,
        )
    )
    heads = []
    for r in range(hh):
        sl = slice(r * w, (r + 1) * w)
        t = attention_trace(q[:, sl], k[:, sl], v[:, sl])
        heads.append(np.asarray(t.output))
        steps.append(
            Step(
                f"head{r}",
                tr("lesson.mh.head", lang, r=r),
                f"H_{r} = softmax(Q_{r} K_{r}ᵀ / sqrt({w})) V_{r}",
                np.asarray(t.weights),
                rows,
                rows,
                (tr("lesson.mh.head_line", lang, w=w, s=num(t.scale), bad=num(1 / math.sqrt(dm)), dm=dm),),
                "",
                extra=((f"H_{r}", np.asarray(t.output), rows, _labels("d", w)),),
            )
        )
    hcat = np.concatenate(heads, axis=-1)  # [n, h · d_head]
    out = hcat @ D.w_o  # [n, d_model]
    mw = MultiHeadWeights(D.w_q, D.w_k, D.w_v, D.w_o, num_heads=hh)
    ref = np.asarray(multi_head_attention(x[None], None, mw).output)[0]
    diff = float(np.abs(ref - out).max())
    if diff > 1e-12:  # a core regression, never a user's input
        raise AssertionError("explain: multi-head by hand disagrees with attnlab.multi_head_attention")
    steps.append(
        Step(
            "concat",
            tr("lesson.mh.concat", lang),
            "H = Concat(H_0, …, H_{h-1})   " + f"[n={nn}, h·d_head={hh * w}]",
            hcat,
            rows,
            dcols,
            (),
            tr("lesson.mh.concat_note", lang),
        )
    )
    steps.append(
        Step(
            "w_o",
            tr("lesson.mh.w_o", lang),
            f"O = H W_O   [n={nn}, d_model={dm}]",
            out,
            rows,
            dcols,
            (tr("lesson.mh.check", lang, d=f"{diff:.1e}"),),
            tr("lesson.mh.w_o_note", lang),
            extra=(("W_O", np.asarray(D.w_o, dtype=np.float64), dcols, dcols),),
        )
    )
    return Explanation(title, source, tuple(steps), None, out, lang=lang)


# ------------------------------------------------------------------------------------------------------------ §9


def _numeric_grad(f: Any, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        g[idx] = (f(xp) - f(xm)) / (2 * eps)
    return g


def explain_backward(setup: Setup, d_out: Any = None, *, lang: str = "en") -> Explanation:
    """Article 001 §9 by hand for ``setup``: given ``G_O = ∂L/∂O [n_q, d_v]`` (default all ones, L = sum(O)),

    ``dV = Aᵀ G_O``, ``dA = G_O Vᵀ``, ``delta = rowsum(dA ∘ A)``, ``dS = A ∘ (dA - delta)``,
    ``dQ = dS K · scale``, ``dK = dSᵀ Q · scale`` (scale = 1/sqrt(d_k), temperature divided out), each checked
    against :func:`attnlab.attention_backward` and a central finite difference of ``L = sum(G_O ∘ O)``.
    """
    lang = check_lang(lang)
    masked_rows = "zero" if setup.masked_rows == "nan" else setup.masked_rows
    t = setup.trace(masked_rows=masked_rows)
    a = np.asarray(t.weights, dtype=np.float64)  # [n_q, n_k]
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (t.q, t.k, t.v))
    n_q, d_v = a.shape[0], v.shape[1]
    if d_out is None:
        g = np.ones((n_q, d_v))
    else:
        g = np.asarray(d_out, dtype=np.float64)
        if g.shape != (n_q, d_v):
            raise localized(ShapeError, "input.grad_out", shape=g.shape, want=(n_q, d_v))
    ql, kl = setup.qlabels, setup.klabels
    dcols = _labels("d", d_v)
    kcols = _labels("d", q.shape[1])
    dv = a.T @ g  # [n_k, d_v]
    da = g @ v.T  # [n_q, n_k]
    delta = (da * a).sum(-1, keepdims=True)  # [n_q, 1]
    ds = a * (da - delta)  # [n_q, n_k]
    ds_scores = ds / t.temperature * t.scale
    dq = ds_scores @ k  # [n_q, d_k]
    dk = ds_scores.T @ q  # [n_k, d_k]
    ref = attention_backward(t, g)
    checks = {
        "dV": float(np.abs(dv - np.asarray(ref.dv)).max()),
        "dQ": float(np.abs(dq - np.asarray(ref.dq)).max()),
        "dK": float(np.abs(dk - np.asarray(ref.dk)).max()),
    }
    if max(checks.values()) > 1e-9:
        raise AssertionError("explain: the backward by hand disagrees with attnlab.attention_backward")

    def loss(qq: np.ndarray, kk: np.ndarray, vv: np.ndarray) -> float:
        out = setup.with_options(q=qq, k=kk, v=vv).trace(masked_rows=masked_rows).output
        return float((np.asarray(out) * g).sum())

    fd = {
        "dQ": float(np.abs(_numeric_grad(lambda x: loss(x, k, v), q) - dq).max()),
        "dK": float(np.abs(_numeric_grad(lambda x: loss(q, x, v), k) - dk).max()),
        "dV": float(np.abs(_numeric_grad(lambda x: loss(q, k, x), v) - dv).max()),
    }
    small = n_q * a.shape[1] <= 16
    dv_lines = (
        tuple(
            f"dV[{kl[j]}] = " + " + ".join(f"{num(a[i, j])}×{vec(g[i])}" for i in range(n_q)) + f" = {vec(dv[j])}"
            for j in range(a.shape[1])
        )
        if small
        else ()
    )
    da_lines = (
        tuple(
            f"dA[{ql[i]},{kl[j]}] = G_O[{ql[i]}]·v[{kl[j]}] = {vec(g[i])}·{vec(v[j])} = {num(da[i, j])}"
            for i in range(n_q)
            for j in range(a.shape[1])
        )
        if small
        else ()
    )
    delta_lines = tuple(
        f"delta[{ql[i]}] = "
        + " + ".join(f"{num(da[i, j])}×{num(a[i, j])}" for j in range(a.shape[1]))
        + f" = {num(delta[i, 0])}"
        for i in range(n_q)
        if small
    )
    ds_lines = tuple(
        f"dS[{ql[i]},{kl[j]}] = {num(a[i, j])}×({num(da[i, j])} - {num(delta[i, 0])}) = {num(ds[i, j])}"
        for i in range(n_q)
        for j in range(a.shape[1])
        if small
    )
    scale_txt = f"1/sqrt({q.shape[1]}) = {num(t.scale)}" if setup.scale is None else num(t.scale)
    title = tr(
        "lesson.bw.title",
        lang,
        title=setup.title if setup.title != "Your matrices" else tr("label.your_matrices", lang),
    )
    steps = (
        Step(
            "forward",
            tr("lesson.bw.forward", lang),
            "S = Q Kᵀ / sqrt(d_k) + M;  A = softmax(S);  O = A V",
            a,
            ql,
            kl,
            (),
            "",
            extra=(("G_O", g, ql, dcols),),
        ),
        Step("dv", tr("lesson.bw.dv", lang), "dV = Aᵀ G_O", dv, kl, dcols, dv_lines, tr("lesson.bw.dv_note", lang)),
        Step("da", tr("lesson.bw.da", lang), "dA = G_O Vᵀ", da, ql, kl, da_lines, ""),
        Step(
            "ds",
            tr("lesson.bw.ds", lang),
            "dS = A ∘ (dA - rowsum(dA ∘ A))   (g_s = a ∘ (g_a - (g_a·a) 1))",
            ds,
            ql,
            kl,
            delta_lines + ds_lines,
            tr("lesson.bw.ds_note", lang),
            extra=(("delta", delta, ql, ("delta",)),),
        ),
        Step(
            "dq",
            tr("lesson.bw.dq", lang),
            f"dQ = dS K / sqrt(d_k)   (scale = {scale_txt})",
            dq,
            ql,
            kcols,
            (),
            "",
        ),
        Step("dk", tr("lesson.bw.dk", lang), "dK = dSᵀ Q / sqrt(d_k)", dk, kl, kcols, (), ""),
        Step(
            "check",
            tr("lesson.bw.check", lang),
            tr("lesson.bw.check_formula", lang),
            np.array([[checks[n], fd[n]] for n in ("dQ", "dK", "dV")]),
            ("dQ", "dK", "dV"),
            ("attention_backward", tr("lesson.bw.fd", lang)),
            (tr("lesson.bw.check_line", lang, a=f"{max(checks.values()):.1e}", f=f"{max(fd.values()):.1e}"),),
            tr("lesson.bw.check_note", lang),
        ),
    )
    return Explanation(title, setup.source, steps, a, np.asarray(t.output), setup=setup, trace=t, lang=lang)


# ----------------------------------------------------------------------------------------------------------- §18


def explain_dropout(setup: Setup, p: float = 0.5, *, seed: int = 0, lang: str = "en") -> Explanation:
    """Article 001 §18 for ``setup``: the weights A, a keep mask drawn with ``seed`` (:func:`attnlab.dropout`),
    ``Ã = A ∘ keep / (1 - p)``, its row sums (not 1, and that is not a bug), ``O = Ã V`` next to ``A V``, and
    ``E[Ã] = A`` over 20,000 masks."""
    from ..core.dropout import check_p, dropout

    lang = check_lang(lang)
    p = check_p(p, "p")
    t = setup.trace()
    a = np.asarray(t.weights, dtype=np.float64)
    v = np.asarray(t.v, dtype=np.float64)
    d = dropout(a, p, rng=np.random.default_rng(seed))
    keep = np.ones(a.shape, bool) if d.dropout is None else np.broadcast_to(d.dropout.keep, a.shape)
    ad = np.asarray(d.output, dtype=np.float64)
    ql, kl = setup.qlabels, setup.klabels
    dcols = _labels("d", v.shape[1])
    sums = ad.sum(-1)
    rng = np.random.default_rng(seed + 1)
    mean = (a[None] * (rng.random((20000, *a.shape)) >= p)).mean(0) / (1 - p) if p > 0 else a
    steps = (
        Step("weights", tr("lesson.do.weights", lang), "A = softmax(S + M)", a, ql, kl, (), ""),
        Step(
            "keep",
            tr("lesson.do.keep", lang, p=num(p), seed=seed),
            "keep_ij ~ Bernoulli(1 - p)",
            None,
            lines=tuple(_masks.to_string(keep).splitlines()),
            note=tr("lesson.do.keep_note", lang),
        ),
        Step(
            "dropped",
            tr("lesson.do.dropped", lang),
            f"Ã = A ∘ keep / (1 - p) = A ∘ keep / {num(1 - p)}",
            ad,
            ql,
            kl,
            tuple(tr("lesson.do.row_sum", lang, r=r, s=num(s)) for r, s in zip(ql, sums, strict=True)),
            tr("lesson.do.dropped_note", lang),
        ),
        Step(
            "output",
            tr("lesson.do.output", lang),
            "O = Ã V",
            ad @ v,
            ql,
            dcols,
            (),
            tr("lesson.do.output_note", lang),
            extra=(("A V", a @ v, ql, dcols),),
        ),
        Step(
            "mean",
            tr("lesson.do.mean", lang),
            "E[Ã] = A ∘ (1 - p) / (1 - p) = A",
            mean,
            ql,
            kl,
            (tr("lesson.do.mean_line", lang, d=num(float(np.abs(mean - a).max()), 3)),),
            tr("lesson.do.mean_note", lang),
        ),
    )
    title = tr(
        "lesson.do.title",
        lang,
        title=setup.title if setup.title != "Your matrices" else tr("label.your_matrices", lang),
    )
    return Explanation(title, setup.source, steps, ad, ad @ v, setup=setup, trace=t, lang=lang)


def lesson_dropout(lang: str = "en") -> Explanation:
    """001 §18 on the four-position causal example, p = 0.5, seed 0."""
    e = explain_dropout(setup_from_example("causal-4"), 0.5, seed=0, lang=lang)
    title, source = _head("dropout", lang)
    return Explanation(title, source, e.steps, e.weights, e.output, setup=e.setup, trace=e.trace, lang=lang)


# ---------------------------------------------------------------------------------------------------- growth, cost


def lesson_growth(lang: str = "en") -> Explanation:
    """000: T² score elements, 1,024 -> 4,096 tokens = 4x the length and 16x the elements (float32 MiB per head)."""
    from ..cost import score_elements

    title, source = _head("growth", lang)
    ts = (1024, 2048, 4096)
    m = np.array([[t, score_elements(t), score_elements(t) * 4 / 2**20] for t in ts], dtype=np.float64)
    a, b = score_elements(1024), score_elements(4096)
    steps = (
        Step(
            "growth",
            tr("lesson.growth.step", lang),
            "T² = T · T",
            m,
            tuple(f"T={t:,}" for t in ts),
            ("T", "T²", "MiB (float32)"),
            (tr("lesson.growth.line", lang, a=f"{a:,}", b=f"{b:,}", r=b // a),),
            tr("lesson.growth.note", lang),
        ),
    )
    return Explanation(title, source, steps, None, None, lang=lang)


def lesson_complexity(lang: str = "en") -> Explanation:
    """001 §13-§15 with the articles' d_model 512 and 8 heads: FLOPs of the projections and of Q Kᵀ / A V for
    n = 128 .. 8,192, the score matrix's memory O(B h n²), the crossover length, heads at a fixed d_model, and the
    KV cache formula."""
    from ..cost import attention_cost, crossover_length, kv_cache_bytes

    title, source = _head("complexity", lang)
    ns = (128, 512, 1024, 4096, 8192)
    rows = []
    for n in ns:
        c = attention_cost(n, d_model=512, heads=8, dtype="float32")
        rows.append([c.projection_flops / 1e9, c.attention_flops / 1e9, c.score_bytes / 2**20])
    cross = crossover_length(512, heads=8)
    h8 = attention_cost(1024, d_model=512, heads=8).attention_flops
    h16 = attention_cost(1024, d_model=512, heads=16).attention_flops
    kv = kv_cache_bytes(batch=1, seq_len=4096, layers=32, kv_heads=8, head_dim=128, dtype="float16") / 2**20
    kv_mha = kv_cache_bytes(batch=1, seq_len=4096, layers=32, kv_heads=32, head_dim=128, dtype="float16") / 2**20
    steps = (
        Step(
            "flops",
            tr("lesson.cost.flops", lang),
            tr("lesson.cost.formula", lang),
            np.array(rows),
            tuple(f"n={n:,}" for n in ns),
            (tr("lesson.cost.col_proj", lang), "GFLOP QKᵀ+AV", tr("lesson.cost.col_mem", lang)),
            (tr("lesson.cost.cross", lang, n=num(cross, 1)),),
            tr("lesson.cost.flops_note", lang),
        ),
        Step(
            "heads",
            tr("lesson.cost.heads", lang),
            "h · d_head = d_model",
            None,
            lines=(tr("lesson.cost.heads_line", lang, a=f"{h8:,}", b=f"{h16:,}"),),
            note=tr("lesson.cost.heads_note", lang),
        ),
        Step(
            "kv",
            tr("lesson.cost.kv", lang),
            tr("lesson.cost.kv_formula", lang),
            None,
            lines=(
                tr("lesson.cost.kv_gqa", lang, x=num(kv)),
                tr("lesson.cost.kv_mha", lang, x=num(kv_mha)),
            ),
            note=tr("lesson.cost.kv_note", lang),
        ),
    )
    return Explanation(title, source, steps, None, None, lang=lang)


# ----------------------------------------------------------------------------------------------- §17.3, §20 leak


def lesson_leak_test(lang: str = "en") -> Explanation:
    """001 §17.3 and §20: three tokens; change the last one (its key and value) and compare the outputs. Under the
    causal mask (j <= i) the first two outputs do not move; with the mask written the wrong way (j >= i) the first
    query reads the future and its output moves."""
    title, source = _head("leak-test", lang)
    q = np.array([[1.0, 0], [0, 1], [1, 1]])
    k = q.copy()
    v = np.array([[1.0, 0], [0, 1], [1, 1]])
    k2, v2 = k.copy(), v.copy()
    k2[2], v2[2] = [3.0, -1.0], [50.0, 50.0]
    right = masks_right = _masks.causal(3)
    wrong = masks_right.T.copy()  # j >= i: the inverted direction
    diffs = []
    for allowed in (right, wrong):
        o1 = np.asarray(attention_trace(q, k, v, allowed).output)
        o2 = np.asarray(attention_trace(q, k2, v2, allowed).output)
        diffs.append(np.abs(o2 - o1).max(-1))
    m = np.array(diffs).T  # [3, 2]
    rows = _labels("q", 3)
    steps = (
        Step(
            "masks",
            tr("lesson.leak.masks", lang),
            "j <= i  |  j >= i",
            None,
            lines=(
                *(tr("lesson.leak.right", lang),),
                *_masks.to_string(right).splitlines(),
                tr("lesson.leak.wrong", lang),
                *_masks.to_string(wrong).splitlines(),
            ),
        ),
        Step(
            "change",
            tr("lesson.leak.change", lang),
            "max_d |O'(x) - O(x)|",
            m,
            rows,
            ("j <= i", "j >= i"),
            (tr("lesson.leak.line", lang, a=num(m[0, 0]), b=num(m[0, 1])),),
            tr("lesson.leak.note", lang),
        ),
    )
    return Explanation(title, source, steps, None, None, notes=(tr("lesson.leak.caveat", lang),), lang=lang)


def lesson_mask_not_access(lang: str = "en") -> Explanation:
    """001 §17.5 (and §21's "permissions"): a mask is a computation constraint, not access control. Three tokens
    (secret, a, b) under the causal mask with b's connection to the secret removed too: b's weight on the secret is
    exactly 0 in every layer, yet after a second layer b's output moves when the secret changes, because a read it
    in the first layer and b reads a."""
    title, source = _head("mask-not-access", lang)
    x = np.array([[1.0, 0], [0, 1], [1, 1]])
    allowed = _masks.causal(3).copy()
    allowed[2, 0] = False  # b may not see the secret
    v = x.copy()
    v2 = v.copy()
    v2[0] = [100.0, 0.0]  # another secret
    a = np.asarray(attention_trace(x, x, v, allowed).weights)
    moves = []
    for layers in (1, 2):
        o, o2 = v, v2
        for _ in range(layers):
            o, o2 = a @ o, a @ o2
        moves.append(np.abs(o2 - o).max(-1))
    m = np.array(moves).T  # [3, 2]: rows secret, a, b; columns after 1 and 2 layers
    rows = (tr("lesson.access.secret", lang), "a", "b")
    via = a[2, 1] * a[1, 0] * 99.0
    steps = (
        Step(
            "weights",
            tr("lesson.access.weights", lang),
            "A = softmax(Q Kᵀ / sqrt(d_k) + M)",
            a,
            rows,
            rows,
            (tr("lesson.access.zero", lang, w=num(a[2, 0])),),
        ),
        Step(
            "layers",
            tr("lesson.access.layers", lang),
            "O_1 = A V,  O_2 = A O_1",
            m,
            rows,
            (tr("lesson.access.col1", lang), tr("lesson.access.col2", lang)),
            (
                tr("lesson.access.line", lang, one=num(m[2, 0]), two=num(m[2, 1])),
                tr("lesson.access.via", lang, a=num(a[2, 1]), b=num(a[1, 0]), x=num(via)),
            ),
            tr("lesson.access.note", lang),
        ),
    )
    return Explanation(title, source, steps, None, None, notes=(tr("lesson.access.where", lang),), lang=lang)


def lesson_long_context(lang: str = "en") -> Explanation:
    """001 §19: what doubling the length costs. Score elements of full and causal attention grow 4x, a sliding
    window of 1,024 keys about 2x, the KV cache 2x (it is linear in the length); MQA/GQA shrink the cache by
    the ratio of heads. Each option changes what is computed or stored (FlashAttention does not: it is exact)."""
    from ..cost import causal_pairs, kv_cache_bytes, score_elements, window_pairs

    title, source = _head("long-context", lang)
    ns, w = (4096, 8192), 1024

    def kv(n: int, heads: int) -> float:
        return kv_cache_bytes(batch=1, seq_len=n, layers=32, kv_heads=heads, head_dim=128, dtype="float16") / 2**20

    table = np.array(
        [
            [score_elements(n) for n in ns],
            [causal_pairs(n) for n in ns],
            [window_pairs(n, w) for n in ns],
            [kv(n, 32) for n in ns],
            [kv(n, 8) for n in ns],
            [kv(n, 1) for n in ns],
        ],
        dtype=np.float64,
    )
    table = np.concatenate([table, table[:, 1:] / table[:, :1]], axis=1)
    rows = tuple(tr(f"lesson.long.row{i}", lang, w=f"{w:,}") for i in range(6))
    cols = ("n=4,096", "n=8,192", "×")
    steps = (
        Step(
            "double",
            tr("lesson.long.step", lang),
            "O(n²)",
            table,
            rows,
            cols,
            (
                tr(
                    "lesson.long.line",
                    lang,
                    full=num(table[0, 2]),
                    win=num(table[2, 2]),
                    w=f"{w:,}",
                    kv=num(table[3, 2]),
                ),
                tr("lesson.long.gqa", lang, g=num(table[3, 0] / table[4, 0]), m=num(table[3, 0] / table[5, 0])),
            ),
            tr("lesson.long.note", lang),
        ),
    )
    return Explanation(title, source, steps, None, None, notes=(tr("lesson.long.measure", lang),), lang=lang)


def lesson_invariants(lang: str = "en") -> Explanation:
    """001 §21: the six invariants every attention implementation must keep, each checked with its number on a
    cross-attention call (2 queries, 3 keys, the third key masked for the first query), then by
    :func:`attnlab.invariants.check`."""
    from ..invariants import check

    title, source = _head("invariants", lang)
    q = np.array([[1.0, 0], [0, 1]])
    k = np.array([[1.0, 0], [0, 1], [1, 1]])
    v = np.array([[10.0, 0], [0, 10], [5, 5]])
    allowed = np.array([[True, True, False], [True, True, True]])
    t = attention_trace(q, k, v, allowed)
    a, o = np.asarray(t.weights), np.asarray(t.output)
    sums = a.sum(-1)
    agg = float(np.abs(o - a @ v).max())
    violations = check(t)
    lines = (
        tr("lesson.inv.shape", lang, s=list(np.shape(np.asarray(t.scores)))),
        tr("lesson.inv.masked", lang, x=num(float(np.abs(a[~allowed]).max()))),
        tr("lesson.inv.sums", lang, s=", ".join(num(x) for x in sums)),
        tr("lesson.inv.agg", lang, ok=tr("lesson.inv.yes" if agg <= 1e-12 else "lesson.inv.no", lang)),
        tr("lesson.inv.dk", lang, a=q.shape[1], b=k.shape[1]),
        tr("lesson.inv.nk", lang, a=k.shape[0], b=v.shape[0]),
        tr("lesson.inv.check", lang, n=len(violations)),
    )
    steps = (
        Step(
            "invariants",
            tr("lesson.inv.step", lang),
            "Q, K, V -> Q Kᵀ / sqrt(d_k) -> Mask -> Softmax -> A V",
            a,
            _labels("q", 2),
            _labels("k", 3),
            lines,
            tr("lesson.inv.note", lang),
        ),
    )
    return Explanation(title, source, steps, a, o, lang=lang)


#: lesson name (a key of :data:`attnlab.articles.LESSONS`) -> function ``(lang) -> Explanation``.
LESSON_FUNCTIONS = {
    "variance": lesson_variance,
    "overflow": lesson_overflow,
    "fp16-mask": lesson_fp16_mask,
    "self-test": lesson_self_test,
    "multi-head": lesson_multi_head,
    "dropout": lesson_dropout,
    "growth": lesson_growth,
    "complexity": lesson_complexity,
    "leak-test": lesson_leak_test,
    "mask-not-access": lesson_mask_not_access,
    "long-context": lesson_long_context,
    "invariants": lesson_invariants,
}


def explain_lesson(name: str, lang: str = "en") -> Explanation:
    """The lesson ``name`` (see :data:`attnlab.articles.LESSONS`) in ``lang`` ("en" or "zh")."""
    lang = check_lang(lang)
    if name not in LESSON_FUNCTIONS:
        raise KeyError(f"no lesson {name!r}; choose one of {', '.join(LESSON_FUNCTIONS)}")
    return LESSON_FUNCTIONS[name](lang)


def explain_example(name: str, *, lang: str = "en", **options: Any) -> Explanation:
    """The worked example or lesson ``name`` of :mod:`attnlab.articles`, step by step (``options`` as for
    :func:`explain`; ``lang`` "en" or "zh").

    >>> explain_example("2x2").weights.round(4).tolist()
    [[0.6698, 0.3302], [0.3302, 0.6698]]
    """
    from ..articles import LESSONS, example

    lang = check_lang(lang)
    ex = example(name)
    if name in LESSONS:
        return explain_lesson(name, lang)
    title = tr(f"title.{name}", lang)
    source = tr("render.article", lang, source=tr(f"source.{name}", lang))
    if ex.weights is not None:
        return explain_weighted_average(ex.weights, ex.v, title=title, source=source, lang=lang)
    if ex.logits:
        return explain_softmax(*ex.logits, title=title, source=source, lang=lang)
    return explain_setup(setup_from_example(name, lang=lang, **options), lang=lang)
