"""What the lab notebook computes and shows, as plain functions (tested without a browser).

The notebook only wires marimo widgets to these functions. Everything here takes the learner's raw input (text
typed into a box, slider values) and never raises on bad input: :func:`compute` returns a :class:`LabResult` whose
``message`` says what is wrong, and the page shows it instead of a traceback.

>>> r = compute(LabState(q="1, 0", k="1, 0; 0, 1", v="10, 0; 0, 20"))
>>> r.ok, r.weights.round(4).tolist()
(True, [[0.6698, 0.3302]])
>>> compute(LabState(q="1, x", k="1, 0", v="1")).message
"Q: 'x' at row 0, column 1 is not a number"

The pictures are in :mod:`attnlab.lab.svg`, the predictions and score in :mod:`attnlab.lab.predict`, one preset per
worked example of the articles in :mod:`attnlab.lab.presets`, the Chinese words in :mod:`attnlab.lab.i18n`.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import masks
from ..errors import AttnlabError, MaskedRowError
from ..explain import Explanation, Setup, compare, explain_setup
from ..explain.fmt import num, vec
from ..explain.inputs import parse_mask, parse_matrix
from ..i18n import Word, error_message, localized
from .i18n import t
from .svg import heatmap_svg, last_row_svg

__all__ = [
    "DEFAULT",
    "FOUR_PAIRS",
    "MAX_D",
    "MAX_N",
    "LabResult",
    "LabState",
    "compute",
    "error_html",
    "exp_bias",
    "exp_shift",
    "exp_temperature",
    "exp_value",
    "four_pairs",
    "heatmap_png",
    "heatmap_svg",
    "last_row_svg",
    "mask_conventions",
    "masked_row_trap",
    "matrix_html",
    "num",
    "pictures_html",
    "result_html",
    "setup_of",
    "steps_html",
    "with_state",
]

#: Bounds that keep the page responsive: at most MAX_N positions and MAX_D features per vector.
MAX_N = 32
#: At most this many features per vector (see :data:`MAX_N`).
MAX_D = 16


@dataclass(frozen=True)
class LabState:
    """The learner's inputs: Q, K, V as typed text and the settings of the controls.

    ``padded`` is the number of padding key positions (0 = none), at the end (``padding_side="right"``) or the
    start. ``value_row``/``value_text`` replace one value vector (``"100, 0"``) without retyping V. ``bias`` is
    one number per key (``"0, 0, 5, 0"``, added to that key's column of scores, as the self-test's second half
    asks) or a full ``[n_q, n_k]`` matrix; ``mask`` rows of 1/0 (1 = may attend); ``scale`` a number (empty:
    1/√d_k). ``causal`` with fewer queries than keys is a decoding query: the mask is aligned bottom-right (the
    last query is the newest token and sees every key).
    """

    q: str
    k: str
    v: str
    causal: bool = False
    padded: int = 0
    padding_side: str = "right"
    temperature: float = 1.0
    shift: float = 0.0
    masked_rows: str = "raise"
    value_row: int = 0
    value_text: str = ""
    tokens: str = ""
    bias: str = ""
    mask: str = ""
    scale: str = ""


#: The four-position example of article 000 under its causal mask (``attnlab explain causal-4``): the lab opens here.
DEFAULT = LabState(q="1, 0\n0, 1\n1, 1\n1, -1", k="1, 0\n0, 1\n1, 1\n-1, 1", v="1, 0\n0, 1\n1, 1\n2, 0", causal=True)

#: Four 2-D query/key pairs for the mask-and-temperature experiment (the rows of DEFAULT's Q and K).
FOUR_PAIRS = (np.array([[1.0, 0], [0, 1], [1, 1], [1, -1]]), np.array([[1.0, 0], [0, 1], [1, 1], [-1, 1]]))


@dataclass(frozen=True)
class LabResult:
    """The outcome of :func:`compute`: ``ok`` and the explanation, or not ``ok`` and a ``message`` for the page.

    Shapes: ``weights``/``allowed`` ``[n_q, n_k]``, ``output [n_q, d_v]`` (None when not ok).
    """

    ok: bool
    message: str
    state: LabState
    explanation: Explanation | None = None
    setup: Setup | None = None

    # Typed Any: an array when ok, None when not; the pages read them only after checking ok.
    @property
    def weights(self) -> Any:
        """The attention weights ``[n_q, n_k]``, or None when the input had an error."""
        return None if self.explanation is None else self.explanation.weights

    @property
    def output(self) -> Any:
        """The output ``[n_q, d_v]``, or None when the input had an error."""
        return None if self.explanation is None else self.explanation.output

    @property
    def allowed(self) -> Any:
        """The mask applied ``[n_q, n_k]`` (True = may attend), or None when the input had an error."""
        e = self.explanation
        if e is None:
            return None
        assert e.trace is not None  # an explanation made by explain_setup carries its trace
        return np.asarray(e.trace.allowed)


def _bounded(text: str, name: str) -> np.ndarray:
    m = parse_matrix(text, name)
    if m.shape[0] > MAX_N or m.shape[1] > MAX_D:
        raise localized(AttnlabError, TOO_LARGE, name=name, r=m.shape[0], c=m.shape[1], n=MAX_N, d=MAX_D)
    return m


def setup_of(state: LabState) -> Setup:
    """The :class:`~attnlab.explain.Setup` for ``state``; raises the library's errors on bad input."""
    q, k, v = _bounded(state.q, "Q"), _bounded(state.k, "K"), _bounded(state.v, "V")
    if q.shape[1] != k.shape[1]:
        raise localized(
            AttnlabError,
            "K: rows have {dk} number(s) but Q's have {dq}; q·k needs equal lengths",
            dk=k.shape[1],
            dq=q.shape[1],
        )
    if v.shape[0] != k.shape[0]:
        raise localized(
            AttnlabError, "V: {nv} row(s) but K has {nk}; every key needs one value row", nv=v.shape[0], nk=k.shape[0]
        )
    if state.value_text.strip():
        row = int(state.value_row)
        if not 0 <= row < v.shape[0]:
            raise localized(
                AttnlabError, "value row: {row} is not a key position (0 … {last})", row=row, last=v.shape[0] - 1
            )
        new = parse_matrix(state.value_text, f"v{row}")
        if new.shape != (1, v.shape[1]):
            raise localized(
                AttnlabError,
                "v{row}: expected one row of {d} number(s), got {r}×{c}",
                row=row,
                d=v.shape[1],
                r=new.shape[0],
                c=new.shape[1],
            )
        v = v.copy()
        v[row] = new[0]
    n_q, n_k = q.shape[0], k.shape[0]
    fields = Setup.__dataclass_fields__
    causal: bool | str = bool(state.causal)
    user_mask = None
    if state.mask.strip():
        user_mask = parse_mask(state.mask, Word("opt.mask"))
        if user_mask.shape not in ((n_q, n_k), (1, n_k)):
            raise localized(AttnlabError, MASK_SHAPE, r=user_mask.shape[0], c=user_mask.shape[1], n_q=n_q, n_k=n_k)
    if causal and n_q != n_k:
        if n_q > n_k:
            raise localized(AttnlabError, CAUSAL_QUERIES, n_q=n_q, n_k=n_k)
        causal = "bottom_right"
        if "bias" not in fields:  # an explain without aligned causal masks: the same mask, given explicitly
            dec = masks.causal(n_q, n_k, align="bottom_right")
            user_mask = dec if user_mask is None else (user_mask & dec)
            causal = False
    padded = int(state.padded)
    if not 0 <= padded <= n_k:
        raise localized(AttnlabError, "padding: {p} padded key(s) but there are only {n_k} keys", p=padded, n_k=n_k)
    labels = None
    if state.tokens.strip():
        toks = tuple(t for t in state.tokens.replace(",", " ").split() if t)
        if len(toks) != n_k or n_q != n_k:
            raise localized(
                AttnlabError,
                "tokens: {n} token(s) for {n_k} positions (tokens label self-attention)",
                n=len(toks),
                n_k=n_k,
            )
        labels = toks
    scale = None
    if state.scale.strip():
        sc = parse_matrix(state.scale, Word("scale"))
        if sc.shape != (1, 1) or not sc[0, 0] > 0:
            raise localized(
                AttnlabError, "scale: expected one positive number (empty: 1/sqrt(d_k)), got {got!r}", got=state.scale
            )
        scale = float(sc[0, 0])
    extra: dict[str, Any] = {}
    if state.bias.strip():
        b = parse_matrix(state.bias, Word("bias per key"))
        if b.shape not in ((1, n_k), (n_q, n_k)):
            raise localized(AttnlabError, BIAS_SHAPE, r=b.shape[0], c=b.shape[1], n_q=n_q, n_k=n_k)
        extra["bias"] = b
    return Setup(
        q,
        k,
        v,
        mask=user_mask,
        causal=causal,
        padding=None if padded == 0 else n_k - padded,
        padding_side=state.padding_side,
        temperature=float(state.temperature),
        shift=float(state.shift),
        scale=scale,
        masked_rows=state.masked_rows,
        query_labels=labels,
        key_labels=labels,
        title="Your attention",
        **extra,
    )


