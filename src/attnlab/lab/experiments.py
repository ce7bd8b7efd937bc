"""The lab's live experiments: the articles' lessons that are not one attention computation, recomputed from controls.

Each :class:`Experiment` is a list of :class:`Control` values (what the page shows: sliders, pickers, text boxes)
and a pure function of their values (and, for the lessons on Q, K, V, of the lab's own inputs, a
:class:`~attnlab.lab.logic.LabState`) that returns an :class:`Outcome`: the numbers, the HTML that shows them and
whether the controls are at the article's setting (then the article's numbers are marked). Every number comes from
attnlab's own functions (:mod:`attnlab.explain`'s lessons, :mod:`attnlab.cost`, the core); bad input gives a message
in the outcome, never an exception.

>>> out = run(EXPERIMENTS["growth"], {"t": 4096, "base": 1024})
>>> out.ok, out.article, out.numbers["elements"], out.numbers["ratio"]
(True, True, 16777216, 16.0)
>>> run(EXPERIMENTS["multi-head"], {"d_model": 500, "heads": 8, "n": 4, "batch": 1}).ok
False
"""

from __future__ import annotations

import functools
import html
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..explain.fmt import num, vec
from .i18n import t

__all__ = [
    "EXPERIMENTS",
    "Control",
    "Experiment",
    "Outcome",
    "experiment_for",
    "item_box",
    "run",
    "uses_qkv",
]


@dataclass(frozen=True)
class Control:
    """One control of an experiment. ``kind``: "slider", "number", "dropdown", "text", "area" (several lines) or
    "checkbox"; ``label`` English (the catalogue's key); ``options`` ``(English label, value)`` pairs of a dropdown."""

    name: str
    kind: str
    label: str
    value: Any
    start: float = 0
    stop: float = 1
    step: float = 1
    options: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Outcome:
    """What an experiment computed: ``ok`` and ``numbers`` (name -> number or array), or not ``ok`` and a
    ``message``; ``html`` shows either (``data-testid="al-x"``); ``article``: the controls are at the article's
    setting, so the article's numbers are marked."""

    key: str
    ok: bool
    html: str
    message: str = ""
    numbers: Mapping[str, Any] = field(default_factory=dict)
    article: bool = False


@dataclass(frozen=True)
class Experiment:
    """A live experiment: ``controls``, ``article`` (the control values of the article's setting) and
    ``compute(values, state, lang) -> (numbers, html body)``. ``uses_state``: it reads the lab's Q, K, V
    (``preset_state`` is the preset's, so that an edit is seen as leaving the article's setting)."""

    key: str
    title: str
    controls: tuple[Control, ...]
    article: Mapping[str, Any]
    compute: Callable[[Mapping[str, Any], Any, str], tuple[dict[str, Any], str]]
    uses_state: bool = False
    preset_state: Any = None

    def defaults(self) -> dict[str, Any]:
        """The controls' starting values (the article's setting)."""
        return {c.name: c.value for c in self.controls}


# ------------------------------------------------------------------------------------------------------ rendering


def _table(name: str, m: Any, rows: Any, cols: Any, caption: str = "", *, lang: str = "en", **kw: Any) -> str:
    from .logic import matrix_html

    m = np.atleast_2d(np.asarray(m, dtype=np.float64))
    return matrix_html(m, tuple(rows), tuple(cols), table_id=f"al-x-{name}", caption=caption, lang=lang, **kw)


def _value(name: str, x: Any, text: str | None = None) -> str:
    """One number on the page, with its exact value in ``data-value`` (``data-testid="al-x-NAME"``)."""
    shown = html.escape(num(x) if text is None else text)
    return f'<code data-testid="al-x-{name}" data-value="{float(x)!r}">{shown}</code>'


def _p(*parts: str) -> str:
    return "<p style='margin:4px 0'>" + " ".join(parts) + "</p>"


def _esc(text: str) -> str:
    return html.escape(text)


def _labels(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(n))


def _int(values: Mapping[str, Any], name: str, lo: int, hi: int) -> int:
    x = values.get(name)
    try:
        v = float(x)  # type: ignore[arg-type]  # x is any widget value; float() refusing it is the check
    except (TypeError, ValueError):
        raise ValueError(f"{name}: {x!r}") from None
    if not v.is_integer() or not lo <= v <= hi:
        raise ValueError(f"{name}: {x!r}")
    return int(v)


def _float(values: Mapping[str, Any], name: str, lo: float, hi: float) -> float:
    x = values.get(name)
    try:
        v = float(x)  # type: ignore[arg-type]  # x is any widget value; float() refusing it is the check
    except (TypeError, ValueError):
        raise ValueError(f"{name}: {x!r}") from None
    if not (math.isfinite(v) and lo <= v <= hi):
        raise ValueError(f"{name}: {x!r}")
    return v


class _Bad(Exception):
    """An input the experiment cannot use: the message (already in the page's language) is shown."""


def _range_message(err: ValueError, exp: Experiment, lang: str) -> str:
    name = str(err).split(":", 1)[0]
    for c in exp.controls:
        if c.name == name:
            return t(
                lang,
                "{label}: expected a whole number from {lo} to {hi}"
                if c.kind in ("slider", "number") and float(c.step).is_integer()
                else "{label}: expected a number from {lo} to {hi}",
                label=t(lang, c.label),
                lo=num(c.start),
                hi=num(c.stop),
            )
    return str(err)


def _matrix(text: str, name: str, lang: str) -> np.ndarray:
    from ..explain.inputs import parse_matrix
    from ..i18n import error_message

    try:
        return parse_matrix(str(text), name)
    except Exception as err:  # the library's own message about what was typed
        raise _Bad(error_message(err, lang)) from None


