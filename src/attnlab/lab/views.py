"""A real model seen the way bertviz and Transformer Explainer show it, as SVG strings (no JavaScript).

* :func:`head_view_svg` — bertviz's head view: the tokens in two columns (queries left, keys right), a line from
  query ``i`` to key ``j`` for every head of one layer, its **width the weight** (``MAX_LINE`` px for weight 1),
  one colour per head; hovering a head's lines or its swatch in the legend isolates that head (CSS ``:hover``);
* :func:`neuron_pair` / :func:`neuron_svg` — bertviz's neuron view for one (query, key) pair: the query's and the
  key's vectors **after RoPE**, their elementwise products, and their sum times ``1/√d_k``, which is the score
  the model's softmax got;
* :func:`block_numbers` / :func:`block_svg` — Transformer Explainer's block: embedding → attention → MLP →
  residual stream → next-token distribution at a temperature, with the top tokens and the norm of each stage.

The model view (every layer × head) is :func:`attnlab.lab.svg.grid_svg`. The numbers come from
:class:`attnlab.models.llama.LlamaCapture` (``llama_forward(..., capture=True)``): nothing is recomputed here
except the temperature's softmax.

Shapes: ``weights [h, n, n]`` (one layer's heads), ``allowed [n, n]``, a trace's ``q [B, h, n, d]``,
``k [B, h_kv, n, d]``, ``logits [vocab]``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import OptionError, ShapeError
from .svg import label_svg, png_bytes, text_width, tile_rgb

__all__ = [
    "HEAD_COLOURS",
    "MAX_LINE",
    "MIN_SHOWN",
    "BlockNumbers",
    "HeadSheet",
    "NeuronPair",
    "block_numbers",
    "block_svg",
    "head_sheet",
    "head_view_svg",
    "model_view_cells",
    "model_view_html",
    "neuron_pair",
    "neuron_svg",
]

#: One colour per head (12: MiniLM has 12 heads, SmolLM2 9), each at least 3:1 against white.
HEAD_COLOURS = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#636363",
    "#9c7a00",
    "#0f8c99",
    "#e6550d",
    "#393b79",
    "#637939",
)
#: A line of weight 1 is this many pixels wide (weight w: ``w · MAX_LINE``).
MAX_LINE = 8.0
#: Lines of smaller weight are left out (under 0.08 px, invisible; the SVG stays small).
MIN_SHOWN = 0.01

_ROW = 20.0
_FONT = 13.0


def _svg_open(width: float, height: float, testid: str, title: str, extra: str = "") -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" data-testid="{testid}" role="img" '
        f'aria-label="{html.escape(title)}" style="max-width:none;overflow:visible"{extra}>'
    )


# --------------------------------------------------------------------------------------------------------------
# head view


def head_view_svg(
    weights: Any,
    allowed: Any,
    labels: Sequence[str],
    *,
    heads: Sequence[int] | None = None,
    title: str = "",
    legend: str = "",
    testid: str = "al-head-view",
) -> str:
    """bertviz's head view of one layer.

    Args:
        weights: ``[h, n, n]`` every head's weights (queries, keys).
        allowed: ``[n, n]`` True = may attend (masked pairs get no line).
        labels: ``n`` token labels (queries and keys).
        heads: the heads to draw (default: all), e.g. the ticked boxes of the page.
        title: the title line; ``legend``: a note under it (what the widths mean).
        testid: the SVG's ``data-testid``.

    Every line carries ``data-head``, ``data-q``, ``data-k`` and ``data-w`` (the weight); its ``stroke-width`` is
    ``w · MAX_LINE``; lines under :data:`MIN_SHOWN` are left out.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 3 or w.shape[1] != w.shape[2]:
        raise ShapeError(f"weights: expected [h, n, n] (one layer's heads), got shape {w.shape}")
    h, n, _ = w.shape
    ok = np.broadcast_to(np.asarray(allowed, dtype=bool), (n, n))
    if len(labels) != n:
        raise ShapeError(f"labels: expected {n} labels for weights of shape {w.shape}, got {len(labels)}")
    shown = list(range(h)) if heads is None else sorted({int(j) for j in heads})
    for j in shown:
        if not 0 <= j < h:
            raise OptionError(f"heads: head {j} is outside 0..{h - 1}")
    lw = max(text_width(s, _FONT) for s in labels) + 12
    gap = 260.0
    xl, xr = lw + 8, lw + 8 + gap
    top = 64.0
    width = max(xr + 8 + lw, 16 + text_width(title, 13, bold=True), 16 + text_width(legend, 11)) + 8
    width = max(width, 12 + 46 * h)
    height = top + n * _ROW + 12
    out = [
        _svg_open(
            width, height, testid, title, f' data-heads="{",".join(map(str, shown))}" data-n="{n}" class="al-hv"'
        ),
        "<style>.al-hv:has(.al-hv-head:hover) .al-hv-head:not(:hover){opacity:.08}</style>",
        label_svg(8, 16, title, size=13, bold=True),
        label_svg(8, 32, legend, size=11, fill="#333333"),
    ]
    for i, s in enumerate(labels):
        y = top + i * _ROW + _ROW / 2
        out.append(label_svg(xl - 8, y + 4.5, s, size=_FONT, anchor="end"))
        out.append(label_svg(xr + 8, y + 4.5, s, size=_FONT))
    for j in shown:
        colour = HEAD_COLOURS[j % len(HEAD_COLOURS)]
        g = [f'<g class="al-hv-head" data-head="{j}">']
        sx = 8 + 46 * j
        g.append(f'<rect x="{sx}" y="40" width="12" height="12" fill="{colour}"/>')
        g.append(label_svg(sx + 15, 50.5, f"h{j}", size=11))
        for qi in range(n):
            for ki in range(n):
                wt = w[j, qi, ki]
                if not ok[qi, ki] or not wt >= MIN_SHOWN:
                    continue
                y1, y2 = top + qi * _ROW + _ROW / 2, top + ki * _ROW + _ROW / 2
                g.append(
                    f'<line x1="{xl:.1f}" y1="{y1:.1f}" x2="{xr:.1f}" y2="{y2:.1f}" stroke="{colour}" '
                    f'stroke-width="{wt * MAX_LINE:.4f}" stroke-opacity="0.55" stroke-linecap="round" '
                    f'data-head="{j}" data-q="{qi}" data-k="{ki}" data-w="{wt:.6f}"/>'
                )
        g.append("</g>")
        out.extend(g)
    out.append("</svg>")
    return "".join(out)