def compute(state: LabState, lang: str = "en") -> LabResult:
    """Explain ``state`` (text in ``lang``); a message instead of an exception for anything the learner typed."""
    try:
        setup = setup_of(state)
        e = explain_setup(setup, lang=lang)
    except MaskedRowError as err:
        rows = ", ".join(str(r[-1]) for r in err.rows)
        return LabResult(False, t(lang, MASKED_ROW_MESSAGE, rows=rows), state)
    except (AttnlabError, ValueError) as err:
        return LabResult(False, error_message(err, lang), state)
    return LabResult(True, "", state, e, setup)


#: The lab's own messages about the learner's input (keys of the catalogue, :mod:`attnlab.lab.i18n`).
TOO_LARGE = (
    "{name}: {r}×{c} is larger than the lab allows ({n} rows × {d} columns); use `attnlab explain` or the library "
    "for bigger inputs"
)
MASK_SHAPE = "mask: {r}×{c}, expected {n_q}×{n_k} (one row per query, one column per key) or 1×{n_k}"
CAUSAL_QUERIES = (
    "causal: {n_q} queries but only {n_k} keys; a causal query must be one of the key positions (fewer queries "
    "than keys is decoding: the last query sees every key)"
)
BIAS_SHAPE = "bias: {r}×{c}, expected one number per key (1×{n_k}) or one row per query ({n_q}×{n_k})"