def run(exp: Experiment, values: Mapping[str, Any], state: Any = None, lang: str = "en") -> Outcome:
    """Run ``exp`` on the control ``values`` (missing ones: the defaults) and, for an experiment on Q, K, V, the lab's
    ``state``. Never raises: a bad value gives ``ok=False`` and a message (in ``lang``)."""
    from ..errors import AttnlabError
    from ..i18n import error_message
    from .logic import error_html

    vals = {**exp.defaults(), **{k: v for k, v in dict(values or {}).items() if v is not None}}
    article = all(_same(vals.get(k), v) for k, v in exp.article.items())
    if exp.uses_state:
        article = article and state is not None and state == exp.preset_state
    try:
        if exp.uses_state and state is None:
            raise _Bad(t(lang, "This experiment reads the lab's Q, K and V."))
        numbers, body = exp.compute(vals, state, lang)
    except _Bad as err:
        return _fail(exp, str(err), lang, error_html)
    except ValueError as err:
        msg = _range_message(err, exp, lang) if not isinstance(err, AttnlabError) else error_message(err, lang)
        return _fail(exp, msg, lang, error_html)
    except AttnlabError as err:
        return _fail(exp, error_message(err, lang), lang, error_html)
    if article:
        note = t(lang, "At the article's setting: the article's numbers are marked.")
    else:
        note = t(
            lang, "Not the article's setting: recomputed for your values (the article: {what}).", what=_what(exp, lang)
        )
    head = (
        f'<div data-testid="al-x" data-key="{exp.key}" data-ok="true" data-article="{str(article).lower()}" '
        f'style="color:#000;margin:6px 0">'
        f"<p data-testid='al-x-note' style='margin:4px 0;color:#333'><i>{_esc(note)}</i></p>"
    )
    if article:  # the article's numbers: every number the experiment names (a <code data-testid="al-x-...">)
        body = re.sub(
            r'<code (data-testid="al-x-[^"]*")(.*?)</code>',
            r"<mark style='background:#ffe08a'><code data-marked=\"true\" \1\2</code></mark>",
            body,
        )
    return Outcome(exp.key, True, head + body + "</div>", "", numbers, article)


def _fail(exp: Experiment, message: str, lang: str, error_html: Callable[[str, str], str]) -> Outcome:
    return Outcome(
        exp.key,
        False,
        f'<div data-testid="al-x" data-key="{exp.key}" data-ok="false">' + error_html(message, "al-x-error") + "</div>",
        message,
    )


def _same(a: Any, b: Any) -> bool:
    if isinstance(b, (set, frozenset)):
        return a in b
    if isinstance(b, bool) or isinstance(a, bool):
        return bool(a) == bool(b)
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        try:
            return float(a) == float(b)
        except (TypeError, ValueError):
            return False
    return str(a).strip() == str(b).strip()


def _what(exp: Experiment, lang: str) -> str:
    byname = {c.name: c for c in exp.controls}
    parts = []
    for k, v in exp.article.items():
        c = byname[k]
        if isinstance(v, (set, frozenset)):
            v = " / ".join(num(x) if isinstance(x, (int, float)) else str(x) for x in sorted(v, key=str))
        elif c.kind == "checkbox":
            v = t(lang, "on") if v else t(lang, "off")
        elif c.kind == "dropdown":
            v = next((t(lang, lab) for lab, val in c.options if val == v), v)
        elif isinstance(v, float | int):
            v = num(v)
        parts.append(f"{t(lang, c.label)} = {v}")
    if exp.uses_state:
        parts.append(t(lang, "the preset's Q, K, V"))
    return ("；" if lang == "zh" else "; ").join(parts)


# ------------------------------------------------------------------------------------------------- the experiments


def _step_matrix(e: Any, step: str) -> np.ndarray:
    """The matrix of explanation ``e``'s step named ``step`` (every step an experiment reads has one)."""
    m = e.step(step).matrix
    if m is None:
        raise RuntimeError(f"explanation step {step!r} has no matrix")
    return np.asarray(m)


def _variance(vals: Mapping[str, Any], state: Any, lang: str) -> tuple[dict[str, Any], str]:
    from ..articles import VARIANCE_DK
    from ..explain.lessons import lesson_variance

    d = _int(vals, "d_k", 1, 1024)
    samples = _int(vals, "samples", 100, 20000)
    seed = _int(vals, "seed", 0, 10**6)
    dks = VARIANCE_DK if d in VARIANCE_DK else (*VARIANCE_DK, d)  # the article's widths first: the same draws
    e = lesson_variance(lang, samples=samples, seed=seed, dks=dks)
    m, ms = _step_matrix(e, "variance"), _step_matrix(e, "saturation")
    i = dks.index(d)
    numbers = {
        "var": float(m[i, 0]),
        "std": float(m[i, 1]),
        "var_scaled": float(m[i, 2]),
        "max_unscaled": float(ms[i, 0]),
        "max_scaled": float(ms[i, 1]),
        "table": m,
    }
    body = _p(
        t(lang, "d_k = {d}, {n} samples, seed {s}:", d=d, n=f"{samples:,}", s=seed),
        "Var(q·k) = " + _value("var", m[i, 0], num(m[i, 0], 2)),
        t(lang, "(≈ d_k = {d});", d=d),
        "Var(q·k/√d_k) = " + _value("var_scaled", m[i, 2], num(m[i, 2], 3)),
        t(lang, "(≈ 1)."),
    ) + _p(
        t(lang, "The largest of 16 softmax weights, on average: unscaled"),
        _value("max_unscaled", ms[i, 0], num(ms[i, 0], 3)) + ",",
        t(lang, "scaled"),
        _value("max_scaled", ms[i, 1], num(ms[i, 1], 3)) + ".",
    )
    body += _table(
        "variance", m, (f"d_k={x}" for x in dks), ("Var(q·k)", "std(q·k)", "Var(q·k/√d_k)"), lang=lang, shade=False
    )
    return numbers, body