# --------------------------------------------------------------------------------------------------------------
# model view


@dataclass(frozen=True)
class HeadSheet:
    """Every head's map in one PNG, ``layers`` rows × ``heads`` columns of ``tile`` px squares (``uri``: a
    ``data:image/png`` URI). The page holds it once, in :meth:`style_html`, and each head's cell shows its square
    (:meth:`tile_html`): one image for 270 heads."""

    uri: str
    layers: int
    heads: int
    tile: int

    def style_html(self) -> str:
        """The ``<style>`` that gives every ``.al-heads`` element the sheet as its background: once in the page (in
        the same shadow root as the squares), so the 66 KB image is parsed once, not once per head."""
        return f"<style>.al-heads{{background-image:url({self.uri});image-rendering:pixelated}}</style>"

    def tile_html(self, layer: int, head: int, *, px: int = 20, title: str = "", outline: str = "") -> str:
        """A ``px``-square ``<span class="al-heads">`` showing head (``layer``, ``head``) of the sheet, with a 2 px
        ``outline`` of that colour drawn inside it (none by default)."""
        if not (0 <= layer < self.layers and 0 <= head < self.heads):
            raise ShapeError(
                f"layer, head: expected 0 <= layer < {self.layers} and 0 <= head < {self.heads}, got ({layer}, {head})"
            )
        return (
            f'<span class="al-heads" role="img" aria-label="L{layer} h{head}" title="{html.escape(title)}" '
            f"style='display:inline-block;vertical-align:middle;width:{px}px;height:{px}px;"
            f"background-position:{-head * px}px {-layer * px}px;"
            f"background-size:{self.heads * px}px {self.layers * px}px"
            + (f";outline:2px solid {outline};outline-offset:-2px" if outline else "")
            + "'></span>"
        )