#: What the page says when a row has no legal key under the ``raise`` policy.
MASKED_ROW_MESSAGE = (
    "Query row(s) {rows} may attend to no key at all (every key is masked), so softmax would divide 0 by 0. This is "
    "the fully-masked-row trap: padding AND causal often empties a row. Switch 'fully masked rows' to 'zero' "
    "(FlashAttention's choice) or 'nan' (what naive code gives) to see it."
)


# --------------------------------------------------------------------------------------------------------------
# HTML


_PAD = "padding:2px 8px"


def _cell(x: float, allowed: bool = True, shade_weights: bool = False, lang: str = "en") -> str:
    if math.isnan(x):  # a row with no legal key under the 'nan' policy: NaN, never "masked"
        return f'<td data-value="nan" style="background:#fcbba1;color:#a50f15;{_PAD};text-align:right">NaN</td>'
    if not allowed:
        return (
            f'<td class="al-masked" data-value="masked" style="background:#e5e5e5;color:#444;{_PAD}">'
            f"{html.escape(t(lang, 'plot.masked'))}</td>"
        )
    shade = ""
    if shade_weights and math.isfinite(x) and 0 <= x <= 1:
        a = 0.08 + 0.5 * x  # blue over white, blended here so the text's contrast is what the page shows
        r, g, b = (round(255 - a * (255 - c)) for c in (49, 130, 189))
        shade = f"background:rgb({r},{g},{b});color:#000;"
    return f'<td data-value="{float(x)!r}" style="{shade}text-align:right;{_PAD};white-space:nowrap">{num(x)}</td>'


