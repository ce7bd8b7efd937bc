"""Pictures of attention (extra ``plot``: matplotlib, imported only when a function here is called).

* :func:`heatmap`: weights ``[n_q, n_k]``, rows = queries, columns = keys, masked cells hatched grey (distinct from
  weights that are merely small), NaN cells red, row sums at the right, a colour bar;
* :func:`head_grid`: one heatmap per head ``[h, n_q, n_k]``;
* :func:`last_row_bar`: the last query's real weights as bars;
* :func:`mask_picture`: a boolean mask (■ may attend, ⬚ blocked);
* :func:`growth_plot`: the T² growth of the score matrix (1,024 -> 4,096 tokens = 16x elements);
* :func:`save` / :func:`to_bytes`: PNG, SVG or PDF.

Every function returns a :class:`matplotlib.figure.Figure` built without pyplot (no global state, no GUI backend),
so it works in scripts, servers and notebooks alike. How to read a heatmap (article 000): check the axes, the mask
and the row sums first; a large weight says where a query reads from, not what caused the answer.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._arrays import to_numpy
from ..errors import DTypeError, ShapeError, missing_extra
from ..explain.fmt import num

__all__ = ["FORMATS", "growth_plot", "head_grid", "heatmap", "last_row_bar", "mask_picture", "save", "to_bytes"]

#: File formats :func:`save` writes, by extension.
FORMATS = ("png", "svg", "pdf")

_MASKED = "#d9d9d9"
_NAN = "#e34a33"


def _figure_cls() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise missing_extra("matplotlib", "plot") from None
    return Figure


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


def _draw(
    ax: Any,
    w: np.ndarray,
    ok: np.ndarray,
    ql: list[str],
    kl: list[str],
    *,
    values: bool | None,
    row_sums: bool,
    cmap: str,
) -> Any:
    """One heatmap on ``ax``; returns the image (for a colour bar)."""
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle

    n_q, n_k = w.shape
    cm = colormaps[cmap].with_extremes(bad=_MASKED)
    bad = ~ok | ~np.isfinite(w)
    img = ax.imshow(
        np.ma.masked_array(w, mask=bad), cmap=cm, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest"
    )
    for i, j in zip(*np.nonzero(bad), strict=True):
        nan = ok[i, j]  # allowed but not finite: a NaN weight
        ax.add_patch(
            Rectangle(
                (j - 0.5, i - 0.5),
                1,
                1,
                facecolor=_NAN if nan else _MASKED,
                edgecolor="#8c8c8c",
                hatch="" if nan else "///",
                linewidth=0.0,
            )
        )
    show = values if values is not None else (n_q <= 12 and n_k <= 12)
    if show:
        for i in range(n_q):
            for j in range(n_k):
                if not ok[i, j]:
                    ax.text(j, i, "masked", ha="center", va="center", fontsize=7, color="#525252")
                elif not np.isfinite(w[i, j]):
                    ax.text(j, i, "nan", ha="center", va="center", fontsize=8, color="white")
                else:
                    ax.text(
                        j,
                        i,
                        num(w[i, j], 2),  # tiny weights keep a digit: 0.000045, not 0.00
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white" if w[i, j] > 0.6 else "black",
                    )
    ax.set_xticks(
        range(n_k), kl, rotation=45 if max(map(len, kl)) > 3 else 0, ha="right" if max(map(len, kl)) > 3 else "center"
    )
    ax.set_yticks(range(n_q), ql)
    ax.set_xlabel("key (column): read from")
    ax.set_ylabel("query (row): reader")
    ax.set_xlim(-0.5, n_k - 0.5)
    ax.set_ylim(n_q - 0.5, -0.5)
    if row_sums:
        sums = np.where(ok, w, 0.0).sum(axis=-1)
        ax2 = ax.secondary_yaxis("right")
        ax2.set_yticks(range(n_q), [f"Σ={s:.2f}" if np.isfinite(s) else "Σ=nan" for s in sums])
        ax2.tick_params(length=0, labelsize=8)
    return img


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

    Args:
        weights: ``[n_q, n_k]`` (leading axes of size 1 are dropped).
        allowed: bool ``[n_q, n_k]`` (broadcastable), True = may attend; blocked cells are drawn hatched grey and
            labelled "masked", so they never look like a weight that is merely small.
        query_labels, key_labels: tokens for the rows and columns.
        values: write each weight in its cell (default: when both sides are <= 12).
        row_sums: show each row's sum at the right (1 for every legal row of a correct softmax).

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
    ql = _labels(query_labels, n_q, "query_labels", "q")
    kl = _labels(key_labels, n_k, "key_labels", "k")
    Figure = _figure_cls()
    width = max(4.8, min(2.6 + 0.7 * n_k, 16))
    fig = Figure(figsize=figsize or (width, max(2.8, min(1.8 + 0.5 * n_q, 14))), layout="constrained")
    ax = fig.add_subplot()
    img = _draw(ax, w, ok, ql, kl, values=values, row_sums=row_sums, cmap=cmap)
    if colorbar:
        fig.colorbar(img, ax=ax, label="weight", pad=0.12 if row_sums else 0.05)
    text = title or "attention weights (grey hatched = masked)"
    ax.set_title(textwrap.fill(text, width=int(width * 9)), fontsize=10)
    return fig


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
) -> Any:
    """One heatmap per head, in a grid, sharing one colour scale.

    Shapes:
        weights ``[h, n_q, n_k]``; allowed broadcastable to it (e.g. ``[n_q, n_k]``).
    """
    w, ok = _weights(weights, allowed, ndim=3)
    h, n_q, n_k = w.shape
    ql = _labels(query_labels, n_q, "query_labels", "q")
    kl = _labels(key_labels, n_k, "key_labels", "k")
    names = _labels(head_names, h, "head_names", "head ")
    if isinstance(columns, bool) or not isinstance(columns, int) or columns < 1:
        raise ShapeError(f"columns: expected an int >= 1, got {columns!r}")
    cols = min(columns, h)
    rows = -(-h // cols)
    Figure = _figure_cls()
    fig = Figure(figsize=(cols * (1.4 + 0.35 * n_k) + 1, rows * (1.2 + 0.3 * n_q)), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    img = None
    for idx in range(rows * cols):
        ax = axes[idx // cols][idx % cols]
        if idx >= h:
            ax.set_axis_off()
            continue
        img = _draw(ax, w[idx], ok[idx], ql, kl, values=values, row_sums=False, cmap="Blues")
        ax.set_title(names[idx], fontsize=9)
        if idx % cols:
            ax.set_ylabel("")
        if idx // cols != rows - 1:
            ax.set_xlabel("")
    fig.colorbar(img, ax=axes, label="weight", shrink=0.8)
    fig.suptitle(title or f"{h} heads: rows = queries, columns = keys", fontsize=10)
    return fig


def last_row_bar(
    weights: Any,
    allowed: Any = None,
    *,
    key_labels: Sequence[str] | None = None,
    query_label: str | None = None,
    title: str | None = None,
) -> Any:
    """The last query's weights as a bar chart (the article's "last row's real weights"); masked keys hatched.

    Shapes:
        weights ``[n_q, n_k]`` (the last row is drawn) or ``[n_k]``.
    """
    w = np.asarray(to_numpy(weights) if not isinstance(weights, (list, tuple)) else weights, dtype=np.float64)
    if w.ndim == 1:
        w = w[None, :]
    w, ok = _weights(w, allowed)
    row, okr = w[-1], ok[-1]
    kl = _labels(key_labels, w.shape[1], "key_labels", "k")
    Figure = _figure_cls()
    fig = Figure(figsize=(min(2 + 0.6 * len(row), 14), 3), layout="constrained")
    ax = fig.add_subplot()
    heights = np.where(okr & np.isfinite(row), row, 0.0)
    bars = ax.bar(range(len(row)), heights, color="#3182bd")
    for j, b in enumerate(bars):
        if not okr[j]:
            ax.bar(j, 1.0, color="none", edgecolor="#8c8c8c", hatch="///", linewidth=0.5)
            ax.text(j, 0.5, "masked", ha="center", va="center", rotation=90, fontsize=8, color="#525252")
        else:
            ax.text(j, b.get_height() + 0.02, f"{row[j]:.3f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(row)), kl)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("weight")
    q = query_label or f"q{w.shape[0] - 1}"
    ax.set_title(title or f"last query {q}: where it reads from (sum = {np.nansum(heights):.3f})", fontsize=10)
    return fig


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
    ql = _labels(query_labels, n_q, "query_labels", "q")
    kl = _labels(key_labels, n_k, "key_labels", "k")
    Figure = _figure_cls()
    fig = Figure(figsize=(min(1.8 + 0.5 * n_k, 14), min(1.4 + 0.45 * n_q, 12)), layout="constrained")
    ax = fig.add_subplot()
    ax.imshow(m.astype(float), cmap="Greys", vmin=-0.25, vmax=1.25, aspect="equal", interpolation="nearest")
    if n_q * n_k <= 400:
        for i in range(n_q):
            for j in range(n_k):
                ax.text(
                    j, i, "■" if m[i, j] else "⬚", ha="center", va="center", color="white" if m[i, j] else "#737373"
                )
    ax.set_xticks(range(n_k), kl)
    ax.set_yticks(range(n_q), ql)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.set_title(title or "mask: ■ may attend, ⬚ blocked", fontsize=10)
    return fig


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
        raise ShapeError(f"lengths: expected positive ints, got {list(lengths)}")
    Figure = _figure_cls()
    fig = Figure(figsize=(6, 3.6), layout="constrained")
    ax = fig.add_subplot()
    ax.loglog(ts, ts**2, "o-", color="#3182bd", label="T² score elements")
    ax.loglog(ts, ts * (ts[0]), "--", color="#969696", label="linear, for comparison")
    a, b = compare
    ax.annotate(
        f"{a:,} → {b:,}: {b / a:g}× length, {(b / a) ** 2:g}× elements",
        xy=(b, b**2),
        xytext=(ts[0], b**2),
        arrowprops={"arrowstyle": "->"},
        fontsize=9,
    )
    from matplotlib.ticker import NullLocator

    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(ts, [f"{int(t):,}" for t in ts], rotation=30)
    ax.plot([a, b], [a**2, b**2], "o", color="#e6550d", markersize=8)
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("elements of the T×T score matrix")
    mem = ax.secondary_yaxis(
        "right",
        functions=(lambda y: y * heads * bytes_per_element / 2**20, lambda m: m * 2**20 / (heads * bytes_per_element)),
    )
    mem.set_ylabel(f"MiB ({heads} head(s), {bytes_per_element} B each)")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("dense attention stores T² scores per head", fontsize=10)
    return fig


def to_bytes(fig: Any, fmt: str = "png", *, dpi: int = 120) -> bytes:
    """The figure encoded as ``png``, ``svg`` (with real ``<text>`` elements) or ``pdf``."""
    fmt = fmt.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ValueError(f"fmt: {fmt!r} is not one of {', '.join(FORMATS)}")
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
        raise ValueError(f"path: {str(path)!r} must end in .png, .svg or .pdf (got {p.suffix or 'no extension'!r})")
    if p.parent and not p.parent.exists():
        raise FileNotFoundError(f"path: folder {str(p.parent)!r} does not exist")
    p.write_bytes(to_bytes(fig, fmt, dpi=dpi))
    return p