def head_sheet(weights: Any, allowed: Any, *, size: int = 30) -> HeadSheet:
    """Every head's map of ``weights [L, h, n, n]`` as one :class:`HeadSheet`, each tile about ``size`` px (blue
    ramp, masked cells grey, as :func:`attnlab.lab.svg.grid_svg`)."""
    import base64

    w = np.asarray(weights)
    if w.ndim != 4:
        raise ShapeError(f"weights: expected [L, h, n, n], got shape {w.shape}")
    tiles = np.round(tile_rgb(w, allowed, size=size)).astype(np.uint8)  # [L, h, s, s, 3]
    L, h, s = tiles.shape[:3]
    sheet = tiles.transpose(0, 2, 1, 3, 4).reshape(L * s, h * s, 3)  # [L s, h s, 3]
    return HeadSheet("data:image/png;base64," + base64.b64encode(png_bytes(sheet)).decode(), L, h, s)


def model_view_cells(sheet: HeadSheet, *, selected: tuple[int, int] | None = None, px: int = 20) -> list[list[str]]:
    """Each head's cell of the model view, ``[layer][head]``: its square of the ``sheet``
    (:meth:`HeadSheet.tile_html`) in a ``<span data-layer data-head>``, the ``selected`` one outlined orange
    (``data-selected='1'``)."""
    out = []
    for li in range(sheet.layers):
        row = []
        for hj in range(sheet.heads):
            sel = selected == (li, hj)
            mark = " data-selected='1'" if sel else ""
            row.append(
                f"<span data-layer='{li}' data-head='{hj}'{mark}>"
                + sheet.tile_html(li, hj, px=px, title=f"L{li} h{hj}", outline="#d94801" if sel else "")
                + "</span>"
            )
        out.append(row)
    return out


def model_view_html(table: str, sheet: HeadSheet, *, title: str, testid: str = "al-model-view") -> str:
    """bertviz's model view around ``table`` (HTML: in the lab one marimo table of :func:`model_view_cells`, layers
    as rows and heads as columns, in which a click on a head opens it): the title, and the ``sheet``'s image as
    the style its squares are cut from (for squares outside a shadow root). One table, not a button per head:
    270 marimo buttons took
    seconds of the browser's time for every sentence and slowed every other control of the page."""
    return (
        f'<div data-testid="{testid}" data-layers="{sheet.layers}" data-heads="{sheet.heads}" '
        'style="overflow-x:auto;max-width:100%">'
        f"{sheet.style_html()}<p style='font-weight:bold;margin:4px 0'>{html.escape(title)}</p>{table}</div>"
    )


# --------------------------------------------------------------------------------------------------------------
# neuron view


@dataclass(frozen=True)
class NeuronPair:
    """One (query, key) pair's score taken apart, as bertviz's neuron view shows it.

    Attributes:
        layer, head, query, key: where (``head`` is the query head; ``kv_head`` the key/value head it reads, GQA).
        q, k: ``[d_k]`` the query's and the key's vectors after RoPE (float64).
        products: ``[d_k]`` ``q ⊙ k``; ``dot``: their sum ``q·k``; ``scale``: ``1/√d_k``; ``score``:
            ``dot · scale``.
        model_score: the score the model's softmax got for this pair (``-inf`` where the mask hides the key).
        weight: the model's weight for the pair after the softmax.
    """

    layer: int
    head: int
    kv_head: int
    query: int
    key: int
    q: np.ndarray
    k: np.ndarray
    products: np.ndarray
    dot: float
    scale: float
    score: float
    model_score: float
    weight: float

    @property
    def masked(self) -> bool:
        """Whether the mask hides this key from this query (the model never used the score)."""
        return not math.isfinite(self.model_score)


def _index(name: str, value: int, count: int) -> int:
    v = int(value)
    if v < 0:
        v += count
    if not 0 <= v < count:
        raise OptionError(f"{name}: {value} is outside 0..{count - 1}")
    return v