def matrix_html(
    m: np.ndarray,
    rows: tuple[str, ...],
    cols: tuple[str, ...],
    *,
    table_id: str = "",
    allowed: np.ndarray | None = None,
    caption: str = "",
    attrs: str = "",
    shade: bool | None = None,
    lang: str = "en",
) -> str:
    """An HTML table of ``m [r, c]``; each cell carries its exact value in ``data-value`` (tests read it).

    Cells are shaded by value when ``shade`` (default: when a mask is given, i.e. for weights); masked cells are
    grey and say "masked"; NaN cells are red and say "NaN". Wide tables scroll inside their box.
    """
    m = np.asarray(m, dtype=np.float64)
    shade = allowed is not None if shade is None else shade
    ident = f' id="{table_id}" data-testid="{table_id}"' if table_id else ""
    out = ["<div style='overflow-x:auto;max-width:100%'>"]
    if caption:  # above the table, not a <caption>: a caption wraps to the width of a narrow (1×1) table
        out.append(
            f"<div class='al-caption' style='font-weight:bold;font-family:monospace;white-space:nowrap;color:#000'>"
            f"{html.escape(caption)}</div>"
        )
    out.append(
        f'<table class="al-table"{ident} {attrs} '
        'style="border-collapse:collapse;font-family:monospace;width:auto;align-self:flex-start;margin:4px 0;'
        'color:#000">'
    )
    out.append("<tr><th></th>" + "".join(f"<th style='padding:2px 8px'>{html.escape(c)}</th>" for c in cols) + "</tr>")
    for i, r in enumerate(rows):
        cells = "".join(
            _cell(m[i, j], True if allowed is None else bool(allowed[i, j]), shade, lang) for j in range(m.shape[1])
        )
        out.append(f"<tr><th style='padding:2px 8px'>{html.escape(r)}</th>{cells}</tr>")
    out.append("</table></div>")
    return "".join(out)


def error_html(message: str, testid: str = "al-error") -> str:
    """A message box for the page (bad input, masked rows): never a traceback."""
    return (
        f'<div class="al-error" data-testid="{testid}" style="border-left:4px solid #e34a33;background:#fff5f0;'
        f'color:#000;padding:8px 12px;margin:6px 0">⚠ {html.escape(message)}</div>'
    )


def _state_attrs(s: LabState) -> str:
    return (
        f'data-temperature="{num(s.temperature)}" data-causal="{str(bool(s.causal)).lower()}" '
        f'data-shift="{num(s.shift)}" data-padded="{int(s.padded)}" data-value-text="{html.escape(s.value_text)}" '
        f'data-bias="{html.escape(s.bias)}" data-masked-rows="{html.escape(s.masked_rows)}"'
    )


def result_html(result: LabResult, lang: str = "en") -> str:
    """The weights (table id ``al-weights``) with row sums (``al-row-sums``; NaN on a NaN row), and the output
    (``al-output``); or the error message. Both tables carry the settings they were computed with
    (``data-temperature``, ``data-causal``, ...)."""
    if not result.ok:
        return error_html(result.message, "al-input-error")
    st = result.setup
    assert st is not None and result.explanation is not None  # ok
    notes = result.explanation.notes
    attrs = _state_attrs(result.state)
    w = result.weights
    sums = np.where(np.isnan(w).any(axis=-1), np.nan, np.where(result.allowed, w, 0.0).sum(axis=-1))
    dcols = tuple(f"d{c}" for c in range(result.output.shape[1]))
    return (
        "<div style='display:flex;gap:32px;flex-wrap:wrap;align-items:flex-start'><div style='max-width:100%'>"
        + matrix_html(
            w,
            st.qlabels,
            st.klabels,
            table_id="al-weights",
            allowed=result.allowed,
            attrs=attrs,
            caption=t(lang, "weights A = softmax(masked scores)"),
            lang=lang,
        )
        + "<div style='font-size:13px' data-testid='al-row-sums'>"
        + html.escape(t(lang, "row sums:"))
        + " "
        + ", ".join(num(x) if math.isfinite(x) else "NaN" for x in sums)
        + "</div></div><div style='max-width:100%'>"
        + matrix_html(
            result.output,
            st.qlabels,
            dcols,
            table_id="al-output",
            attrs=attrs,
            caption=t(lang, "output O = A V"),
            lang=lang,
        )
        + "</div></div>"
        + "".join(error_html(n) for n in notes)
    )


