"""Pictures of attention (extra ``plot``: matplotlib, imported only when a function here is called).

* :func:`heatmap`: weights ``[n_q, n_k]``, rows = queries, columns = keys, masked cells hatched grey (distinct from
  weights that are merely small), NaN dark red (a NaN row of ``masked_rows='nan'`` cross-hatched "nan"), row sums
  at the right (``Σ=nan`` for a NaN row, ``Σ=0`` for a ``masked_rows='zero'`` row), a legend for the
  kinds of cell present, a colour bar;
* :func:`head_grid`: one heatmap per head ``[h, n_q, n_k]``, each with its row sums;
* :func:`last_row_bar`: the last query's real weights as bars (a masked key has no bar, it says "masked");
* :func:`mask_picture`: a boolean mask (■ may attend, ⬚ blocked);
* :func:`growth_plot`: the T² growth of the score matrix (1,024 -> 4,096 tokens = 16x elements);
* :func:`save` / :func:`to_bytes`: PNG, SVG (real ``<text>``) or PDF.

Figures are sized to their cells (:mod:`attnlab.plot.layout`): text is never smaller than 7 pt and the figure grows
instead, so numbers fit their cells and nothing is cut off at any size; text colours contrast at least 4.5:1 (WCAG)
with what they sit on. Every function returns a :class:`matplotlib.figure.Figure` built without pyplot (no global
state, no GUI backend), so it works in scripts, servers and notebooks alike. How to read a heatmap (article 000):
check the axes, the mask and the row sums first; a large weight says where a query reads from, not what caused the
answer.
"""

from __future__ import annotations

import contextvars
import functools
import io
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._arrays import to_numpy
from ..errors import DTypeError, OptionError, ShapeError, missing_extra
from ..explain.fmt import NAN_COLOUR, num, row_sum
from ..validate import check_int
from . import layout

__all__ = [
    "CJK_FONTS",
    "FORMATS",
    "growth_plot",
    "head_grid",
    "heatmap",
    "last_row_bar",
    "mask_picture",
    "save",
    "to_bytes",
]

#: File formats :func:`save` writes, by extension.
FORMATS = ("png", "svg", "pdf")

#: Cell styles (face colour, hatch) that are not a weight. Their text colours are picked by WCAG contrast.
MASKED_STYLE = {"facecolor": "#d9d9d9", "hatch": "///", "hatchcolor": "#969696"}
POLICY_NAN_STYLE = {"facecolor": NAN_COLOUR, "hatch": "xx", "hatchcolor": "#fcbba1"}
NAN_STYLE = {"facecolor": NAN_COLOUR, "hatch": "", "hatchcolor": NAN_COLOUR}
#: The language of the figure being built (set by each public function's ``lang=``; English by default).
_LANG: contextvars.ContextVar[str] = contextvars.ContextVar("attnlab_plot_lang", default="en")
#: Fonts for a Chinese figure: DejaVu for Latin and symbols, WenQuanYi Micro Hei (fonts-wqy-microhei) for CJK.
CJK_FONTS = ["DejaVu Sans", "WenQuanYi Micro Hei", "Noto Sans CJK SC"]


def _w(key: str, **fields: Any) -> str:
    """The figure's word ``key`` in the language being drawn (:mod:`attnlab.i18n`, keys ``plot.``)."""
    from ..i18n import tr

    return tr(f"plot.{key}", _LANG.get(), **fields)


@functools.cache
def _cjk_fonts() -> list[str]:
    """:data:`CJK_FONTS` that matplotlib knows, registering an installed WenQuanYi/Noto CJK file its font cache
    (built before the font was installed) may lack."""
    from matplotlib import font_manager

    known = {f.name for f in font_manager.fontManager.ttflist}
    if not known & set(CJK_FONTS[1:]):
        for path in font_manager.findSystemFonts():
            if any(k in Path(path).name.lower() for k in ("wqy", "notosanscjk")):
                font_manager.fontManager.addfont(path)
        known = {f.name for f in font_manager.fontManager.ttflist}
    return [f for f in CJK_FONTS if f in known] or CJK_FONTS[:1]


