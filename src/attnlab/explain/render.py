"""Renderers for an :class:`~attnlab.explain.Explanation`: plain text, markdown, JSON-ready dicts and rich tables.

All of them show the same steps; ``to_text`` is what a pipe gets, ``print_rich`` what a terminal gets.

>>> from attnlab.explain import explain_example
>>> print(to_text(explain_example("one-query")).splitlines()[0])
One query [1, 0] against keys [1, 0] and [0, 1]  [article 000, 'compute one row by hand']
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import missing_extra
from .fmt import NAN_COLOUR, num
from .i18n import tr
from .mistakes import Mistake
from .steps import Explanation, Step

__all__ = ["print_rich", "to_dict", "to_markdown", "to_text"]


def _options(e: Explanation) -> str:
    s = e.setup
    if s is None:
        return ""
    lang = e.lang
    parts = []
    if s.causal is True:
        parts.append(tr("opt.causal", lang))
    elif s.causal:
        parts.append(tr("opt.causal_align", lang, align=s.causal))
    if s.padding is not None:
        parts.append(tr("opt.padding", lang, n=s.padding, side=tr(f"side.{s.padding_side}", lang)))
    if s.mask is not None:
        parts.append(tr("opt.mask", lang))
    if s.bias is not None:
        parts.append(tr("opt.bias", lang))
    if s.scale is not None:
        parts.append(tr("opt.scale", lang, x=num(s.scale)))
    if s.shift:
        parts.append(tr("opt.shift", lang, x=num(s.shift)))
    if s.temperature != 1.0:
        parts.append(tr("opt.temperature", lang, x=num(s.temperature)))
    if s.masked_rows != "raise":
        parts.append(tr("opt.masked_rows", lang, x=s.masked_rows))
    return ("，" if lang == "zh" else ", ").join(parts)


def _grid(matrix: np.ndarray, rows: Sequence[str], cols: Sequence[str], corner: str = "") -> list[str]:
    """A right-aligned table of ``matrix [r, c]`` with row and column labels."""
    cells = [[num(x) for x in row] for row in np.asarray(matrix, dtype=np.float64)]
    widths = [max(len(str(c)), *(len(r[j]) for r in cells)) for j, c in enumerate(cols)]
    lw = max(len(corner), *(len(r) for r in rows))
    head = corner.ljust(lw) + "".join("  " + str(c).rjust(w) for c, w in zip(cols, widths, strict=True))
    out = [head.rstrip()]
    for label, r in zip(rows, cells, strict=True):
        out.append(label.ljust(lw) + "".join("  " + x.rjust(w) for x, w in zip(r, widths, strict=True)))
    return out


def _wrap(text: str, width: int, indent: str) -> list[str]:
    return textwrap.wrap(
        text,
        width=max(20, width - len(indent)),
        initial_indent=indent,
        subsequent_indent=indent,
        break_on_hyphens=False,  # commands and names (sqrt-d-model, 2x2-causal) stay whole
    )


def _step_text(n: int, s: Step, width: int, lang: str = "en") -> list[str]:
    out = [f"{n}. {s.title}{_colon(lang)} {s.formula}"]
    if s.matrix is not None:
        out += ["   " + ln for ln in _grid(s.matrix, s.rows, s.cols)]
    for name, m, r, c in s.extra:
        out += ["   " + ln for ln in _grid(m, r, c, name)]
    out += ["   " + ln for ln in s.lines]
    if s.note:
        out += _wrap(s.note, width, "   ")
    return out


def _colon(lang: str) -> str:
    return "：" if lang == "zh" else ":"


def _mistake_text(m: Mistake, rows: Sequence[str], cols: Sequence[str], width: int) -> list[str]:
    lang, c = m.lang, _colon(m.lang)
    out = [tr("render.mistake", lang, name=m.name, title=m.title)]
    out.append("   " + tr("render.right_weights", lang) + c)
    out += ["     " + ln for ln in _grid(m.right_weights, rows, cols)]
    out.append("   " + tr("render.wrong_weights", lang, name=m.name) + c)
    out += ["     " + ln for ln in _grid(m.wrong_weights, rows, cols)]
    out.append(
        "   "
        + tr(
            "render.row_sums",
            lang,
            right=", ".join(num(x) for x in m.right_weights.sum(-1)),
            wrong=", ".join(num(x) for x in m.wrong_row_sums),
        )
    )
    dv = tuple(f"d{c}" for c in range(m.right_output.shape[1]))
    out.append("   " + tr("render.right_output", lang) + c)
    out += ["     " + ln for ln in _grid(m.right_output, rows, dv)]
    out.append("   " + tr("render.wrong_output", lang) + c)
    out += ["     " + ln for ln in _grid(m.wrong_output, rows, dv)]
    out += _wrap(tr("render.why", lang, text=m.explanation), width, "   ")
    return out


def _labels(e: Explanation) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if e.setup is not None:
        return e.setup.qlabels, e.setup.klabels
    w = e.weights
    if w is None:
        return (), ()
    return tuple(f"q{i}" for i in range(w.shape[0])), tuple(f"k{j}" for j in range(w.shape[1]))


def to_text(e: Explanation, mistakes: Sequence[Mistake] = (), *, width: int = 100) -> str:
    """Plain text (no colour), lines wrapped at ``width``; the same on every terminal and in every pipe."""
    head = e.title + (f"  [{e.source}]" if e.source else "")
    out = [head]
    opts = _options(e)
    if opts:
        out.append(tr("render.options", e.lang, opts=opts))
    for i, s in enumerate(e.steps, 1):
        out.append("")
        out += _step_text(i, s, width, e.lang)
    for n in e.notes:
        out.append("")
        out += _wrap(tr("render.note", e.lang, text=n), width, "")
    rows, cols = _labels(e)
    for m in mistakes:
        out.append("")
        out += _mistake_text(m, rows, cols, width)
    return "\n".join(out) + "\n"


def _md_table(matrix: np.ndarray, rows: Sequence[str], cols: Sequence[str], corner: str = "") -> list[str]:
    def esc(x: str) -> str:
        return str(x).replace("|", "\\|")

    out = ["| " + esc(corner) + " | " + " | ".join(esc(c) for c in cols) + " |"]
    out.append("|---|" + "---:|" * len(cols))
    for label, r in zip(rows, np.asarray(matrix, dtype=np.float64), strict=True):
        out.append("| " + esc(label) + " | " + " | ".join(num(x) for x in r) + " |")
    return out


def to_markdown(e: Explanation, mistakes: Sequence[Mistake] = ()) -> str:
    """Markdown: a heading per step, pipe tables, arithmetic in code blocks (pastes into notes and issues)."""
    out = [f"# {e.title}"]
    if e.source:
        out.append(f"\n*{tr('render.source', e.lang, source=e.source)}*")
    opts = _options(e)
    if opts:
        out.append("\n" + tr("render.options", e.lang, opts=f"`{opts}`"))
    for i, s in enumerate(e.steps, 1):
        out += ["", f"## {i}. {s.title}", "", f"`{s.formula}`"]
        if s.matrix is not None:
            out += ["", *_md_table(s.matrix, s.rows, s.cols)]
        for name, matrix, r, cols_x in s.extra:
            out += ["", *_md_table(matrix, r, cols_x, name)]
        if s.lines:
            out += ["", "```", *s.lines, "```"]
        if s.note:
            out += ["", s.note]
    for n in e.notes:
        out += ["", f"> {n}"]
    rows, cols = _labels(e)
    for m in mistakes:
        dv = tuple(f"d{c}" for c in range(m.right_output.shape[1]))
        lg, c = m.lang, _colon(m.lang)
        out += [
            "",
            "## " + tr("render.mistake", lg, name=f"`{m.name}`", title=m.title),
            "",
            tr("render.right_weights", lg) + c,
            "",
            *_md_table(m.right_weights, rows, cols),
        ]
        out += ["", tr("render.wrong_weights", lg, name=m.name) + c, "", *_md_table(m.wrong_weights, rows, cols)]
        out += ["", tr("render.wrong_row_sums", lg, sums=", ".join(num(x) for x in m.wrong_row_sums))]
        out += ["", tr("render.right_output", lg) + c, "", *_md_table(m.right_output, rows, dv)]
        out += ["", tr("render.wrong_output", lg) + c, "", *_md_table(m.wrong_output, rows, dv)]
        out += ["", "**" + tr("render.why", lg, text="").strip() + "** " + m.explanation]
    return "\n".join(out) + "\n"


def _json_matrix(m: np.ndarray) -> list[list[Any]]:
    """Finite numbers as floats; -inf, inf and NaN (which JSON lacks) as the strings "-inf", "inf", "nan"."""
    return [[float(x) if np.isfinite(x) else num(x) for x in row] for row in np.asarray(m, dtype=np.float64)]


def to_dict(e: Explanation, mistakes: Sequence[Mistake] = ()) -> dict[str, Any]:
    """A JSON-ready dict of every step (``json.dumps`` works on it; non-finite numbers are strings)."""
    steps = []
    for s in e.steps:
        d: dict[str, Any] = {"key": s.key, "title": s.title, "formula": s.formula}
        for name, m, r, c in s.extra:
            d.setdefault("inputs", {})[name] = {"matrix": _json_matrix(m), "rows": list(r), "cols": list(c)}
        if s.matrix is not None:
            d.update(matrix=_json_matrix(s.matrix), rows=list(s.rows), cols=list(s.cols))
        d.update(lines=list(s.lines), note=s.note)
        steps.append(d)
    out: dict[str, Any] = {"title": e.title, "source": e.source, "options": _options(e), "steps": steps}
    if e.weights is not None:
        out["weights"] = _json_matrix(e.weights)
    if e.output is not None:
        out["output"] = _json_matrix(e.output)
    out["notes"] = list(e.notes)
    out["mistakes"] = [
        {
            "name": m.name,
            "title": m.title,
            "right_weights": _json_matrix(m.right_weights),
            "wrong_weights": _json_matrix(m.wrong_weights),
            "wrong_row_sums": [float(x) if np.isfinite(x) else num(x) for x in m.wrong_row_sums],
            "right_output": _json_matrix(m.right_output),
            "wrong_output": _json_matrix(m.wrong_output),
            "explanation": m.explanation,
        }
        for m in mistakes
    ]
    return out


def _rich_table(matrix: np.ndarray, rows: Sequence[str], cols: Sequence[str], corner: str = "", title: str = "") -> Any:
    from rich.table import Table

    t = Table(title=title or None, show_header=True, header_style="bold", box=None, padding=(0, 1))
    t.add_column(corner, style="bold cyan")
    for c in cols:
        t.add_column(str(c), justify="right")
    for label, r in zip(rows, np.asarray(matrix, dtype=np.float64), strict=True):
        cells = []
        for x in r:
            s = num(x)
            if np.isnan(x):  # the pictures' NaN colour (attnlab.explain.fmt.NAN_COLOUR)
                cells.append(f"[bold {NAN_COLOUR}]{s}[/]")
            else:
                cells.append(f"[dim]{s}[/dim]" if not np.isfinite(x) else s)
        t.add_row(str(label), *cells)
    return t


def print_rich(e: Explanation, mistakes: Sequence[Mistake] = (), *, console: Any = None) -> None:
    """Print with rich tables and panels (extra ``explain``: ``pip install 'attnlab[explain]'``)."""
    try:
        from rich.console import Console, Group
        from rich.panel import Panel
        from rich.text import Text
    except ImportError:
        raise missing_extra("rich", "explain") from None
    console = console or Console()
    console.print(Text(e.title, style="bold") + Text(f"  [{e.source}]" if e.source else "", style="dim"))
    opts = _options(e)
    if opts:
        console.print(Text(tr("render.options", e.lang, opts=opts), style="dim"))
    for i, s in enumerate(e.steps, 1):
        parts: list[Any] = [Text(s.formula, style="italic")]
        if s.matrix is not None:
            parts.append(_rich_table(s.matrix, s.rows, s.cols))
        for name, matrix, r, cols_x in s.extra:
            parts.append(_rich_table(matrix, r, cols_x, name))
        if s.lines:
            parts.append(Text("\n".join(s.lines)))
        if s.note:
            parts.append(Text(s.note, style="green"))
        console.print(Panel(Group(*parts), title=f"{i}. {s.title}", title_align="left"))
    for n in e.notes:
        console.print(Text(tr("render.note", e.lang, text=n), style="yellow"))
    rows, cols = _labels(e)
    for m in mistakes:
        dv = tuple(f"d{c}" for c in range(m.right_output.shape[1]))
        lg = m.lang
        parts = [
            _rich_table(m.right_weights, rows, cols, title=tr("render.right_weights", lg)),
            _rich_table(m.wrong_weights, rows, cols, title=tr("render.wrong_weights", lg, name=m.name)),
            Text(tr("render.wrong_row_sums", lg, sums=", ".join(num(x) for x in m.wrong_row_sums))),
            _rich_table(m.right_output, rows, dv, title=tr("render.right_output", lg)),
            _rich_table(m.wrong_output, rows, dv, title=tr("render.wrong_output", lg)),
            Text(tr("render.why", lg, text=m.explanation), style="yellow"),
        ]
        console.print(
            Panel(
                Group(*parts),
                title=tr("render.mistake", lg, name=m.name, title=m.title),
                title_align="left",
                border_style="red",
            )
        )