def steps_html(result: LabResult, lang: str = "en") -> str:
    """Every step as a table with the arithmetic written out (no ids: :func:`result_html` holds those)."""
    if not result.ok:
        return error_html(result.message)
    e = result.explanation
    assert e is not None  # ok
    allowed = result.allowed
    parts = []
    for i, step in enumerate(e.steps, 1):
        parts.append(
            f"<h4 style='margin:10px 0 2px;color:#000'>{i}. {html.escape(step.title)}: "
            f"<code>{html.escape(step.formula)}</code></h4>"
        )
        for name, m, r, c in step.extra:
            parts.append(matrix_html(m, r, c, caption=name, lang=lang))
        if step.matrix is not None:
            mask = allowed if step.key in ("weights", "exp") else None
            parts.append(matrix_html(step.matrix, step.rows, step.cols, allowed=mask, lang=lang))
        if step.lines and step.key not in ("mask",):
            parts.append(
                "<pre style='margin:2px 0;font-size:12px;white-space:pre;overflow-x:auto;color:#000'>"
                + html.escape("\n".join(step.lines[:8]))
                + "</pre>"
            )
        if step.note:
            parts.append(f"<div style='color:#006d2c;font-size:13px'>{html.escape(step.note)}</div>")
    return "<div class='al-steps' style='color:#000'>" + "\n".join(parts) + "</div>"


def pictures_html(result: LabResult, lang: str = "en") -> str:
    """The heatmap and the last row's bar chart, side by side (or nothing when the input is not ok)."""
    if not result.ok:
        return ""
    st = result.setup
    assert st is not None  # ok
    return (
        f"<div data-testid='al-pictures' {_state_attrs(result.state)} "
        "style='display:flex;gap:24px;flex-wrap:wrap;align-items:flex-start'>"
        + heatmap_svg(
            result.weights,
            result.allowed,
            st.qlabels,
            st.klabels,
            title=t(lang, "weights A: rows = queries, columns = keys"),
            legend=(
                t(lang, "plot.key_axis"),
                t(lang, "masked (never attended), unlike a small weight"),
                t(lang, "NaN: no legal key, policy 'nan'"),
            ),
        )
        + last_row_svg(
            result.weights,
            result.allowed,
            st.klabels,
            st.qlabels[-1],
            title=t(lang, "last query {q}: its real weights", q=st.qlabels[-1]),
            masked_word=t(lang, "plot.masked"),
        )
        + "</div>"
    )


def heatmap_png(result: LabResult) -> bytes | None:
    """The matplotlib heatmap (:func:`attnlab.plot.heatmap`) as PNG bytes, for saving; None when not ok."""
    if not result.ok:
        return None
    from .. import plot

    st = result.setup
    assert st is not None  # ok
    fig = plot.heatmap(
        result.weights,
        result.allowed,
        query_labels=st.qlabels,
        key_labels=st.klabels,
        title="weights A (rows = queries)",
    )
    return plot.to_bytes(fig, "png", dpi=90)


# --------------------------------------------------------------------------------------------------------------
# experiments: each returns (numbers, html) so the notebook can reveal them after the learner's prediction


def _ok_setup(state: LabState) -> Setup | None:
    r = compute(state)
    return r.setup if r.ok else None


