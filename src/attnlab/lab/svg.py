"""The lab's pictures as SVG strings, drawn directly (fast enough to redraw on every slider move).

Every size from 1×1 to 32×32 fits: the canvas is as wide as its longest text (estimated generously by
:func:`text_width`), cells shrink with the number of positions, column labels turn vertical and in-cell numbers
are left out when the cells get too small to hold them. Every text carries ``data-bg``, the colour drawn behind
it, so a test can check its contrast (:func:`contrast`, at least 4.5:1 everywhere).

Three kinds of cell never look alike: a weight (blue ramp, its value written), a masked entry (hatched grey,
"never attended") and NaN (dark red, "NaN": a row with no legal key under the ``nan`` policy).

>>> round(contrast("#000000", "#ffffff"), 1), round(contrast("#ffffff", "rgb(8,48,107)"), 1)
(21.0, 12.8)
"""

from __future__ import annotations

import html
import math
import unicodedata

import numpy as np

from ..explain.fmt import NAN_COLOUR, num, row_sum

__all__ = [
    "HATCH_DEFS",
    "MASKED_INK",
    "NAN_FILL",
    "blue",
    "contrast",
    "grid_svg",
    "growth_svg",
    "heatmap_svg",
    "ink_for",
    "label_svg",
    "last_row_svg",
    "png_bytes",
    "text_width",
    "tile_rgb",
]

#: Dark red for NaN cells (white text on it is 8.6:1).
NAN_FILL = NAN_COLOUR
#: Text on the hatched masked cells and stubs.
MASKED_INK = "#333333"
_HATCH_BG = "#e0e0e0"

#: The SVG ``<pattern>`` that hatches masked cells (put inside ``<defs>``).
HATCH_DEFS = (
    '<pattern id="al-hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
    f'<rect width="6" height="6" fill="{_HATCH_BG}"/>'
    '<line x1="0" y1="0" x2="0" y2="6" stroke="#9e9e9e" stroke-width="2"/></pattern>'
)


def text_width(text: str, size: float, *, bold: bool = False) -> float:
    """A generous estimate of the width of ``text`` in a sans-serif font of ``size`` px (wide for CJK)."""
    w = 0.0
    for ch in text:
        if unicodedata.east_asian_width(ch) in ("W", "F"):
            w += 1.05 * size
        elif ch in "mwMW@%":
            w += 0.95 * size
        elif ch in "il.,:;'|!":
            w += 0.32 * size
        else:
            w += 0.64 * size
    return w * (1.08 if bold else 1.0)


def _rgb(colour: str) -> tuple[float, float, float]:
    c = colour.strip()
    if c.startswith("#"):
        c = c[1:]
        if len(c) == 3:
            c = "".join(x * 2 for x in c)
        return (int(c[0:2], 16) / 255, int(c[2:4], 16) / 255, int(c[4:6], 16) / 255)
    if c.startswith("rgb"):
        parts = c[c.index("(") + 1 : c.index(")")].split(",")
        return tuple(float(p) / 255 for p in parts[:3])  # type: ignore[return-value]  # rgb(r, g, b): three
    named = {"white": (1.0, 1.0, 1.0), "black": (0.0, 0.0, 0.0)}
    return named[c]


def _luminance(colour: str) -> float:
    def lin(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (lin(x) for x in _rgb(colour))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(fg: str, bg: str) -> float:
    """The WCAG contrast ratio of two colours (``#rrggbb``, ``#rgb``, ``rgb(r,g,b)``, white, black)."""
    a, b = _luminance(fg), _luminance(bg)
    return (max(a, b) + 0.05) / (min(a, b) + 0.05)


def ink_for(bg: str) -> str:
    """Black or white, whichever contrasts more with ``bg`` (always at least 4.58:1)."""
    return "#000000" if contrast("#000000", bg) >= contrast("#ffffff", bg) else "#ffffff"


def blue(x: float) -> str:
    """A white-to-blue colour for a weight in [0, 1] (the same ramp as the colour bar)."""
    x = min(max(float(x), 0.0), 1.0)
    r, g, b = (round(255 + (c - 255) * x) for c in (8, 48, 107))
    return f"rgb({r},{g},{b})"


def _text(
    x: float,
    y: float,
    s: str,
    *,
    size: float = 11,
    anchor: str = "start",
    fill: str = "#000000",
    bg: str = "#ffffff",
    bold: bool = False,
    vertical: bool = False,
    testid: str = "",
) -> str:
    extra = ' font-weight="bold"' if bold else ""
    if vertical:
        extra += f' transform="rotate(-90 {x:.1f} {y:.1f})"'
    if testid:
        extra += f' data-testid="{testid}"'
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{fill}" data-bg="{bg}"'
        f"{extra}>{html.escape(s)}</text>"
    )