def _in_lang(fn: Any) -> Any:
    """``fn(..., lang="en"|"zh")``: its words in ``lang``; every figure is built with DejaVu and a CJK fallback
    (:data:`CJK_FONTS`): an English figure can have Chinese token labels (the padding example's 我 喜欢 猫)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, lang: str = "en", **kwargs: Any) -> Any:
        from ..i18n import check_lang

        lang = check_lang(lang)
        token = _LANG.set(lang)
        try:
            try:
                from matplotlib import rc_context
            except ImportError:  # fn says how to install it
                return fn(*args, **kwargs)
            with rc_context({"font.family": _cjk_fonts()}):
                return fn(*args, **kwargs)
        finally:
            _LANG.reset(token)

    return wrapper


_LEAK_EDGE = "#cb181d"
_MASKED_TEXT = "#525252"  # 5.5:1 on the masked grey


def _new_figure(figsize: tuple[float, float] | None) -> Any:
    try:
        import matplotlib  # noqa: F401  # only whether it imports
    except ImportError:
        raise missing_extra("matplotlib", "plot") from None
    return layout.agg_figure(figsize or (6.0, 4.0))


def _matrix(x: Any, name: str, ndim: int = 2) -> np.ndarray:
    a = np.asarray(to_numpy(x) if not isinstance(x, (list, tuple)) else np.asarray(x))
    while a.ndim > ndim and a.shape[0] == 1:
        a = a[0]
    if a.ndim != ndim:
        legend = "[n_q, n_k]" if ndim == 2 else "[h, n_q, n_k]"
        raise ShapeError(f"{name}: expected {legend}, got shape {a.shape}")
    return a


def _weights(weights: Any, allowed: Any, ndim: int = 2) -> tuple[np.ndarray, np.ndarray]:
    w = _matrix(weights, "weights", ndim)
    if w.dtype == np.bool_ or not np.issubdtype(w.dtype, np.number):
        raise DTypeError(f"weights: expected numbers, got dtype {w.dtype}")
    w = w.astype(np.float64)
    if allowed is None:
        ok = np.ones(w.shape, dtype=bool)
    else:
        ok = np.asarray(to_numpy(allowed))
        if ok.dtype != np.bool_:
            raise DTypeError(f"allowed: expected a bool mask (True = may attend), got dtype {ok.dtype}")
        try:
            ok = np.broadcast_to(ok, w.shape)
        except ValueError:
            raise ShapeError(f"allowed: shape {ok.shape} does not fit weights {w.shape}") from None
    return w, ok


def _labels(labels: Sequence[str] | None, n: int, name: str, prefix: str) -> list[str]:
    if labels is None:
        return [f"{prefix}{i}" for i in range(n)]
    labels = [str(x) for x in labels]
    if len(labels) != n:
        raise ShapeError(f"{name}: {len(labels)} label(s) for {n} positions")
    return labels


def cell_text(x: float) -> str:
    """A weight as it is written in a heatmap cell: as every table writes it (:func:`attnlab.explain.fmt.num`, the
    one rule: 4 decimals, more near 0 and 1), so 0.000045 is never a rounded 0.

    >>> [cell_text(x) for x in (0.0, 1.0, 0.5, 0.123456, 0.001, 0.0000453979, 0.99926, 0.9999546, float("nan"))]
    ['0', '1', '0.5', '0.1235', '0.001', '0.000045', '0.99926', '0.999955', 'nan']
    """
    return num(x)


def row_sum_text(s: float) -> str:
    """A row sum as written at the right of a heatmap (:func:`attnlab.explain.fmt.row_sum`): ``Σ=1``, ``Σ=0`` (a
    zero-policy row), ``Σ=nan``."""
    return row_sum(s)


@dataclass(frozen=True)
class Cells:
    """What each cell of ``[n_q, n_k]`` weights is, for drawing (bool arrays of the weights' shape).

    * ``weight``: allowed and finite (drawn in the colour map);
    * ``masked``: blocked by the mask with weight exactly 0;
    * ``policy_nan``: NaN in a row the mask blocks entirely (``masked_rows='nan'``);
    * ``nan``: NaN or inf anywhere else (a broken computation);
    * ``leak``: blocked, finite and not 0 (drawn in the colour map with a red border).
    """

    weight: np.ndarray
    masked: np.ndarray
    policy_nan: np.ndarray
    nan: np.ndarray
    leak: np.ndarray

    @classmethod
    def of(cls, w: np.ndarray, ok: np.ndarray) -> Cells:
        finite = np.isfinite(w)
        blocked = ~ok
        policy_nan = blocked & np.isnan(w) & blocked.all(axis=-1, keepdims=True)
        return cls(
            weight=ok & finite,
            masked=blocked & (w == 0),
            policy_nan=policy_nan,
            nan=~finite & ~policy_nan,
            leak=blocked & finite & (w != 0),
        )

    def kinds(self) -> list[str]:
        """The kinds of cells present (their legend words: :mod:`attnlab.i18n` keys ``plot.legend.``)."""
        present = {"masked": self.masked, "policy-nan": self.policy_nan, "nan": self.nan, "leak": self.leak}
        return [k for k, m in present.items() if m.any()]


def _legend_handles(kinds: Sequence[str]) -> list[Any]:
    from matplotlib.patches import Patch

    styles = {"masked": MASKED_STYLE, "policy-nan": POLICY_NAN_STYLE, "nan": NAN_STYLE}
    out = []
    for k in kinds:
        if k == "leak":
            out.append(Patch(facecolor="#6baed6", edgecolor=_LEAK_EDGE, linewidth=1.5, label=_w(f"legend.{k}")))
        else:
            st: dict[str, Any] = styles[k]
            out.append(Patch(**st, edgecolor=st["hatchcolor"], linewidth=0.5, label=_w(f"legend.{k}")))
    return out


def _cell_patches(ax: Any, where: np.ndarray, style: dict[str, Any], label: str) -> None:
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    ii, jj = np.nonzero(where)
    if ii.size == 0:
        return
    rects = [Rectangle((j - 0.5, i - 0.5), 1, 1) for i, j in zip(ii, jj, strict=True)]
    coll = PatchCollection(rects, linewidth=0.0, edgecolor=style["hatchcolor"], **style, label=label)
    ax.add_collection(coll)


@dataclass(frozen=True)
class _Sizes:
    """Cell size (inches) and fonts (points) of one heatmap panel."""

    cell_w: float
    cell_h: float
    value_pt: float
    show: bool  # numbers in cells
    masked_label: bool  # the word "masked" in masked cells
    rotate_x: bool  # key labels vertical


def _axis_labels(
    query_labels: Sequence[str] | None, key_labels: Sequence[str] | None, n_q: int, n_k: int
) -> tuple[list[str], list[str]]:
    """The rows' and columns' labels (``q0, q1, ...`` and ``k0, k1, ...`` where none are given)."""
    return _labels(query_labels, n_q, "query_labels", "q"), _labels(key_labels, n_k, "key_labels", "k")


def _figure_and_sizes(
    w: np.ndarray, cells: Cells, kl: list[str], values: bool | None, figsize: tuple[float, float] | None
) -> tuple[Any, _Sizes]:
    """A new figure and the cell sizes that fit the texts, measured with its renderer."""
    fig = _new_figure(figsize)
    return fig, _sizes(w, cells, kl, values, fig.canvas.get_renderer())


def _sizes(w: np.ndarray, cells: Cells, kl: list[str], values: bool | None, renderer: Any) -> _Sizes:
    """Cells wide and tall enough for the texts in them; ``w`` is ``[n_q, n_k]`` or ``[h, n_q, n_k]``."""
    n_q, n_k = w.shape[-2:]
    n = max(n_q, n_k)
    base = float(np.clip(7.0 / n, 0.22, 0.55))
    show = values if values is not None else n <= 12
    value_pt = layout.VALUE_PT if n <= 12 else layout.VALUE_PT_DENSE
    cell_w = cell_h = base
    masked_label = False
    if show:
        strings = [cell_text(x) for x in w[cells.weight | cells.leak | cells.nan]]
        strings += ["nan"] if cells.policy_nan.any() else []
        tw, th = layout.widest(renderer, strings, value_pt)
        cell_w = max(base, tw + 0.1)
        mw, mh = layout.widest(renderer, [_w("masked")], value_pt)
        masked_label = bool(cells.masked.any()) and mw + 0.1 <= cell_w
        cell_h = max(base, max(th, mh) + 0.12)
    kw, kh = layout.widest(renderer, kl, layout.TICK_PT)
    rotate_x = kw + 0.06 > cell_w
    cell_w = max(cell_w, kh + 0.08)  # vertical key labels side by side
    _, qh = layout.widest(renderer, [row_sum(1.0)], layout.TICK_PT)  # a height: any sum is as tall
    cell_h = max(cell_h, qh + 0.08)  # query labels and row sums one above the other
    return _Sizes(cell_w, cell_h, value_pt, bool(show), masked_label, rotate_x)


def _draw(
    ax: Any,
    w: np.ndarray,
    ok: np.ndarray,
    ql: list[str],
    kl: list[str],
    sizes: _Sizes,
    *,
    row_sums: bool,
    cmap: str,
    y_labels: bool = True,
    x_labels: bool = True,
) -> Any:
    """One heatmap on ``ax``; returns the image (for a colour bar)."""
    from matplotlib import colormaps
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Rectangle

    n_q, n_k = w.shape
    cells = Cells.of(w, ok)
    cm = colormaps[cmap]
    shown = cells.weight | cells.leak
    img = ax.imshow(
        np.ma.masked_array(np.where(shown, w, 0.0), mask=~shown),
        cmap=cm.with_extremes(bad="white"),
        vmin=0.0,
        vmax=1.0,
        aspect="auto",
        interpolation="nearest",
    )
    _cell_patches(
        ax, cells.masked, MASKED_STYLE, "masked"
    )  # the collection's label (tests find cells by it), not shown
    _cell_patches(ax, cells.policy_nan, POLICY_NAN_STYLE, "policy-nan")
    _cell_patches(ax, cells.nan, NAN_STYLE, "nan")
    for i, j in zip(*np.nonzero(cells.leak), strict=True):
        ax.add_patch(Rectangle((j - 0.45, i - 0.45), 0.9, 0.9, facecolor="none", edgecolor=_LEAK_EDGE, linewidth=1.5))
    if sizes.show:
        fs = sizes.value_pt
        pad = {"boxstyle": "square,pad=0.15", "linewidth": 0}
        for i in range(n_q):
            for j in range(n_k):
                x = w[i, j]
                if cells.masked[i, j]:
                    if sizes.masked_label:
                        bg = MASKED_STYLE["facecolor"]
                        ax.text(
                            j,
                            i,
                            _w("masked"),
                            ha="center",
                            va="center",
                            fontsize=fs,
                            color=_MASKED_TEXT,
                            bbox={**pad, "facecolor": bg},
                        )
                elif cells.policy_nan[i, j] or cells.nan[i, j]:
                    bg = (POLICY_NAN_STYLE if cells.policy_nan[i, j] else NAN_STYLE)["facecolor"]
                    ax.text(
                        j,
                        i,
                        cell_text(x),
                        ha="center",
                        va="center",
                        fontsize=fs,
                        color=layout.ink(to_rgb(bg)),
                        bbox={**pad, "facecolor": bg},
                    )
                else:
                    ax.text(
                        j,
                        i,
                        cell_text(x),
                        ha="center",
                        va="center",
                        fontsize=fs,
                        color=layout.ink(cm(float(np.clip(x, 0.0, 1.0)))),
                    )
    ax.set_xticks(range(n_k), kl if x_labels else [], rotation=90 if sizes.rotate_x else 0, ha="center")
    ax.set_yticks(range(n_q), ql if y_labels else [])
    ax.tick_params(labelsize=layout.TICK_PT)
    ax.set_xlim(-0.5, n_k - 0.5)
    ax.set_ylim(n_q - 0.5, -0.5)
    if row_sums:
        sums = w.sum(axis=-1)  # masked weights are 0; a NaN row (masked_rows='nan') sums to nan, not 0
        ax2 = ax.secondary_yaxis("right")
        ax2.set_yticks(range(n_q), [row_sum_text(s) for s in sums])
        ax2.tick_params(length=0, labelsize=layout.TICK_PT)
    return img


def _colorbar(fig: Any, img: Any, ax: Any, height_in: float, aspect: float = 25) -> Any:
    """The weights' colour bar beside ``ax`` (one axes or a list), its ticks thinned below 1.6 inches."""
    cb = fig.colorbar(img, ax=ax, aspect=aspect, pad=0.02)
    cb.set_label(_w("weight"), fontsize=layout.LABEL_PT)
    cb.set_ticks([0.0, 0.25, 0.5, 0.75, 1.0] if height_in >= 1.6 else [0.0, 0.5, 1.0])
    cb.ax.tick_params(labelsize=layout.TICK_PT)
    return cb


def _legend(fig: Any, handles: list[Any]) -> None:
    """The figure's legend of cell kinds, under the axes (none without ``handles``)."""
    if handles:
        fig.legend(handles=handles, loc="outside lower center", fontsize=layout.TICK_PT, frameon=False)


def _title(text: str, width_in: float) -> str:
    """``text`` wrapped to about the figure's width at the title's font size (never narrower than 28 characters)."""
    chars = max(28, int(width_in * 72 / (0.6 * layout.TITLE_PT)))
    return textwrap.fill(text, width=chars)


@_in_lang
def heatmap(
    weights: Any,
    allowed: Any = None,
    *,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    title: str | None = None,
    values: bool | None = None,
    row_sums: bool = True,
    colorbar: bool = True,
    cmap: str = "Blues",
    figsize: tuple[float, float] | None = None,
) -> Any:
    """A heatmap of attention weights: rows = queries, columns = keys.

    The figure is sized to its cells (text keeps its size, at least :data:`attnlab.plot.layout.MIN_FONT_PT`
    points, and the figure grows): every number fits its cell and nothing is cut off, from 1×1 to 32×32 and beyond.

    Args:
        weights: ``[n_q, n_k]`` (leading axes of size 1 are dropped).
        allowed: bool ``[n_q, n_k]`` (broadcastable), True = may attend. Blocked cells with weight 0 are hatched
            grey ("masked"), so they never look like a weight that is merely small; a fully blocked row of NaN
            (``masked_rows='nan'``) is dark red cross-hatched "nan" (``NAN_COLOUR``); any other NaN is dark red; a
            blocked cell with a
            weight that is not 0 (a leak) keeps its colour with a red border. A legend names the kinds present.
        query_labels, key_labels: tokens for the rows and columns.
        values: write each weight in its cell (default: when both sides are <= 12).
        row_sums: show each row's sum at the right: 1 for every legal row of a correct softmax, 0 for a row
            zeroed by ``masked_rows='zero'``, nan for a NaN row.
        figsize: a fixed size in inches instead of the fitted one (then text may not fit its cells).

    Returns:
        a matplotlib ``Figure``; save it with :func:`save`.

    Shapes:
        weights, allowed ``[n_q, n_k]``.

    >>> fig = heatmap([[1.0, 0.0], [0.33, 0.67]], [[True, False], [True, True]], key_labels=["I", "am"])
    >>> fig.axes[0].get_xlabel()
    'key (column): read from'
    """
    w, ok = _weights(weights, allowed)
    n_q, n_k = w.shape
    ql, kl = _axis_labels(query_labels, key_labels, n_q, n_k)
    cells = Cells.of(w, ok)
    fig, sz = _figure_and_sizes(w, cells, kl, values, figsize)
    ax = fig.add_subplot()
    img = _draw(ax, w, ok, ql, kl, sz, row_sums=row_sums, cmap=cmap)
    ax.set_xlabel(_w("key_axis"), fontsize=layout.LABEL_PT)
    ax.set_ylabel(_w("query_axis"), fontsize=layout.LABEL_PT)
    panel = (n_k * sz.cell_w, max(n_q * sz.cell_h, 1.0 if colorbar else 0.0))
    if colorbar:
        _colorbar(fig, img, ax, panel[1])
    _legend(fig, _legend_handles(cells.kinds()))
    # a figure title (not the axes'): constrained layout keeps it above the axis labels too, at any width
    fig.suptitle(_title(title or _w("title.weights"), panel[0] + 1.5), fontsize=layout.TITLE_PT)
    if figsize is None:
        fig.set_size_inches(panel[0] + 2.5, panel[1] + 2.0)
        layout.fit(fig, [ax], panel)
    return fig


@_in_lang
def head_grid(
    weights: Any,
    allowed: Any = None,
    *,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    head_names: Sequence[str] | None = None,
    columns: int = 4,
    title: str | None = None,
    values: bool | None = False,
    row_sums: bool = True,
) -> Any:
    """One heatmap per head, in a grid, sharing one colour scale, each with its row sums; masked and NaN cells are
    drawn as in :func:`heatmap`, with one legend. Query labels are written left of the first column, key labels
    under each panel that has none below it.

    Shapes:
        weights ``[h, n_q, n_k]``; allowed broadcastable to it (e.g. ``[n_q, n_k]``).
    """
    w, ok = _weights(weights, allowed, ndim=3)
    h, n_q, n_k = w.shape
    ql, kl = _axis_labels(query_labels, key_labels, n_q, n_k)
    names = _labels(head_names, h, "head_names", _w("head") + " ")
    cols = min(check_int("columns", columns, minimum=1), h)
    rows = -(-h // cols)
    cells = Cells.of(w, ok)
    fig, sz = _figure_and_sizes(w, cells, kl, values, None)
    axes = fig.subplots(rows, cols, squeeze=False)
    img = None
    panels = []
    for idx in range(rows * cols):
        r, c = divmod(idx, cols)
        ax = axes[r][c]
        if idx >= h:
            ax.remove()
            continue
        below = idx + cols < h  # another panel under this one
        img = _draw(
            ax, w[idx], ok[idx], ql, kl, sz, row_sums=row_sums, cmap="Blues", y_labels=c == 0, x_labels=not below
        )
        ax.set_title(names[idx], fontsize=layout.LABEL_PT)
        if c == 0:
            ax.set_ylabel(_w("query"), fontsize=layout.LABEL_PT)
        if not below:
            ax.set_xlabel(_w("key"), fontsize=layout.LABEL_PT)
        panels.append(ax)
    panel = (n_k * sz.cell_w, n_q * sz.cell_h)
    _colorbar(fig, img, panels, rows * panel[1], aspect=30)
    _legend(fig, _legend_handles(cells.kinds()))
    fig.suptitle(_title(title or _w("title.heads", h=h), cols * (panel[0] + 1.2)), fontsize=layout.TITLE_PT)
    fig.set_size_inches(cols * (panel[0] + 1.5) + 1.5, rows * (panel[1] + 1.2) + 1.0)
    layout.fit(fig, panels, panel, (rows, cols))
    return fig


@_in_lang
def last_row_bar(
    weights: Any,
    allowed: Any = None,
    *,
    key_labels: Sequence[str] | None = None,
    query_label: str | None = None,
    title: str | None = None,
) -> Any:
    """The last query's weights as a bar chart (the article's "last row's real weights").

    A masked key has no bar (a grey × on the baseline and the word "masked"); a NaN weight has no bar either and
    says "nan". Each bar carries its value; the title gives the row's sum (nan for a NaN row).

    Shapes:
        weights ``[n_q, n_k]`` (the last row is drawn) or ``[n_k]``.
    """
    w = np.asarray(to_numpy(weights) if not isinstance(weights, (list, tuple)) else weights, dtype=np.float64)
    if w.ndim == 1:
        w = w[None, :]
    w, ok = _weights(w, allowed)
    cells = Cells.of(w[-1:], ok[-1:])
    row = w[-1]
    n_k = len(row)
    kl = _labels(key_labels, n_k, "key_labels", "k")
    fig = _new_figure(None)
    renderer = fig.canvas.get_renderer()
    strings = [cell_text(x) for x in row] + [_w("masked")]
    tw, _ = layout.widest(renderer, strings, layout.VALUE_PT)
    kw, kh = layout.widest(renderer, kl, layout.TICK_PT)
    slot = max(0.35, tw + 0.1, kh + 0.08)
    rotate = kw + 0.06 > slot
    ax = fig.add_subplot()
    heights = np.where(cells.weight[0] | cells.leak[0], row, 0.0)
    bars = ax.bar(range(n_k), heights, color="#3182bd", width=0.8)
    for j, b in enumerate(bars):
        if cells.masked[0, j]:
            ax.plot([j], [0.0], marker="x", color="#737373", markersize=6, clip_on=False)
            ax.text(j, 0.04, _w("masked"), ha="center", va="bottom", fontsize=layout.VALUE_PT, color=_MASKED_TEXT)
        elif cells.policy_nan[0, j] or cells.nan[0, j]:
            ax.plot([j], [0.0], marker="x", color=NAN_STYLE["facecolor"], markersize=6, clip_on=False)
            ax.text(j, 0.04, "nan", ha="center", va="bottom", fontsize=layout.VALUE_PT, color=NAN_COLOUR)
        else:
            if cells.leak[0, j]:
                b.set(edgecolor=_LEAK_EDGE, linewidth=1.5)
            ax.text(j, b.get_height() + 0.02, cell_text(row[j]), ha="center", va="bottom", fontsize=layout.VALUE_PT)
    kinds = cells.kinds()
    if kinds:
        from matplotlib.lines import Line2D

        colour = {"masked": "#737373", "policy-nan": NAN_STYLE["facecolor"], "nan": NAN_STYLE["facecolor"]}
        handles = [
            Line2D([], [], linestyle="", marker="x", color=colour[k], label=_w(f"legend.{k}"))
            if k in colour
            else _legend_handles([k])[0]
            for k in kinds
        ]
        _legend(fig, handles)
    ax.set_xticks(range(n_k), kl, rotation=90 if rotate else 0)
    ax.tick_params(labelsize=layout.TICK_PT)
    ax.set_xlim(-0.5, n_k - 0.5)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel(_w("weight"), fontsize=layout.LABEL_PT)
    ax.set_xlabel(_w("key"), fontsize=layout.LABEL_PT)
    q = query_label or f"q{w.shape[0] - 1}"
    total = row.sum()
    panel = (n_k * slot, 2.0)
    fig.suptitle(
        _title(title or _w("title.last_row", q=q, s=num(total, 3)), panel[0] + 1.0),
        fontsize=layout.TITLE_PT,
    )
    fig.set_size_inches(panel[0] + 1.2, panel[1] + 1.5)
    layout.fit(fig, [ax], panel)
    return fig


@_in_lang
def mask_picture(
    allowed: Any,
    *,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    title: str | None = None,
) -> Any:
    """A boolean mask ``[n_q, n_k]`` as a picture: dark = may attend (■), light = blocked (⬚)."""
    m = _matrix(allowed, "allowed")
    if m.dtype != np.bool_:
        raise DTypeError(f"allowed: expected a bool mask (True = may attend), got dtype {m.dtype}")
    n_q, n_k = m.shape
    ql, kl = _axis_labels(query_labels, key_labels, n_q, n_k)
    from matplotlib import colormaps

    fig = _new_figure(None)
    renderer = fig.canvas.get_renderer()
    cell = float(np.clip(7.0 / max(n_q, n_k), 0.22, 0.5))
    kw, kh = layout.widest(renderer, kl, layout.TICK_PT)
    rotate = kw + 0.06 > cell
    cell = max(cell, kh + 0.08)
    ax = fig.add_subplot()
    cm, norm = colormaps["Greys"], lambda x: (x + 0.25) / 1.5
    ax.imshow(m.astype(float), cmap=cm, vmin=-0.25, vmax=1.25, aspect="auto", interpolation="nearest")
    if n_q * n_k <= 400:
        fs = layout.VALUE_PT if max(n_q, n_k) <= 12 else layout.VALUE_PT_DENSE
        ink = {v: layout.ink(cm(norm(float(v)))) for v in (False, True)}
        for i in range(n_q):
            for j in range(n_k):
                ax.text(j, i, "■" if m[i, j] else "⬚", ha="center", va="center", fontsize=fs, color=ink[bool(m[i, j])])
    ax.set_xticks(range(n_k), kl, rotation=90 if rotate else 0)
    ax.set_yticks(range(n_q), ql)
    ax.tick_params(labelsize=layout.TICK_PT)
    ax.set_xlabel(_w("key"), fontsize=layout.LABEL_PT)
    ax.set_ylabel(_w("query"), fontsize=layout.LABEL_PT)
    panel = (n_k * cell, n_q * cell)
    fig.suptitle(_title(title or _w("title.mask"), panel[0] + 1.0), fontsize=layout.TITLE_PT)
    fig.set_size_inches(panel[0] + 1.5, panel[1] + 1.5)
    layout.fit(fig, [ax], panel)
    return fig


@_in_lang
def growth_plot(
    lengths: Sequence[int] = (256, 512, 1024, 2048, 4096, 8192),
    *,
    compare: tuple[int, int] = (1024, 4096),
    heads: int = 1,
    bytes_per_element: int = 4,
) -> Any:
    """The number of score-matrix elements T² against the sequence length T (log-log), with the article's point:
    1,024 -> 4,096 tokens is 4x the length and 16x the elements. A second axis shows the memory of one layer's
    ``heads`` score matrices at ``bytes_per_element``.
    """
    ts = np.asarray(sorted(set(int(t) for t in (*lengths, *compare))), dtype=np.float64)
    if ts.size == 0 or (ts < 1).any():
        raise OptionError(f"lengths: expected positive ints, got {list(lengths)}")
    fig = _new_figure((6, 3.6))
    ax = fig.add_subplot()
    ax.loglog(ts, ts**2, "o-", color="#3182bd", label=_w("growth.elements"))
    ax.loglog(ts, ts * (ts[0]), "--", color="#969696", label=_w("growth.linear"))
    a, b = compare
    ax.annotate(
        _w("growth.point", a=f"{a:,}", b=f"{b:,}", x=f"{b / a:g}", y=f"{(b / a) ** 2:g}"),
        xy=(b, b**2),
        xytext=(ts[0], b**2),
        arrowprops={"arrowstyle": "->"},
        fontsize=9,
    )
    from matplotlib.ticker import NullLocator

    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(ts, [f"{int(t):,}" for t in ts], rotation=30)
    ax.plot([a, b], [a**2, b**2], "o", color="#e6550d", markersize=8)
    ax.set_xlabel(_w("growth.x"))
    ax.set_ylabel(_w("growth.y"))
    mem = ax.secondary_yaxis(
        "right",
        functions=(lambda y: y * heads * bytes_per_element / 2**20, lambda m: m * 2**20 / (heads * bytes_per_element)),
    )
    mem.set_ylabel(_w("growth.mem", heads=heads, b=bytes_per_element))
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(_w("growth.title"), fontsize=10)
    return fig


def to_bytes(fig: Any, fmt: str = "png", *, dpi: int = 120) -> bytes:
    """The figure encoded as ``png``, ``svg`` (with real ``<text>`` elements) or ``pdf``."""
    fmt = fmt.lower().lstrip(".")
    if fmt not in FORMATS:
        raise OptionError(f"fmt: {fmt!r} is not one of {', '.join(FORMATS)}")
    from matplotlib import rc_context

    buf = io.BytesIO()
    with rc_context({"svg.fonttype": "none"}):  # SVG text stays text (selectable, searchable), not glyph paths
        fig.savefig(buf, format=fmt, dpi=dpi)
    return buf.getvalue()


def save(fig: Any, path: str | Path, *, dpi: int = 150) -> Path:
    """Write ``fig`` to ``path``; the extension (.png, .svg, .pdf) picks the format. Returns the path."""
    p = Path(path)
    fmt = p.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise OptionError(f"path: {str(path)!r} must end in .png, .svg or .pdf (got {p.suffix or 'no extension'!r})")
    if p.parent and not p.parent.exists():
        raise FileNotFoundError(f"path: folder {str(p.parent)!r} does not exist")
    p.write_bytes(to_bytes(fig, fmt, dpi=dpi))
    return p