def _fix_first(lang: str) -> str:
    return error_html(t(lang, "Fix the inputs above first."))


def exp_shift(state: LabState, c: float = 10.0, lang: str = "en") -> tuple[float, str]:
    """Add ``c`` to every legal score: the weights do not change (softmax ignores a shift of a whole row)."""
    setup = _ok_setup(state)
    if setup is None:
        return float("nan"), _fix_first(lang)
    a = np.asarray(setup.trace().weights)
    b = np.asarray(setup.with_options(shift=setup.shift + c).trace().weights)
    d = float(np.nanmax(np.abs(a - b))) if a.size else 0.0
    rows, cols = setup.qlabels, setup.klabels
    allowed = np.asarray(setup.trace().allowed)
    return d, (
        matrix_html(a, rows, cols, allowed=allowed, caption=t(lang, "weights before"), lang=lang)
        + matrix_html(
            b,
            rows,
            cols,
            allowed=allowed,
            caption=t(lang, "weights after adding {c} to every legal score", c=num(c)),
            lang=lang,
        )
        + "<p>"
        + html.escape(t(lang, "Largest change of any weight:"))
        + f" <b data-testid='al-shift-diff'>{num(d)}</b>"
        + (html.escape(t(lang, " (0 up to float64 rounding)")) if d < 1e-9 else "")
        + ". "
        + html.escape(t(lang, SHIFT_NOTE))
        + "</p>"
    )


SHIFT_NOTE = (
    "softmax(x + c) = softmax(x): the shift cancels between numerator and denominator. Adding different amounts to "
    "different columns would change the weights."
)


def exp_bias(state: LabState, bias: tuple[float, ...] | None = None, lang: str = "en") -> tuple[float, str]:
    """The self-test's second half: a *different* number on each key's column changes the weights.

    ``bias`` (one number per key) defaults to the bias box of ``state`` if it holds one row, else 0, 1, 2, ….
    "Before" is the input without any bias. Returns the largest weight change and the page's HTML.
    """
    setup = _ok_setup(state)
    if setup is None:
        return float("nan"), _fix_first(lang)
    if bias is None:
        own = getattr(setup, "bias", None)
        b = np.asarray(own, dtype=np.float64)[-1] if own is not None else np.arange(setup.n_k, dtype=np.float64)
    else:
        b = np.asarray(bias, dtype=np.float64)
    if b.shape != (setup.n_k,):
        return float("nan"), error_html(t(lang, "This experiment needs one bias per key ({n}).", n=setup.n_k))
    shift = np.full((setup.n_q, setup.n_k), float(setup.shift))
    t0 = setup.trace(bias=shift)
    t1 = setup.trace(bias=shift + b)
    a0, a1 = np.asarray(t0.weights), np.asarray(t1.weights)
    d = float(np.nanmax(np.abs(a0 - a1))) if a0.size and not np.isnan(a0).all() else 0.0
    rows, cols = setup.qlabels, setup.klabels
    allowed = np.asarray(t0.allowed)
    return d, (
        "<p>"
        + html.escape(t(lang, "bias per key (column): {b}", b=vec(b)))
        + "</p>"
        + matrix_html(a0, rows, cols, allowed=allowed, caption=t(lang, "weights without a bias"), lang=lang)
        + matrix_html(
            a1, rows, cols, allowed=allowed, caption=t(lang, "weights with a different bias per column"), lang=lang
        )
        + "<p>"
        + html.escape(t(lang, "Largest change of any weight:"))
        + f" <b data-testid='al-bias-diff'>{num(d)}</b>. "
        + html.escape(t(lang, BIAS_NOTE))
        + "</p>"
    )


BIAS_NOTE = (
    "A bias that differs between the columns of a row does not cancel in softmax: keys with a larger bias gain "
    "weight. (A row with one legal key keeps [1, 0, …].)"
)


def _entropy(w: np.ndarray) -> np.ndarray:
    p = np.where(w > 0, w, 1.0)
    return -(w * np.log(p)).sum(axis=-1)