def neuron_pair(trace: Any, layer: int, head: int, query: int, key: int, *, weights: Any = None) -> NeuronPair:
    """The pieces of one score from a :class:`~attnlab.models.llama.LlamaCapture` (batch 0).

    Args:
        trace: ``llama_forward(..., capture=True).trace``.
        layer, head: the layer and the query head; ``query``, ``key``: token positions (negative from the end).
        weights: ``[h, n, n_k]`` this layer's softmax weights, to report the pair's weight (default: softmax of
            the trace's logits row).
    """
    L = len(trace.q)
    li = _index("layer", layer, L)
    q_all, k_all = trace.q[li][0], trace.k[li][0]  # [h, n, d], [h_kv, n_k, d]
    h, n = q_all.shape[:2]
    hj = _index("head", head, h)
    qi = _index("query", query, n)
    ki = _index("key", key, k_all.shape[1])
    kv = hj // (h // k_all.shape[0])
    q = np.asarray(q_all[hj, qi], dtype=np.float64)
    k = np.asarray(k_all[kv, ki], dtype=np.float64)
    prod = q * k
    dot = float(prod.sum())
    row = np.asarray(trace.logits[li][0, hj, qi], dtype=np.float64)  # [n_k]
    if weights is None:
        e = np.exp(row - row[np.isfinite(row)].max())
        wt = float(e[ki] / e.sum())
    else:
        wt = float(np.asarray(weights)[hj, qi, ki])
    return NeuronPair(
        layer=li,
        head=hj,
        kv_head=kv,
        query=qi,
        key=ki,
        q=q,
        k=k,
        products=prod,
        dot=dot,
        scale=float(trace.scale),
        score=dot * float(trace.scale),
        model_score=float(row[ki]),
        weight=wt,
    )


def _diverging(x: float, top: float) -> str:
    """Blue for positive, red for negative, white for 0 (``|x| = top`` is the darkest)."""
    a = min(abs(x) / top, 1.0) if top > 0 else 0.0
    dark = (33, 102, 172) if x >= 0 else (178, 24, 43)
    r, g, b = (round(255 + (c - 255) * a) for c in dark)
    return f"rgb({r},{g},{b})"


def neuron_svg(
    pair: NeuronPair,
    *,
    title: str,
    rows: tuple[str, str, str],
    sums: tuple[str, ...],
    testid: str = "al-neuron-view",
) -> str:
    """The q and k vectors, their products (one cell per dimension, blue > 0, red < 0; hover shows the value),
    and the lines ``sums`` (the sum, the scale, the model's score), in words given by the caller.

    Args:
        pair: a :class:`NeuronPair`.
        title: the title line; ``rows``: the names of the three rows (q, k, q ⊙ k); ``sums``: lines under them.
        testid: the SVG's ``data-testid``.
    """
    d = pair.q.size
    cw = max(6.0, min(14.0, 700.0 / d))
    name_w = max(text_width(s, 12) for s in rows) + 16
    left = 8 + name_w
    top = 30.0
    ch = 26.0
    width = max(left + d * cw + 12, 16 + max(text_width(s, 12) for s in (title, *sums)) + 8)
    height = top + 3 * (ch + 10) + 10 + 18 * len(sums) + 6
    out = [
        _svg_open(
            width,
            height,
            testid,
            title,
            f' data-dot="{pair.dot!r}" data-score="{pair.score!r}" data-model-score="{pair.model_score!r}"',
        ),
        label_svg(8, 18, title, size=13, bold=True),
    ]
    for r, (name, vec) in enumerate(zip(rows, (pair.q, pair.k, pair.products), strict=True)):
        y = top + r * (ch + 10)
        out.append(label_svg(left - 8, y + ch / 2 + 4, name, size=12, anchor="end"))
        big = float(np.max(np.abs(vec))) or 1.0
        for i, x in enumerate(vec):
            out.append(
                f'<rect x="{left + i * cw:.1f}" y="{y:.1f}" width="{cw - 1:.1f}" height="{ch}" '
                f'fill="{_diverging(float(x), big)}" data-i="{i}" data-v="{float(x)!r}"><title>{i}: {x:.4f}</title>'
                "</rect>"
            )
    y = top + 3 * (ch + 10) + 10
    for s in sums:
        out.append(label_svg(8, y + 4, s, size=12))
        y += 18
    out.append("</svg>")
    return "".join(out)


# --------------------------------------------------------------------------------------------------------------
# block view


@dataclass(frozen=True)
class BlockNumbers:
    """One position's path through the model and the next-token distribution at a temperature.

    Attributes:
        position: the token position (the last one: its logits predict the next token).
        embedding_norm: ``‖x₀‖``, the token embedding's norm.
        attn_norms, mlp_norms: ``[L]`` the norms of what each layer's attention (after W_O) and MLP added.
        residual_norms: ``[L]`` the residual stream's norm after each layer.
        temperature: T; ``probs``: ``[vocab]`` ``softmax(logits / T)`` in float64.
        top_ids: the ``top_k`` most likely next tokens (the same order at every T); ``top_probs``: their
            probabilities at T.
    """

    position: int
    embedding_norm: float
    attn_norms: np.ndarray
    mlp_norms: np.ndarray
    residual_norms: np.ndarray
    temperature: float
    probs: np.ndarray
    top_ids: tuple[int, ...]
    top_probs: np.ndarray