#: The fills of the mask-dtype trap: picker value -> (English label, fill given the dtype's finfo).
_FILLS: dict[str, tuple[str, Callable[[Any], float]]] = {
    "-inf": ("−inf", lambda dt: -math.inf),
    "-1e4": ("−1e4", lambda dt: -1e4),
    "-1e9": ("−1e9", lambda dt: -1e9),
    "finfo32": ("finfo(float32).min", lambda dt: float(np.finfo(np.float32).min)),
    "finfo": ("finfo(dtype).min", lambda dt: float(_finfo_min(dt))),
}


def _dtype(name: str) -> Any:
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise _Bad("bfloat16 needs the ml_dtypes package (pip install ml_dtypes)") from None
        return np.dtype(ml_dtypes.bfloat16)
    if name not in ("float16", "float32", "float64"):
        raise _Bad(f"dtype: {name!r}")
    return np.dtype(name)


def _finfo_min(dt: Any) -> float:
    if dt.name == "bfloat16":
        import ml_dtypes

        return float(ml_dtypes.finfo(ml_dtypes.bfloat16).min)
    return float(np.finfo(dt).min)


def _cast(x: Any, dt: Any) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, dtype=np.float64).astype(np.float32).astype(dt)


def _softmax_in(x: np.ndarray, dt: Any) -> np.ndarray:
    """The stable softmax of ``x [..., n]`` computed in the dtype ``dt`` (each operation rounded to it)."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = _cast(x, dt)
        z = np.exp((y - y.max(-1, keepdims=True)).astype(dt)).astype(dt)
        return (z / z.sum(-1, keepdims=True).astype(dt)).astype(dt).astype(np.float64)


def _mask_fill(vals: Mapping[str, Any], state: Any, lang: str) -> tuple[dict[str, Any], str]:
    from .. import masks

    dname = str(vals.get("dtype"))
    if str(vals.get("fill")) not in _FILLS:
        raise _Bad(f"fill: {vals.get('fill')!r}")
    dt = _dtype(dname)
    label, fill_of = _FILLS[str(vals.get("fill"))]
    fill = fill_of(dt)
    stored = float(_cast(fill, dt))
    blocked = ~masks.causal(2)
    s = np.array([[1 / math.sqrt(2), 0.0], [0.0, 1 / math.sqrt(2)]])  # the 2×2 example's scores
    causal = _softmax_in(np.where(blocked, fill, s), dt)
    empty = _softmax_in(np.full((1, 2), fill), dt)[0]  # a row whose every key is masked
    numbers = {"stored": stored, "causal": causal, "empty": empty}
    over = math.isfinite(fill) and not math.isfinite(stored)
    body = _p(
        t(lang, "The fill {f} stored in {dt}:", f=label, dt=dname),
        _value("stored", stored),
        _esc(t(lang, "← overflow: a finite fill became −inf")) if over else "",
    )
    body += _table("causal", causal, ("q0", "q1"), ("k0", "k1"), t(lang, "the 2×2 causal example, softmax(S + M)"))
    body += _table("empty", empty, (t(lang, "all masked"),), ("k0", "k1"), t(lang, "a row with every key masked"))
    if np.isnan(empty).any():
        verdict = t(lang, "The fully masked row is NaN: −inf − (−inf) = NaN. Handle such rows explicitly.")
    else:
        verdict = t(
            lang,
            "The fully masked row is a uniform {w}: with a finite fill softmax silently attends to masked keys.",
            w=vec(empty),
        )
    return numbers, body + _p(_esc(verdict))


def _overflow(vals: Mapping[str, Any], state: Any, lang: str) -> tuple[dict[str, Any], str]:
    from ..core import softmax

    x = _matrix(vals.get("logits", ""), "logits", lang)
    if x.shape[0] != 1 or x.shape[1] > 8:
        raise _Bad(t(lang, "logits: expected one row of at most 8 numbers"))
    dname = str(vals.get("dtype"))
    dt = _dtype(dname)
    with np.errstate(over="ignore", invalid="ignore"):
        raw = np.exp(_cast(x, dt)).astype(dt)
        naive = (raw / raw.sum(-1, keepdims=True)).astype(dt).astype(np.float64)[0]
    stable = _softmax_in(x, dt)[0]
    ref = np.asarray(softmax(x))[0]  # float64, the core's stable softmax
    limit = math.log(float(np.finfo(np.float32).max if dt.name == "bfloat16" else np.finfo(dt).max))
    numbers = {"naive": naive, "stable": stable, "reference": ref, "limit": limit, "raw": raw.astype(np.float64)[0]}
    cols = _labels("x", x.shape[1])
    body = _p(t(lang, "exp overflows in {dt} above x =", dt=dname), _value("limit", limit, num(limit, 2)))
    body += _table("exp", raw.astype(np.float64), ("exp(x)",), cols, t(lang, "without the max: exp(x)"), shade=False)
    body += _table("naive", naive, ("A",), cols, t(lang, "without the max: exp(x) / Σ exp(x)"), shade=False)
    body += _table("stable", stable, ("A",), cols, t(lang, "with the max: exp(x − max) / Σ exp(x − max)"), shade=False)
    return numbers, body


def _setup(state: Any, lang: str) -> Any:
    from ..errors import AttnlabError
    from ..i18n import error_message
    from .logic import setup_of

    try:
        return setup_of(state)
    except (AttnlabError, ValueError) as err:
        raise _Bad(error_message(err, lang)) from None


def _mistakes(vals: Mapping[str, Any], state: Any, lang: str) -> tuple[dict[str, Any], str]:
    from ..explain.i18n import tr
    from ..explain.mistakes import MISTAKES, compare

    setup = _setup(state, lang)
    chosen = [n for n in MISTAKES if vals.get(n)]
    right = compare(setup, next(iter(MISTAKES)), lang=lang)
    numbers: dict[str, Any] = {"right": right.right_weights, "right_output": right.right_output}
    ql, kl = setup.qlabels, setup.klabels
    cells = [
        "<div>"
        + _table("right", right.right_weights, ql, kl, t(lang, "the right way: A"), lang=lang, shade=True)
        + _p(t(lang, "row sums"), vec(right.right_weights.sum(-1)))
        + "</div>"
    ]
    for n in chosen:
        mk = compare(setup, n, lang=lang)
        numbers[f"{n}.wrong"] = mk.wrong_weights
        numbers[f"{n}.sums"] = mk.wrong_row_sums
        cells.append(
            "<div style='max-width:460px'>"
            + _table(f"wrong-{n}", mk.wrong_weights, ql, kl, tr(f"mistake.{n}", lang), lang=lang, shade=True)
            + _p(
                t(lang, "row sums"),
                ", ".join(_value(f"sum-{n}-{i}", x) for i, x in enumerate(mk.wrong_row_sums)),
            )
            + _p(_esc(mk.explanation))
            + "</div>"
        )
    if not chosen:
        cells.append(_p(t(lang, "Tick a mistake to see it next to the right way.")))
    return numbers, "<div style='display:flex;gap:24px;flex-wrap:wrap'>" + "".join(cells) + "</div>"


def _online(vals: Mapping[str, Any], state: Any, lang: str) -> tuple[dict[str, Any], str]:
    from ..explain.online import explain_online

    setup = _setup(state, lang)
    block = _int(vals, "block_k", 1, 32)
    e = explain_online(setup, block, lang=lang)
    blocks = [s for s in e.steps if s.key.startswith("block") and s.key != "blocks"]
    step = min(_int(vals, "step", 1, 32), len(blocks))
    ql = setup.qlabels
    m_prev = np.full(len(ql), -np.inf) if step == 1 else blocks[step - 2].extra[0][1][:, 0]
    cur = blocks[step - 1]
    m_i, l_i, acc = cur.extra[0][1][:, 0], cur.extra[1][1][:, 0], cur.extra[2][1]
    base = np.where(np.isfinite(m_i), m_i, 0.0)
    alpha = np.where(np.isfinite(m_prev), np.exp(m_prev - base), 0.0)  # the rescale of what was summed so far
    numbers = {"m_i": m_i, "l_i": l_i, "alpha": alpha, "acc": acc, "p": cur.matrix, "blocks": len(blocks)}
    stats = np.stack([m_i, l_i, alpha], axis=1)
    body = _p(
        _esc(t(lang, "Key block {b} of {n} (keys {keys}):", b=step, n=len(blocks), keys=", ".join(cur.cols))),
        _esc(t(lang, "running max m_i, running sum l_i and the rescale factor α = exp(m_old − m_new).")),
    )
    body += "<div style='display:flex;gap:24px;flex-wrap:wrap'>"
    body += _table("online", stats, ql, ("m_i", "l_i", "α"), t(lang, "after this block"), lang=lang, shade=False)
    body += _table("p", cur.matrix, ql, cur.cols, "P = exp(S_b − m_i)", lang=lang, shade=False)
    body += _table("acc", acc, ql, _labels("d", acc.shape[1]), "acc", lang=lang, shade=False)
    body += "</div>"
    body += _p("α:", ", ".join(f"{r} " + _value(f"alpha-{r}", a) for r, a in zip(ql, alpha, strict=True)))
    body += "".join(_p(f"<code>{_esc(line)}</code>") for line in cur.lines)
    if step == len(blocks):
        out = _step_matrix(e, "normalize")
        numbers["output"] = out
        dense = np.asarray(e.trace.output, dtype=np.float64) if e.trace is not None else out
        body += _table("out", out, ql, _labels("d", out.shape[1]), t(lang, "O = acc / l_i (the last block)"), lang=lang)
        body += _p(
            _esc(
                t(
                    lang,
                    "largest difference from the dense softmax: {d}",
                    d=f"{np.nanmax(np.abs(out - dense), initial=0):.1e}",
                )
            )
        )
    else:
        body += _p(_esc(t(lang, "Step on to the last block to divide once: O = acc / l_i.")))
    return numbers, body


def _dropout(vals: Mapping[str, Any], state: Any, lang: str) -> tuple[dict[str, Any], str]:
    from ..explain.lessons import explain_dropout
    from ..explain.steps import setup_from_example

    p = _float(vals, "p", 0.0, 0.95)
    seed = _int(vals, "seed", 0, 10**6)
    e = explain_dropout(setup_from_example("causal-4"), p, seed=seed, lang=lang)
    dropped = _step_matrix(e, "dropped")
    sums = dropped.sum(-1)
    setup = e.setup
    if setup is None:  # explain_dropout always explains a setup
        raise RuntimeError("explain_dropout returned no setup")
    ql, kl = setup.qlabels, setup.klabels
    numbers = {"dropped": dropped, "sums": sums, "output": e.step("output").matrix}
    body = _p(_esc(t(lang, "causal-4, p = {p}, seed {s}: Ã = A ∘ keep / (1 − p)", p=num(p), s=seed)))
    body += _table("dropped", dropped, ql, kl, "Ã", lang=lang, shade=True)
    body += _p(
        t(lang, "row sums:"),
        ", ".join(f"{r} = " + _value(f"sum-{r}", s) for r, s in zip(ql, sums, strict=True)),
        _esc(t(lang, "(not 1, and that is not a bug: the expectation is A)")),
    )
    return numbers, body


def _multi_head(vals: Mapping[str, Any], state: Any, lang: str) -> tuple[dict[str, Any], str]:
    from ..core.multihead import init_multi_head, multi_head_attention

    d_model = _int(vals, "d_model", 1, 2048)
    h = _int(vals, "heads", 1, 64)
    n = _int(vals, "n", 1, 64)
    b = _int(vals, "batch", 1, 4)
    if d_model % h:
        raise _Bad(
            t(lang, "d_model = {d} is not divisible by h = {h}: d_head = d_model / h must be whole", d=d_model, h=h)
        )
    rng = np.random.default_rng(0)
    w = init_multi_head(d_model, h, rng=rng)
    r = multi_head_attention(rng.standard_normal((b, n, d_model)), None, w)
    tr_ = r.trace
    shapes = {
        "x": (b, n, d_model),
        "q_heads": tuple(np.shape(tr_.q)),
        "scores": tuple(np.shape(tr_.weights)),
        "heads": tuple(np.shape(r.heads)),
        "output": tuple(np.shape(r.output)),
    }
    d_head = d_model // h
    rows = (
        ("X", "[B, n, d_model]", shapes["x"]),
        (t(lang, "split into heads"), "[B, h, n, d_head]", shapes["q_heads"]),
        ("softmax(Q Kᵀ / √d_head)", "[B, h, n, n]", shapes["scores"]),
        (t(lang, "concat"), "[B, n, h · d_head]", shapes["heads"]),
        ("O = H W_O", "[B, n, d_model]", shapes["output"]),
    )
    body = _p("d_head = d_model / h =", f"{d_model} / {h} =", _value("d_head", d_head))
    body += "<table data-testid='al-x-shapes' style='border-collapse:collapse;font-family:monospace;color:#000'>"
    for name, legend, shp in rows:
        body += (
            f"<tr><td style='padding:2px 8px'>{_esc(name)}</td><td style='padding:2px 8px'>{legend}</td>"
            f"<td style='padding:2px 8px' data-shape='{list(shp)}'><code>{list(shp)}</code></td></tr>"
        )
    body += "</table>"
    body += _p(
        _esc(
            t(
                lang,
                "computed by attnlab.multi_head_attention on random inputs (seed 0); the shapes are read from its "
                "result.",
            )
        )
    )
    return {"d_head": d_head, **shapes}, body


def _backward(vals: Mapping[str, Any], state: Any, lang: str) -> tuple[dict[str, Any], str]:
    from ..explain.lessons import explain_backward

    setup = _setup(state, lang)
    text = str(vals.get("g_o", "")).strip()
    g = None if not text else _matrix(text, "G_O", lang)
    from ..errors import AttnlabError
    from ..i18n import error_message

    try:
        e = explain_backward(setup, g, lang=lang)
    except AttnlabError as err:
        raise _Bad(error_message(err, lang)) from None
    numbers: dict[str, Any] = {}
    body = "<div style='display:flex;gap:24px;flex-wrap:wrap'>"
    for name, label in (("dv", "dV = Aᵀ G_O"), ("da", "dA = G_O Vᵀ"), ("ds", "dS"), ("dq", "dQ"), ("dk", "dK")):
        s = e.step(name)
        numbers[name] = s.matrix
        body += _table(name, s.matrix, s.rows, s.cols, label, lang=lang, shade=False)
    body += "</div>"
    chk = e.step("check").matrix
    numbers["check"] = chk
    body += _table(
        "check",
        chk,
        ("dQ", "dK", "dV"),
        ("attention_backward", t(lang, "lesson.bw.fd")),
        t(lang, "largest difference of the hand formulas from:"),
        lang=lang,
        shade=False,
    )
    ds = numbers["ds"]
    body += _p("dS[0, 0] =", _value("ds00", ds[0, 0]) + ";", "dV[0, 0] =", _value("dv00", numbers["dv"][0, 0]))
    body += "".join(_p(f"<code>{_esc(line)}</code>") for line in e.step("ds").lines[:8])
    return numbers, body


def _growth(vals: Mapping[str, Any], state: Any, lang: str) -> tuple[dict[str, Any], str]:
    from ..cost import score_elements

    t_len = _int(vals, "t", 1, 1 << 20)
    base = _int(vals, "base", 1, 1 << 20)
    a, b = score_elements(base), score_elements(t_len)
    ratio = b / a
    numbers = {"elements": b, "base_elements": a, "ratio": ratio, "length_ratio": t_len / base, "mib": b * 4 / 2**20}
    body = _p(
        _esc(t(lang, "{a} -> {b} tokens:", a=f"{base:,}", b=f"{t_len:,}")),
        _value("base_elements", a, f"{a:,}"),
        "->",
        _value("elements", b, f"{b:,}"),
        _esc(t(lang, "elements,")),
        _value("ratio", ratio, num(ratio) + "x"),
        _esc(t(lang, "({x}x the length); {m} MiB per head in float32", x=num(t_len / base), m=num(b * 4 / 2**20))),
    )
    return numbers, body


def _complexity(vals: Mapping[str, Any], state: Any, lang: str) -> tuple[dict[str, Any], str]:
    from ..cost import attention_cost, crossover_length, kv_cache_bytes

    n = _int(vals, "n", 1, 1 << 20)
    d_model = _int(vals, "d_model", 8, 16384)
    h = _int(vals, "heads", 1, 128)
    if d_model % h:
        raise _Bad(
            t(lang, "d_model = {d} is not divisible by h = {h}: d_head = d_model / h must be whole", d=d_model, h=h)
        )
    c = attention_cost(n, d_model=d_model, heads=h, dtype="float32")
    cross = crossover_length(d_model, heads=h)
    kv = kv_cache_bytes(batch=1, seq_len=n, layers=32, kv_heads=8, head_dim=128, dtype="float16") / 2**20
    numbers = {
        "proj": c.projection_flops / 1e9,
        "attn": c.attention_flops / 1e9,
        "mem": c.score_bytes / 2**20,
        "cross": cross,
        "kv": kv,
    }
    body = _p(
        _esc(t(lang, "n = {n}, d_model = {d}, h = {h}:", n=f"{n:,}", d=d_model, h=h)),
        _esc(t(lang, "projections")),
        _value("proj", numbers["proj"]),
        "GFLOP; QKᵀ + AV",
        _value("attn", numbers["attn"]),
        "GFLOP;",
        _esc(t(lang, "score matrix")),
        _value("mem", numbers["mem"]),
        "MiB (float32).",
    )
    body += _p(
        _esc(t(lang, "The n² term overtakes the projections at n ≈")), _value("cross", cross, f"{cross:,}") + "."
    )
    body += _p(_esc(t(lang, "KV cache at this n (32 layers, 8 KV heads of 128, float16):")), _value("kv", kv), "MiB.")
    return numbers, body


def _long_context(vals: Mapping[str, Any], state: Any, lang: str) -> tuple[dict[str, Any], str]:
    from ..cost import causal_pairs, kv_cache_bytes, score_elements, window_pairs

    n = _int(vals, "n", 1, 1 << 20)
    w = _int(vals, "window", 1, 1 << 20)

    def kv(m: int, heads: int) -> float:
        return kv_cache_bytes(batch=1, seq_len=m, layers=32, kv_heads=heads, head_dim=128, dtype="float16") / 2**20

    rows = [
        [score_elements(n), score_elements(2 * n)],
        [causal_pairs(n), causal_pairs(2 * n)],
        [window_pairs(n, w), window_pairs(2 * n, w)],
        [kv(n, 32), kv(2 * n, 32)],
        [kv(n, 8), kv(2 * n, 8)],
        [kv(n, 1), kv(2 * n, 1)],
    ]
    table = np.array(rows, dtype=np.float64)
    table = np.concatenate([table, table[:, 1:] / table[:, :1]], axis=1)
    from ..explain.i18n import tr

    names = tuple(tr(f"lesson.long.row{i}", lang, w=f"{w:,}") for i in range(6))
    numbers = {"table": table, "full": table[0, 2], "window": table[2, 2], "kv": table[3, 2]}
    body = _p(
        _esc(t(lang, "{a} -> {b} tokens:", a=f"{n:,}", b=f"{2 * n:,}")),
        _value("full", table[0, 2], num(table[0, 2]) + "x"),
        _esc(t(lang, "the score elements,")),
        _value("window", table[2, 2], num(table[2, 2]) + "x"),
        _esc(t(lang, "with a window of {w} keys,", w=f"{w:,}")),
        _value("kv", table[3, 2], num(table[3, 2]) + "x"),
        _esc(t(lang, "the KV cache.")),
    )
    body += _table("long", table, names, (f"n={n:,}", f"n={2 * n:,}", "×"), lang=lang, shade=False)
    return numbers, body


#: The leak test's three tokens (001 §17.3): queries, keys and values.
_LEAK_X = ((1.0, 0.0), (0.0, 1.0), (1.0, 1.0))


def _leak(vals: Mapping[str, Any], state: Any, lang: str) -> tuple[dict[str, Any], str]:
    from .. import masks
    from ..core import attention_trace

    j = _int(vals, "token", 0, 2)
    new_k = _matrix(vals.get("key", ""), "key", lang)
    new_v = _matrix(vals.get("value", ""), "value", lang)
    if new_k.shape != (1, 2) or new_v.shape != (1, 2):
        raise _Bad(t(lang, "key and value: expected one row of 2 numbers each"))
    x = np.array(_LEAK_X)
    k2, v2 = x.copy(), x.copy()
    k2[j], v2[j] = new_k[0], new_v[0]
    right = masks.causal(3)
    moves = []
    for allowed in (right, right.T.copy()):  # j <= i, and the mask written the wrong way round (j >= i)
        o1 = np.asarray(attention_trace(x, x, x, allowed).output)
        o2 = np.asarray(attention_trace(x, k2, v2, allowed).output)
        moves.append(np.abs(o2 - o1).max(-1))
    m = np.array(moves).T  # [3, 2]
    leaked = [f"q{i}" for i in range(j) if m[i, 0] > 1e-12]
    numbers = {"moves": m, "causal_leak": leaked}
    body = _p(
        _esc(
            t(
                lang,
                "Token {j} gets key {k} and value {v}; how far does each output move?",
                j=j,
                k=vec(new_k[0]),
                v=vec(new_v[0]),
            )
        )
    )
    body += _table("leak", m, _labels("q", 3), ("j <= i", "j >= i"), lang=lang, shade=False)
    body += _p(
        t(lang, "q0 moves"),
        _value("q0-causal", m[0, 0]),
        "(j <= i),",
        _value("q0-inverted", m[0, 1]),
        "(j >= i).",
    )
    if j == 0:
        verdict = t(lang, "Every query may see token 0, so every output may move; change a later token to test.")
    elif leaked:
        verdict = t(lang, "Under the causal mask {rows} moved: a leak.", rows=", ".join(leaked))
    else:
        verdict = t(
            lang,
            "Under the causal mask the queries before token {j} do not move (q0 … q{k}: 0); written the wrong "
            "way round, the mask lets them read the future.",
            j=j,
            k=j - 1,
        )
    return numbers, body + _p(_esc(verdict))


def _invariants(vals: Mapping[str, Any], state: Any, lang: str) -> tuple[dict[str, Any], str]:
    from ..core import attention_trace
    from ..errors import AttnlabError
    from ..explain.inputs import parse_mask
    from ..i18n import error_message
    from ..invariants import check

    q = _matrix(vals.get("q", ""), "Q", lang)
    k = _matrix(vals.get("k", ""), "K", lang)
    v = _matrix(vals.get("v", ""), "V", lang)
    if max(q.shape[0], k.shape[0]) > 8 or max(q.shape[1], k.shape[1], v.shape[1]) > 8:
        raise _Bad(t(lang, "at most 8 rows and 8 columns here"))
    try:
        allowed = parse_mask(str(vals.get("mask", "")), "mask") if str(vals.get("mask", "")).strip() else None
        tr_ = attention_trace(q, k, v, allowed, masked_rows="zero")
    except (AttnlabError, ValueError) as err:
        raise _Bad(error_message(err, lang)) from None
    a, o = np.asarray(tr_.weights), np.asarray(tr_.output)
    al = np.asarray(tr_.allowed)
    sums = a.sum(-1)
    masked = float(np.abs(a[~al]).max(initial=0.0))
    agg = float(np.abs(o - a @ v).max())
    viol = check(tr_)
    numbers = {"weights": a, "sums": sums, "masked": masked, "agg": agg, "violations": len(viol)}
    items = [
        ("shape(Q Kᵀ) = [n_q, n_k] =", _value("n_q", a.shape[0], str(list(a.shape)))),
        (t(lang, "masked A_ij = 0: largest |A_ij| over masked (i, j) ="), _value("masked", masked)),
        (t(lang, "rows sum to 1:"), f"<code data-testid='al-x-sums'>{_esc(', '.join(num(s) for s in sums))}</code>"),
        ("max |O − A V| =", _value("agg", agg, f"{agg:.1e}")),
        ("d_k(Q) = d_k(K):", f"<code>{q.shape[1]} = {k.shape[1]}</code>"),
        ("n_k(K) = n_k(V):", f"<code>{k.shape[0]} = {v.shape[0]}</code>"),
        (
            "attnlab.invariants.check:",
            _value("violations", len(viol), str(len(viol))) + " " + _esc(t(lang, "violations")),
        ),
    ]
    body = "<ol style='margin:4px 0'>" + "".join(f"<li>{_esc(a_)} {b_}</li>" for a_, b_ in items) + "</ol>"
    if q.shape[1] != k.shape[1] or k.shape[0] != v.shape[0]:
        body += _p(_esc(t(lang, "the shapes do not fit")))
    body += _table("weights", a, _labels("q", a.shape[0]), _labels("k", a.shape[1]), "A", allowed=al, lang=lang)
    return numbers, body


# ---------------------------------------------------------------------------------------------------- the catalogue

_DTYPES = (("float32", "float32"), ("float16", "float16"), ("bfloat16", "bfloat16"))
#: The sequence length of the cost lessons (complexity, long context): the article's 4,096 tokens.
_LENGTH = Control("n", "number", "sequence length n", 4096, 1, 1 << 20, 1)

#: Every live experiment, by key (the articles' lesson or mode it makes live).
EXPERIMENTS: dict[str, Experiment] = {
    "variance": Experiment(
        "variance",
        "Experiment: the variance of q·k",
        (
            Control("d_k", "slider", "d_k", 64, 1, 1024, 1),
            Control("samples", "number", "samples", 8000, 100, 20000, 100),
            Control("seed", "number", "seed", 0, 0, 10**6, 1),
        ),
        {"d_k": frozenset({2, 8, 64, 512}), "samples": 8000, "seed": 0},
        _variance,
    ),
    "fp16-mask": Experiment(
        "fp16-mask",
        "Experiment: the mask's fill value and the dtype",
        (
            Control(
                "fill", "dropdown", "fill value", "-1e9", options=tuple((lab, k) for k, (lab, _) in _FILLS.items())
            ),
            Control("dtype", "dropdown", "dtype", "float16", options=_DTYPES),
        ),
        {"fill": "-1e9", "dtype": frozenset({"float32", "float16"})},
        _mask_fill,
    ),
    "overflow": Experiment(
        "overflow",
        "Experiment: softmax with and without the max",
        (
            Control("logits", "text", "logits", "1000, 999"),
            Control("dtype", "dropdown", "dtype", "float64", options=(("float64", "float64"), *_DTYPES)),
        ),
        {"logits": "1000, 999", "dtype": "float64"},
        _overflow,
    ),
    "mistakes": Experiment("mistakes", "Experiment: the mistakes, next to the right way", (), {}, _mistakes, True),
    "online": Experiment(
        "online",
        "Experiment: the online softmax, block by block",
        (
            Control("block_k", "slider", "key block size", 2, 1, 8, 1),
            Control("step", "slider", "after block", 1, 1, 8, 1),
        ),
        {},
        _online,
        True,
    ),
    "dropout": Experiment(
        "dropout",
        "Experiment: dropout on the weights",
        (Control("p", "slider", "dropout p", 0.5, 0.0, 0.95, 0.05), Control("seed", "number", "seed", 0, 0, 10**6, 1)),
        {"p": 0.5, "seed": 0},
        _dropout,
    ),
    "multi-head": Experiment(
        "multi-head",
        "Experiment: the multi-head shapes",
        (
            Control("d_model", "number", "d_model", 512, 1, 2048, 1),
            Control("heads", "number", "heads h", 8, 1, 64, 1),
            Control("n", "number", "sequence length n", 4, 1, 64, 1),
            Control("batch", "number", "batch B", 1, 1, 4, 1),
        ),
        {"d_model": 512, "heads": 8, "n": 4, "batch": 1},
        _multi_head,
    ),
    "backward": Experiment(
        "backward",
        "Experiment: the backward pass of your Q, K, V",
        (Control("g_o", "area", "G_O = ∂L/∂O (empty: all ones)", ""),),
        {"g_o": ""},
        _backward,
        True,
    ),
    "growth": Experiment(
        "growth",
        "Experiment: T² growth",
        (
            Control("t", "number", "plot.growth.x", 4096, 1, 1 << 20, 1),
            Control("base", "number", "compared with length", 1024, 1, 1 << 20, 1),
        ),
        {"t": frozenset({2048, 4096}), "base": 1024},
        _growth,
    ),
    "complexity": Experiment(
        "complexity",
        "Experiment: the cost of attention",
        (
            _LENGTH,
            Control("d_model", "number", "d_model", 512, 8, 16384, 1),
            Control("heads", "number", "heads h", 8, 1, 128, 1),
        ),
        {"n": frozenset({128, 512, 1024, 4096, 8192}), "d_model": 512, "heads": 8},
        _complexity,
    ),
    "long-context": Experiment(
        "long-context",
        "Experiment: doubling the context",
        (_LENGTH, Control("window", "number", "window (keys)", 1024, 1, 1 << 20, 1)),
        {"n": 4096, "window": 1024},
        _long_context,
    ),
    "leak-test": Experiment(
        "leak-test",
        "Experiment: the leak test",
        (
            Control("token", "slider", "token to change", 2, 0, 2, 1),
            Control("key", "text", "its new key", "3, -1"),
            Control("value", "text", "its new value", "50, 50"),
        ),
        {"token": 2, "key": "3, -1", "value": "50, 50"},
        _leak,
    ),
    "invariants": Experiment(
        "invariants",
        "Experiment: the six invariants on your inputs",
        (
            Control("q", "area", "Q (queries)", "1, 0\n0, 1"),
            Control("k", "area", "K (keys)", "1, 0\n0, 1\n1, 1"),
            Control("v", "area", "V (values)", "10, 0\n0, 10\n5, 5"),
            Control("mask", "area", "mask (1 = may attend)", "1 1 0\n1 1 1"),
        ),
        {"q": "1, 0\n0, 1", "k": "1, 0\n0, 1\n1, 1", "v": "10, 0\n0, 10\n5, 5", "mask": "1 1 0\n1 1 1"},
        _invariants,
    ),
}


def experiment_for(item: Any) -> Experiment | None:
    """The live experiment of a lab preset (:class:`~attnlab.lab.presets.ItemPreset`), set to the item's own
    command (its ``--tiled`` block, its ``--mistake``); None for an item that is one attention computation."""
    if item is None:
        return None
    argv = tuple(item.argv)
    if "--tiled" in argv:
        b = int(argv[argv.index("--tiled") + 1])
        exp = EXPERIMENTS["online"]
        ctl: tuple[Control, ...] = (replace(exp.controls[0], value=b), exp.controls[1])
        return replace(exp, controls=ctl, article={"block_k": b}, preset_state=item.state)
    if "--backward" in argv:
        return replace(EXPERIMENTS["backward"], preset_state=item.state)
    if "--mistake" in argv:
        from ..explain.mistakes import MISTAKES

        wrong = argv[argv.index("--mistake") + 1]
        ctl = tuple(Control(n, "checkbox", f"mistake.{n}", n == wrong) for n in MISTAKES)
        return replace(EXPERIMENTS["mistakes"], controls=ctl, article={wrong: True}, preset_state=item.state)
    if argv and argv[0] in EXPERIMENTS:
        return EXPERIMENTS[argv[0]]
    return None


def uses_qkv(item: Any) -> bool:
    """Whether the lab's Q, K, V boxes (and the weights under them) belong to this preset: the own-inputs choice
    (None) and every item with Q, K, V; a lesson without them clears them from the page."""
    return item is None or item.state is not None


@functools.lru_cache(maxsize=256)
def _explain(key: str, lang: str) -> str:
    from .presets import ITEM_PRESETS, item_html

    return item_html(ITEM_PRESETS[key], lang)


def _presets() -> dict[str, Any]:
    from .presets import ITEM_PRESETS

    return ITEM_PRESETS


def _item_html(item: Any, lang: str) -> str:
    from .presets import item_html

    return item_html(item, lang)


def item_box(item: Any, state: Any = None, outcome: Outcome | None = None, lang: str = "en") -> str:
    """The preset's ``attnlab explain`` output (:func:`~attnlab.lab.presets.item_html`), visibly marked as the
    preset's original once the inputs or the experiment's controls no longer are the preset's (its marks of the
    article's numbers struck through, ``data-stale="true"``), so the page never shows old numbers as current."""
    if item is None:
        return ""
    box = _explain(item.key, lang) if _presets().get(item.key) == item else _item_html(item, lang)
    stale = (item.state is not None and state is not None and state != item.state) or (
        outcome is not None and not outcome.article
    )
    if not stale:
        return box
    note = t(
        lang,
        "Changed: this is the preset's original output, for the preset's inputs; the numbers below are computed from "
        "yours. Choose the preset again to go back.",
    )
    box = box.replace('data-testid="al-item"', 'data-testid="al-item" data-stale="true"', 1)
    box = box.replace(
        '<mark data-testid="al-expect">',
        '<mark data-testid="al-expect-stale" style="background:none;text-decoration:line-through;color:#666">',
    )
    return (
        f"<div data-testid='al-stale' style='border-left:4px solid #fdae6b;background:#fff8ef;color:#000;"
        f"padding:6px 10px;margin:6px 0'>{_esc(note)}</div>" + box
    )