def exp_temperature(state: LabState, temp: float = 3.0, lang: str = "en") -> tuple[np.ndarray, str]:
    """Raise the temperature to ``temp``: each row flattens toward uniform over its legal keys; nothing leaks."""
    setup = _ok_setup(state)
    if setup is None:
        return np.array([]), _fix_first(lang)
    a = np.asarray(setup.trace().weights)
    b = np.asarray(setup.with_options(temperature=temp).trace().weights)
    allowed = np.asarray(setup.trace().allowed)
    rows, cols = setup.qlabels, setup.klabels
    ent = np.stack([_entropy(a), _entropy(b)], axis=-1)
    return b, (
        matrix_html(a, rows, cols, allowed=allowed, caption=f"T = {num(setup.temperature)}", lang=lang)
        + matrix_html(b, rows, cols, allowed=allowed, caption=f"T = {num(temp)}", lang=lang)
        + "<p>"
        + html.escape(t(lang, "Entropy per row (higher = flatter):"))
        + " "
        + ", ".join(f"{r}: {num(x0, 3)} → {num(x1, 3)}" for r, (x0, x1) in zip(rows, ent, strict=True))
        + ". "
        + html.escape(t(lang, TEMPERATURE_NOTE))
        + "</p>"
    )


TEMPERATURE_NOTE = (
    "The weights spread over the legal keys; masked keys stay exactly 0, and a row with one legal key stays "
    "[1, 0, …] at every temperature."
)


def exp_value(
    state: LabState, row: int = 0, new: tuple[float, ...] = (100.0, 0.0), lang: str = "en"
) -> tuple[float, float, str]:
    """Change v_row to ``new``: the weights stay, the output moves (where to read vs what is read)."""
    setup = _ok_setup(state)
    if setup is None:
        return float("nan"), float("nan"), _fix_first(lang)
    v = np.asarray(setup.v, dtype=np.float64).copy()
    if len(new) != v.shape[1] or not 0 <= row < v.shape[0]:
        msg = t(lang, "This experiment needs V with {n} columns and a row {row}.", n=len(new), row=row)
        return float("nan"), float("nan"), error_html(msg)
    t0 = setup.trace()
    v[row] = new
    t1 = setup.with_options(v=v).trace()
    dw = float(np.nanmax(np.abs(np.asarray(t0.weights) - np.asarray(t1.weights))))
    do = float(np.nanmax(np.abs(np.asarray(t0.output) - np.asarray(t1.output))))
    rows = setup.qlabels
    dcols = tuple(f"d{c}" for c in range(v.shape[1]))
    text = t(
        lang,
        "v{row} := {new}. Largest weight change: {dw}; largest output change: {do}.",
        row=row,
        new=vec(new),
        dw=num(dw),
        do=num(do),
    )
    return (
        dw,
        do,
        (
            f"<p>{html.escape(text)}</p>"
            + matrix_html(np.asarray(t0.output), rows, dcols, caption=t(lang, "output before"), lang=lang)
            + matrix_html(np.asarray(t1.output), rows, dcols, caption=t(lang, "output after"), lang=lang)
            + "<p>"
            + html.escape(t(lang, "The weights depend only on Q and K (where to read); V is what is read."))
            + "</p>"
        ),
    )


def four_pairs(temperature: float = 1.0, lang: str = "en") -> tuple[dict[str, np.ndarray], str]:
    """The four 2-D Q/K pairs with and without the causal mask at ``temperature``."""
    q, k = FOUR_PAIRS
    v = np.eye(4)
    base = Setup(q, k, v, temperature=temperature)
    out = {
        "causal": np.asarray(base.with_options(causal=True).trace().weights),
        "full": np.asarray(base.trace().weights),
    }
    allowed = masks.causal(4)
    rows, cols = base.qlabels, base.klabels
    text = t(lang, FOUR_NOTE, causal=vec(out["causal"][0]), full=vec(out["full"][0]))
    return out, (
        f"<p>q = {', '.join(vec(x) for x in q)}; k = {', '.join(vec(x) for x in k)}; T = {num(temperature)}</p>"
        + matrix_html(
            out["causal"],
            rows,
            cols,
            allowed=allowed,
            caption=t(lang, "causal mask"),
            table_id="al-four-causal",
            lang=lang,
        )
        + matrix_html(out["full"], rows, cols, caption=t(lang, "no mask"), table_id="al-four-full", lang=lang)
        + f"<p>{html.escape(text)}</p>"
    )