def label_svg(x: float, y: float, s: str, **style: object) -> str:
    """One ``<text>`` element as every picture of the lab draws it (escaped, ``data-bg`` for the contrast test);
    ``style``: ``size``, ``anchor``, ``fill``, ``bg``, ``bold``, ``vertical``, ``testid``."""
    return _text(x, y, s, **style)  # type: ignore[arg-type]  # the keywords of _text


def _cell_size(n: int, budget: float = 420.0, largest: int = 46, smallest: int = 16) -> int:
    return int(max(smallest, min(largest, budget / max(n, 1))))


def heatmap_svg(
    weights: np.ndarray,
    allowed: np.ndarray,
    rows: tuple[str, ...],
    cols: tuple[str, ...],
    *,
    title: str = "weights A: rows = queries, columns = keys",
    legend: tuple[str, str, str] = (
        "key (column): read from",
        "masked (never attended), unlike a small weight",
        "NaN: no legal key, policy 'nan'",
    ),
    testid: str = "al-heatmap",
    budget: float = 420.0,
) -> str:
    """A heatmap of ``weights [n_q, n_k]``: blue weights, hatched masked cells, dark red NaN; row sums at the right
    (Σ = nan on a NaN row); a colour bar from 0 to 1; a legend (the NaN entry only when there is a NaN)."""
    w = np.asarray(weights, dtype=np.float64)
    ok = np.broadcast_to(np.asarray(allowed, dtype=bool), w.shape)
    n_q, n_k = w.shape
    cell = _cell_size(max(n_q, n_k), budget)
    font = 11 if cell >= 24 else 9
    # the numbers as the tables write them (attnlab.explain.fmt.num), each in the largest font up to 11 px that fits
    # its cell (0.7071: 11 px, 0.000045: 8.3 px, the longest, 0.99999999: 6.6 px in a 46-pixel cell); in every
    # cell or in none: none when the longest would need less than 6 px (cells under about 42 px)
    numbers = {x: num(x) for x in w[ok & ~np.isnan(w)].tolist()}
    fonts = {x: min(11.0, 11.0 * (cell - 6) / text_width(s, 11)) for x, s in numbers.items()}
    show_numbers = min(fonts.values(), default=11.0) >= 6.0
    rl = [r[:10] for r in rows]
    cl = [c[:8] for c in cols]
    vertical = any(text_width(c, font) > cell - 4 for c in cl)
    left = 8 + max(text_width(r, font) for r in rl) + 8
    title_h = 24
    head = (max(text_width(c, font) for c in cl) + 10) if vertical else 18
    top = title_h + head
    grid_w, grid_h = n_k * cell, n_q * cell
    sums_x = left + grid_w + 8
    sum_labels = []
    for i in range(n_q):
        row = w[i]
        s = float("nan") if np.isnan(row).any() else float(np.where(ok[i], row, 0.0).sum())
        sum_labels.append(row_sum(s))
    bar_x = sums_x + max(text_width(s, font) for s in sum_labels) + 12
    has_nan = bool(np.isnan(w).any())
    legend_items = [legend[1]] + ([legend[2]] if has_nan else [])
    legend_y = top + max(grid_h, 40) + 22
    height = legend_y + 8 + 20 * len(legend_items) + 6
    width = max(
        bar_x + 34,
        8 + text_width(title, 12, bold=True) + 8,
        left + text_width(legend[0], 11) + 8,
        *(left + 20 + text_width(t, 11) + 8 for t in legend_items),
    )
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" data-testid="{testid}" role="img" '
        f'aria-label="{html.escape(title)}" style="max-width:none;overflow:visible">',
        "<defs>" + HATCH_DEFS + '<linearGradient id="al-ramp" x1="0" y1="1" x2="0" y2="0">'
        f'<stop offset="0" stop-color="{blue(0)}"/><stop offset="1" stop-color="{blue(1)}"/></linearGradient></defs>',
        _text(8, 16, title, size=12, bold=True),
    ]
    for j, c in enumerate(cl):
        x = left + j * cell + cell / 2
        if vertical:
            out.append(_text(x + font / 3, top - 6, c, size=font, vertical=True))
        else:
            out.append(_text(x, top - 6, c, size=font, anchor="middle"))
    for i, r in enumerate(rl):
        y = top + i * cell
        out.append(_text(left - 8, y + cell / 2 + font / 3, r, size=font, anchor="end"))
        for j in range(n_k):
            x = left + j * cell
            v = w[i, j]
            if math.isnan(v):
                out.append(f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{NAN_FILL}" stroke="#fff"/>')
                if cell >= 24:
                    out.append(
                        _text(
                            x + cell / 2,
                            y + cell / 2 + 4,
                            "NaN",
                            size=font,
                            anchor="middle",
                            fill="#ffffff",
                            bg=NAN_FILL,
                        )
                    )
                continue
            if not ok[i, j]:
                out.append(
                    f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="url(#al-hatch)" stroke="#fff" '
                    'data-kind="masked"/>'
                )
                continue
            fill = blue(v)
            out.append(f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{fill}" stroke="#fff"/>')
            if show_numbers:
                out.append(
                    _text(
                        x + cell / 2,
                        y + cell / 2 + 4,
                        numbers[v],
                        size=round(fonts[v], 1),
                        anchor="middle",
                        fill=ink_for(fill),
                        bg=fill,
                    )
                )
        out.append(_text(sums_x, y + cell / 2 + font / 3, sum_labels[i], size=font))
    bh = max(grid_h, 40)
    out.append(f'<rect x="{bar_x}" y="{top}" width="14" height="{bh}" fill="url(#al-ramp)" stroke="#999"/>')
    out.append(_text(bar_x + 18, top + 10, "1", size=10))
    out.append(_text(bar_x + 18, top + bh, "0", size=10))
    out.append(_text(left, legend_y, legend[0], size=11))
    for n, t in enumerate(legend_items):
        y = legend_y + 8 + 20 * n
        fill = "url(#al-hatch)" if n == 0 else NAN_FILL
        out.append(f'<rect x="{left}" y="{y}" width="14" height="14" fill="{fill}"/>')
        out.append(_text(left + 20, y + 11, t, size=11))
    out.append("</svg>")
    return "".join(out)


def last_row_svg(
    weights: np.ndarray,
    allowed: np.ndarray,
    cols: tuple[str, ...],
    row_label: str,
    *,
    title: str | None = None,
    masked_word: str = "masked",
    testid: str = "al-last-row",
) -> str:
    """The last query's real weights as bars; a masked key is a short hatched stub marked "masked" (never a bar),
    a NaN weight a dark red stub marked "NaN"."""
    w = np.asarray(weights, dtype=np.float64)[-1]
    ok = np.broadcast_to(np.asarray(allowed, dtype=bool), np.shape(weights))[-1]
    n = len(w)
    bw = int(max(12, min(40, 480 / max(n, 1) - 8)))
    gap = 8 if bw >= 20 else 4
    h, stub = 150, 10
    font = 11 if bw >= 20 else 9
    title = f"last query {row_label}: its real weights" if title is None else title
    labels = [
        num(v) if ok[j] and not math.isnan(v) else ("NaN" if math.isnan(v) else masked_word) for j, v in enumerate(w)
    ]
    vertical_values = any(text_width(s, font) > bw + gap - 2 for s in labels)
    above = (max(text_width(s, font) for s in labels) + 8) if vertical_values else 16
    cl = [c[:8] for c in cols]
    vertical_cols = any(text_width(c, font) > bw + gap - 2 for c in cl)
    below = (max(text_width(c, font) for c in cl) + 10) if vertical_cols else 20
    top = 24 + above
    left = 12
    width = max(left + n * (bw + gap) + 12, 8 + text_width(title, 12, bold=True) + 8)
    height = top + h + below + 6
    base = top + h
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" data-testid="{testid}" role="img" '
        f'aria-label="{html.escape(title)}" style="max-width:none;overflow:visible">',
        "<defs>" + HATCH_DEFS + "</defs>",
        _text(8, 16, title, size=12, bold=True),
        f'<line x1="{left}" y1="{base}" x2="{left + n * (bw + gap)}" y2="{base}" stroke="#555"/>',
    ]
    for j, v in enumerate(w):
        x = left + j * (bw + gap)
        if math.isnan(v):
            out.append(
                f'<rect x="{x}" y="{base - stub}" width="{bw}" height="{stub}" fill="{NAN_FILL}" data-kind="nan"/>'
            )
            bar_top = base - stub
        elif not ok[j]:
            out.append(
                f'<rect x="{x}" y="{base - stub}" width="{bw}" height="{stub}" fill="url(#al-hatch)" '
                'stroke="#9e9e9e" data-kind="masked"/>'
            )
            bar_top = base - stub
        else:
            bh = h * min(max(v, 0.0), 1.0)
            out.append(f'<rect x="{x}" y="{base - bh}" width="{bw}" height="{bh}" fill="#3182bd" data-kind="bar"/>')
            bar_top = base - bh
        ink = MASKED_INK if labels[j] == masked_word else ("#a50f15" if labels[j] == "NaN" else "#000000")
        if vertical_values:
            out.append(_text(x + bw / 2 + font / 3, bar_top - 4, labels[j], size=font, fill=ink, vertical=True))
        else:
            out.append(_text(x + bw / 2, bar_top - 4, labels[j], size=font, anchor="middle", fill=ink))
        if vertical_cols:
            out.append(_text(x + bw / 2 + font / 3, base + 6, cl[j], size=font, anchor="end", vertical=True))
        else:
            out.append(_text(x + bw / 2, base + 14, cl[j], size=font, anchor="middle"))
    out.append("</svg>")
    return "".join(out)


def png_bytes(rgb: np.ndarray) -> bytes:
    """PNG bytes of an ``[H, W, 3]`` uint8 image (zlib only, no imaging library)."""
    import struct
    import zlib

    a = np.ascontiguousarray(rgb, dtype=np.uint8)
    hgt, wid = a.shape[:2]
    raw = b"".join(b"\x00" + a[y].tobytes() for y in range(hgt))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", wid, hgt, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


_MASKED_RGB = np.array([189, 189, 189], dtype=np.float64)


def tile_rgb(maps: np.ndarray, allowed: np.ndarray, *, size: int = 40) -> np.ndarray:
    """Each map of ``maps [L, h, n_q, n_k]`` as a tiny picture ``[L, h, c·n_q, c·n_k, 3]`` (0-255 floats, blue
    ramp, masked cells grey, NaN as 0), each cell ``c = max(1, size // n)`` pixels wide."""
    m = np.nan_to_num(np.asarray(maps, dtype=np.float64), nan=0.0)
    n_q, n_k = m.shape[-2:]
    c = max(1, size // max(n_q, n_k))
    ok = np.broadcast_to(np.asarray(allowed, dtype=bool), (n_q, n_k))
    x = np.clip(m, 0.0, 1.0)[..., None]  # [L, h, n_q, n_k, 1]
    dark = np.array([8, 48, 107], dtype=np.float64)
    rgb = 255 + (dark - 255) * x  # [L, h, n_q, n_k, 3]
    rgb = np.where(ok[None, None, :, :, None], rgb, _MASKED_RGB)
    return np.repeat(np.repeat(rgb, c, axis=2), c, axis=3)  # [L, h, c n_q, c n_k, 3]


def grid_svg(
    maps: np.ndarray,
    allowed: np.ndarray,
    *,
    row_names: tuple[str, ...],
    col_names: tuple[str, ...],
    title: str,
    selected: tuple[int, int] | None = None,
    testid: str = "al-model-view",
) -> str:
    """Small multiples ``maps [L, h, n, n]``: one tiny heatmap per layer (rows) and head (columns), bertviz's
    model view, drawn as one PNG inside an SVG with the labels; masked cells grey (white is a weight of 0);
    the ``selected`` (layer, head) outlined in orange."""
    import base64

    tiles = tile_rgb(maps, allowed)  # [L, h, size_q, size_k, 3]
    L, h, size_q, size_k = tiles.shape[:4]
    pad = 4
    img = np.full((L * (size_q + pad), h * (size_k + pad), 3), 255.0)
    for li in range(L):
        for hj in range(h):
            y0, x0 = li * (size_q + pad), hj * (size_k + pad)
            img[y0 : y0 + size_q, x0 : x0 + size_k] = tiles[li, hj]
    data = base64.b64encode(png_bytes(np.round(img).astype(np.uint8))).decode()
    left = 8 + max(text_width(r, 10) for r in row_names) + 6
    top = 24 + 16
    iw, ih = img.shape[1], img.shape[0]
    width = max(left + iw + 8, 8 + text_width(title, 12, bold=True) + 8)
    height = top + ih + 8
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" data-testid="{testid}" role="img" '
        f'aria-label="{html.escape(title)}" style="max-width:none;overflow:visible" data-layers="{L}" '
        f'data-heads="{h}">',
        _text(8, 16, title, size=12, bold=True),
        f'<image x="{left}" y="{top}" width="{iw}" height="{ih}" style="image-rendering:pixelated" '
        f'href="data:image/png;base64,{data}"/>',
    ]
    for j in range(h):
        out.append(_text(left + j * (size_k + pad) + size_k / 2, top - 6, col_names[j], size=10, anchor="middle"))
    for li in range(L):
        y0 = top + li * (size_q + pad)
        out.append(_text(left - 6, y0 + size_q / 2 + 3, row_names[li], size=10, anchor="end"))
    if selected is not None:
        li, hj = selected
        out.append(
            f'<rect x="{left + hj * (size_k + pad) - 1.5}" y="{top + li * (size_q + pad) - 1.5}" '
            f'width="{size_k + 3}" height="{size_q + 3}" fill="none" stroke="#d94801" stroke-width="2"/>'
        )
    out.append("</svg>")
    return "".join(out)


def growth_svg(
    lengths: tuple[int, ...] = (1024, 2048, 4096),
    *,
    title: str = "T² score elements against the length T",
    caption: str = "{a:,} -> {b:,} tokens: {x:g}x the length, {y:g}x the elements",
    testid: str = "al-growth",
) -> str:
    """Bars of T² for each length T (the article's point: 1,024 -> 4,096 tokens is 4x the length, 16x the
    elements), with the exact counts written on them."""
    ts = [int(x) for x in lengths]
    top_v = max(ts) ** 2
    bw, gap, h = 90, 30, 160
    labels = [f"{x * x:,}" for x in ts]
    a, b = ts[0], ts[-1]
    cap = caption.format(a=a, b=b, x=b / a, y=(b / a) ** 2)
    width = max(20 + len(ts) * (bw + gap), 8 + text_width(title, 12, bold=True) + 8, 8 + text_width(cap, 11) + 8)
    top = 24 + 20
    height = top + h + 44
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" data-testid="{testid}" role="img" '
        f'aria-label="{html.escape(title)}" style="max-width:none;overflow:visible">',
        _text(8, 16, title, size=12, bold=True),
    ]
    for i, (x, lab) in enumerate(zip(ts, labels, strict=True)):
        bh = max(2.0, h * x * x / top_v)
        x0 = 20 + i * (bw + gap)
        out.append(f'<rect x="{x0}" y="{top + h - bh:.1f}" width="{bw}" height="{bh:.1f}" fill="#3182bd"/>')
        out.append(_text(x0 + bw / 2, top + h - bh - 5, lab, size=11, anchor="middle"))
        out.append(_text(x0 + bw / 2, top + h + 16, f"T = {x:,}", size=11, anchor="middle"))
    out.append(_text(8, top + h + 36, cap, size=11))
    out.append("</svg>")
    return "".join(out)