def block_numbers(trace: Any, logits: Any, *, temperature: float = 1.0, top_k: int = 10) -> BlockNumbers:
    """The block view's numbers for the last position of a :class:`~attnlab.models.llama.LlamaCapture` (batch 0).

    Args:
        trace: ``llama_forward(..., capture=True).trace``.
        logits: ``[vocab]`` the last position's logits (``LlamaOutput.logits[0, -1]``).
        temperature: T > 0; the probabilities are ``softmax(logits / T)`` (float64).
        top_k: how many of the most likely tokens to list (1 .. vocab).
    """
    t = float(temperature)
    if not (math.isfinite(t) and t > 0):
        raise OptionError(f"temperature: expected a number > 0, got {temperature!r}")
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim != 1:
        raise ShapeError(f"logits: expected the last position's [vocab] logits, got shape {z.shape}")
    if not 1 <= int(top_k) <= z.size:
        raise OptionError(f"top_k: expected 1..{z.size}, got {top_k!r}")
    s = z / t
    e = np.exp(s - s.max())
    p = e / e.sum()  # [vocab]
    top = np.argsort(-z, kind="stable")[: int(top_k)]

    def norms(arrs: Sequence[np.ndarray]) -> np.ndarray:
        return np.array([float(np.linalg.norm(np.asarray(a[0, -1], dtype=np.float64))) for a in arrs])

    n = trace.embeddings.shape[1]
    return BlockNumbers(
        position=n - 1,
        embedding_norm=float(np.linalg.norm(np.asarray(trace.embeddings[0, -1], dtype=np.float64))),
        attn_norms=norms(trace.attn_out),
        mlp_norms=norms(trace.mlp_out),
        residual_norms=norms(trace.residual),
        temperature=t,
        probs=p,
        top_ids=tuple(int(i) for i in top),
        top_probs=p[top],
    )


_SERIES = (("#1f77b4", "residual"), ("#d62728", "attention"), ("#2ca02c", "MLP"))