FOUR_NOTE = (
    "First row with the causal mask: {causal}: one legal key gets everything, at any temperature. Without the mask "
    "it reads {full}, future keys included."
)


def masked_row_trap(lang: str = "en") -> tuple[dict[str, object], str]:
    """Left padding AND causal: the first query may attend to nothing. What 'raise', 'nan' and 'zero' give."""
    q, k = FOUR_PAIRS
    setup = Setup(
        q,
        k,
        np.eye(4),
        causal=True,
        padding=3,
        padding_side="left",
        query_labels=("PAD", "a", "b", "c"),
        key_labels=("PAD", "a", "b", "c"),
    )
    res: dict[str, Any] = {}
    try:
        setup.trace()
        res["raise"] = "no error"
    except MaskedRowError as err:
        res["raise"] = str(err)
    res["nan"] = np.asarray(setup.trace(masked_rows="nan").weights)
    res["zero"] = np.asarray(setup.trace(masked_rows="zero").weights)
    allowed = np.asarray(setup.trace(masked_rows="zero").allowed)
    rows = setup.qlabels
    raised = (
        str(res["raise"])
        if lang == "en"
        else t(lang, "MaskedRowError: query row {r} may attend to no key at all.", r=rows[0])
    )
    return res, (
        "<p>"
        + html.escape(t(lang, TRAP_NOTE))
        + "</p>"
        + "".join(
            matrix_html(res[policy], rows, rows, allowed=allowed, caption=caption, lang=lang)
            for policy, caption in (
                ("nan", t(lang, "naive: NaN (and NaN spreads to every later layer)")),
                ("zero", t(lang, "policy 'zero' (FlashAttention): weights and output 0")),
            )
        )
        + error_html(t(lang, "policy 'raise' (attnlab's default):") + " " + raised)
    )


TRAP_NOTE = (
    "Left padding (key PAD) combined with the causal mask: query PAD may only see key PAD, which is padding. Its row "
    "has no legal key: softmax over nothing is 0/0."
)


def mask_conventions(lang: str = "en") -> tuple[dict[str, np.ndarray], str]:
    """The same boolean causal mask read as True = may attend and as True = blocked."""
    q, k = FOUR_PAIRS
    setup = Setup(q, k, np.eye(4), causal=True)
    m = compare(setup, "inverted-mask", lang=lang)
    rows, cols = setup.qlabels, setup.klabels
    mask = masks.causal(4)
    grid = "".join(
        "<tr>" + "".join(f"<td style='padding:0 6px'>{'1' if x else '0'}</td>" for x in r) + "</tr>" for r in mask
    )
    return {"right": m.right_weights, "inverted": m.wrong_weights}, (
        "<p>" + html.escape(t(lang, "One boolean mask:")) + "</p>"
        f"<table style='font-family:monospace;width:auto;align-self:flex-start'>{grid}</table>"
        + matrix_html(
            m.right_weights,
            rows,
            cols,
            allowed=mask,
            caption=t(lang, "read as True = may attend (attnlab, PyTorch SDPA)"),
            lang=lang,
        )
        + matrix_html(
            m.wrong_weights,
            rows,
            cols,
            allowed=~mask,
            caption=t(lang, "read as True = blocked (nn.MultiheadAttention)"),
            lang=lang,
        )
        + f"<p>{html.escape(m.explanation)}</p>"
    )


def with_state(state: LabState, **changes: Any) -> LabState:
    """A copy of ``state`` with ``changes``."""
    return replace(state, **changes)
