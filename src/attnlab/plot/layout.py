"""Sizes, fonts, contrast and the fitting of a figure around its cells (used by :mod:`attnlab.plot`).

The rule: text keeps its size and the figure grows. Every text is at least :data:`MIN_FONT_PT` points; a cell is as
wide and as tall as the widest text written in it plus a margin; the figure is then sized (by a few passes of
matplotlib's constrained layout) so that each heatmap panel gets exactly ``n_k`` cells across and ``n_q`` cells down,
and so that nothing (title, legend, tick labels, row sums, colour bar) falls outside it. Text colours are chosen by
the WCAG 2 contrast ratio against the colour they sit on (at least :data:`MIN_CONTRAST`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "MIN_CONTRAST",
    "MIN_FONT_PT",
    "agg_figure",
    "contrast_ratio",
    "fit",
    "ink",
    "relative_luminance",
    "text_size",
    "widest",
]

#: The smallest font used anywhere in attnlab's figures, in points. At the PNG resolutions attnlab writes (the
#: command's default 150 dpi, :func:`attnlab.plot.to_bytes`'s 120, the lab's 90) that is 14.6, 11.7 and 8.8 pixels.
MIN_FONT_PT = 7.0
#: Font sizes in points: titles, axis labels, tick labels / row sums / legend, cell values (small and large n).
TITLE_PT, LABEL_PT, TICK_PT, VALUE_PT, VALUE_PT_DENSE = 10.0, 9.0, 8.0, 8.0, 7.0
#: WCAG 2 AA contrast for normal text.
MIN_CONTRAST = 4.5


def relative_luminance(rgb: Sequence[float]) -> float:
    """WCAG 2 relative luminance of an sRGB colour with channels in [0, 1].

    >>> round(relative_luminance((1, 1, 1)), 6), relative_luminance((0, 0, 0))
    (1.0, 0.0)
    """
    c = np.asarray(rgb[:3], dtype=np.float64)
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    return float(0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2])


def contrast_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """WCAG 2 contrast ratio of two colours, from 1 (same) to 21 (black on white).

    >>> round(contrast_ratio((0, 0, 0), (1, 1, 1)), 6)
    21.0
    """
    la, lb = relative_luminance(a), relative_luminance(b)
    return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)


def ink(background: Sequence[float]) -> str:
    """Black or white, whichever contrasts more with ``background`` (the better of the two is always >= 4.58:1)."""
    return "black" if contrast_ratio(background, (0, 0, 0)) >= contrast_ratio(background, (1, 1, 1)) else "white"


def text_size(renderer: Any, s: str, size_pt: float) -> tuple[float, float]:
    """Width and height in inches of ``s`` set in matplotlib's default font at ``size_pt``."""
    from matplotlib.font_manager import FontProperties

    w, h, _ = renderer.get_text_width_height_descent(s, FontProperties(size=size_pt), ismath=False)
    return w / renderer.dpi, h / renderer.dpi


def widest(renderer: Any, strings: Iterable[str], size_pt: float) -> tuple[float, float]:
    """The largest width and the largest height of ``strings`` at ``size_pt`` (inches; 0 for none)."""
    sizes = [text_size(renderer, s, size_pt) for s in set(strings)]
    return max((w for w, _ in sizes), default=0.0), max((h for _, h in sizes), default=0.0)


def agg_figure(size: tuple[float, float], *, dpi: float = 100) -> Any:
    """A matplotlib ``Figure`` with constrained layout on an Agg canvas (so ``fig.canvas.get_renderer()`` works),
    without pyplot."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def fit(
    fig: Any,
    panels: Sequence[Any],
    panel_size: tuple[float, float],
    grid: tuple[int, int] = (1, 1),
    *,
    passes: int = 8,
) -> None:
    """Resize ``fig`` until every axes in ``panels`` is at least ``panel_size`` (inches) and nothing sticks out.

    Constrained layout keeps the figure size and shares the rest among the axes; here the figure grows instead, by
    the missing width (height) of a panel times the ``grid``'s columns (rows), and by whatever overflows the figure
    (a long title or legend), until the sizes no longer change.
    """
    rows, cols = grid
    want_w, want_h = panel_size
    floor_w = floor_h = 0.0
    for _ in range(passes):
        fig.draw_without_rendering()
        W, H = (float(x) for x in fig.get_size_inches())
        renderer = fig.canvas.get_renderer()
        have_w = min(ax.get_position().width for ax in panels) * W
        have_h = min(ax.get_position().height for ax in panels) * H
        tight = fig.get_tightbbox(renderer)  # inches
        over_w = max(0.0, -tight.x0) + max(0.0, tight.x1 - W)
        over_h = max(0.0, -tight.y0) + max(0.0, tight.y1 - H)
        if over_w > 0:
            floor_w = max(floor_w, W + over_w + 0.05)
        if over_h > 0:
            floor_h = max(floor_h, H + over_h + 0.05)
        new_w = max(W + cols * (want_w - have_w), floor_w, 1.0)
        new_h = max(H + rows * (want_h - have_h), floor_h, 1.0)
        fig.set_size_inches(new_w, new_h)
        # The margins are text sizes (inches, fixed), so the first correction is nearly exact: a change this small
        # needs no further pass (cells hold their text with 0.1 inch to spare).
        if abs(new_w - W) < 0.05 and abs(new_h - H) < 0.05 and over_w == 0 and over_h == 0:
            return