def block_svg(
    b: BlockNumbers,
    *,
    token_labels: Sequence[str],
    layer: int,
    words: dict[str, str],
    testid: str = "al-block-view",
) -> str:
    """Embedding → L × (attention, +, MLP, +) → final norm → softmax(z/T), the stages' norms per layer as lines,
    and the top tokens as bars.

    Args:
        b: a :class:`BlockNumbers`.
        token_labels: labels of ``b.top_ids``.
        layer: the layer whose numbers the boxes show (the page's layer).
        words: the page's words for ``title``, ``embedding``, ``attention``, ``mlp``, ``residual``, ``head``
            (final norm and LM head), ``norms`` (the chart's title), ``top`` (the bars' title), ``layer``, and the
            chart's legend ``attention_all``, ``mlp_all``.
        testid: the SVG's ``data-testid``.
    """
    L = b.attn_norms.size
    li = min(max(int(layer), 0), L - 1)
    boxes = (
        (words["embedding"], f"‖x₀‖ = {b.embedding_norm:.2f}"),
        (words["attention"], f"‖Δ‖ = {b.attn_norms[li]:.2f}"),
        (words["mlp"], f"‖Δ‖ = {b.mlp_norms[li]:.2f}"),
        (words["residual"], f"‖x‖ = {b.residual_norms[li]:.2f}"),
        (words["head"], f"T = {b.temperature:g}"),
    )
    bws = [max(text_width(a, 12, bold=True), text_width(c, 12)) + 20 for a, c in boxes]
    arrow = 26.0
    xs = [8 + sum(bws[:i]) + i * arrow for i in range(len(boxes))]
    top = 34.0
    bh = 50.0
    flow_w = xs[-1] + bws[-1]
    chart_w, chart_h = 420.0, 170.0
    lab_w = max(text_width(s, 12) for s in token_labels) + 10
    bars_w = lab_w + 220 + 70
    width = max(
        flow_w + 8,
        8 + chart_w + 40 + max(bars_w, text_width(words["top"], 12, bold=True)) + 8,
        16 + text_width(words["title"], 13, bold=True),
        xs[1] + text_width(words["layer"], 11) + 8,
    )
    y2 = top + bh + 46
    height = y2 + max(chart_h + 56, 22 + 20 * len(b.top_ids)) + 10
    out = [
        _svg_open(width, height, testid, words["title"], f' data-t="{b.temperature!r}" data-layer="{li}"'),
        label_svg(8, 18, words["title"], size=13, bold=True),
    ]
    for i, (name, val) in enumerate(boxes):
        x, bw = xs[i], bws[i]
        fill = "#fff5eb" if i in (1, 2) else "#f0f0f0"
        out.append(f'<rect x="{x:.1f}" y="{top}" width="{bw:.1f}" height="{bh}" rx="6" fill="{fill}" stroke="#555"/>')
        out.append(label_svg(x + bw / 2, top + 20, name, size=12, anchor="middle", bold=True, bg=fill))
        out.append(label_svg(x + bw / 2, top + 38, val, size=12, anchor="middle", bg=fill))
        if i:
            ax = x - arrow
            out.append(
                f'<path d="M{ax + 3:.1f},{top + bh / 2} L{x - 4:.1f},{top + bh / 2} M{x - 9:.1f},{top + bh / 2 - 4} '
                f'L{x - 4:.1f},{top + bh / 2} L{x - 9:.1f},{top + bh / 2 + 4}" stroke="#333" fill="none"/>'
            )
    out.append(
        label_svg(xs[1], top + bh + 16, words["layer"], size=11, fill="#333333")
    )  # which layer the middle boxes show
    # the norms across layers
    cx, cy = 44.0, y2 + 20
    out.append(label_svg(8, y2 + 8, words["norms"], size=12, bold=True))
    big = float(max(b.residual_norms.max(), b.attn_norms.max(), b.mlp_norms.max(), 1e-9))
    out.append(f'<rect x="{cx}" y="{cy}" width="{chart_w - 36}" height="{chart_h}" fill="none" stroke="#999"/>')
    pw = chart_w - 36
    for frac in (0.0, 0.5, 1.0):
        out.append(label_svg(cx - 4, cy + chart_h - frac * chart_h + 4, f"{big * frac:.0f}", size=10, anchor="end"))
    for colour, key in _SERIES:
        vals = {"residual": b.residual_norms, "attention": b.attn_norms, "MLP": b.mlp_norms}[key]
        pts = " ".join(
            f"{cx + pw * i / max(L - 1, 1):.1f},{cy + chart_h - chart_h * v / big:.1f}" for i, v in enumerate(vals)
        )
        out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2" data-series="{key}"/>')
    sel_x = cx + pw * li / max(L - 1, 1)
    out.append(
        f'<line x1="{sel_x:.1f}" y1="{cy}" x2="{sel_x:.1f}" y2="{cy + chart_h}" stroke="#d94801" '
        'stroke-dasharray="3,3"/>'
    )
    lx = cx
    for colour, key in _SERIES:
        name = words[{"residual": "residual", "attention": "attention_all", "MLP": "mlp_all"}[key]]
        out.append(f'<rect x="{lx}" y="{cy + chart_h + 10}" width="12" height="4" fill="{colour}"/>')
        out.append(label_svg(lx + 16, cy + chart_h + 16, name, size=11))
        lx += 16 + text_width(name, 11) + 14
    out.append(label_svg(cx + pw, cy + chart_h + 32, f"0 … {L - 1}", size=10, anchor="end"))
    # the top tokens
    bx = 8 + chart_w + 40
    out.append(label_svg(bx, y2 + 8, words["top"], size=12, bold=True))
    for r, (lab, pr) in enumerate(zip(token_labels, b.top_probs, strict=True)):
        y = y2 + 22 + 20 * r
        out.append(label_svg(bx + lab_w - 6, y + 12, lab, size=12, anchor="end"))
        out.append(
            f'<rect x="{bx + lab_w:.1f}" y="{y + 2}" width="{220 * float(pr):.2f}" height="14" fill="#3182bd" '
            f'data-p="{float(pr)!r}" data-id="{b.top_ids[r]}"/>'
        )
        out.append(label_svg(bx + lab_w + 220 * float(pr) + 6, y + 13, f"{float(pr):.4f}", size=11))
    out.append("</svg>")
    return "".join(out)
