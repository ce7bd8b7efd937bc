"""Printable worksheets, in English or Chinese, from the lab's item catalogue: questions first, answers after a page
break.

One worksheet has two parts, built from the same data as the lab and the terminal:

* every item of both articles (:data:`attnlab.articles.ITEMS`): its article and section, the ``attnlab explain``
  command, and the lines of that command's output that hold the article's numbers with every number replaced by a
  blank to fill in (``____``); the answer is the same lines as ``attnlab explain ... --lang LANG`` prints them
  (:func:`attnlab.explain.request.explain_argv`, computed when the worksheet is made, never typed in);
* the lab's predict-then-reveal questions (:data:`attnlab.lab.predict.QUESTIONS`) with their options to tick; the
  answer is the right option.

:func:`worksheet` builds the value (pure: no file, no printing); :func:`to_markdown` and :func:`to_html` write it
out. The HTML is one self-contained page (no script, no outside file) whose answers start on a new printed page
(CSS ``break-before: page``); in Markdown the same break is a ``<div>`` with that style, which Markdown viewers
pass through to HTML and print.

>>> ws = worksheet("en", items=(21,))
>>> ws.items[0].blanks[0], ws.items[0].answers[0]
('q0  ____  ____', 'q0  0.6698  0.3302')
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

from ..articles import ITEMS
from ..i18n import check_lang
from ..validate import check_int
from .i18n import t
from .predict import QUESTIONS

__all__ = ["BLANK", "PAGE_BREAK", "ItemSheet", "QuestionSheet", "Worksheet", "to_html", "to_markdown", "worksheet"]

#: What replaces each number of an answer line in the question part.
BLANK = "____"
#: The marker between the questions and the answers (an HTML element with a CSS page break), in both formats.
PAGE_BREAK = '<div class="ws-break" style="break-before: page; page-break-before: always"></div>'

#: A number as ``attnlab explain`` prints it: 0.6698, -2.2118, 1,048,576, 1e9, inf, nan; 16 of 16x and 16×.
_NUMBER = re.compile(r"(?<![\w.])[-−]?(?:\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?(?:e[+-]?\d+)?|inf|nan)(?!\.\d|[\dA-Za-wyz_])")


@dataclass(frozen=True)
class ItemSheet:
    """One article item on the worksheet: ``number`` (1-based, in :data:`~attnlab.articles.ITEMS` order), its
    ``heading``, the ``command`` (``attnlab explain ...``), ``blanks`` (the answer lines with each number blanked;
    empty when the lines hold no number: then the learner writes what happens) and ``answers`` (the lines of the
    command's output that hold the article's numbers, in the worksheet's language)."""

    number: int
    heading: str
    command: str
    blanks: tuple[str, ...]
    answers: tuple[str, ...]


@dataclass(frozen=True)
class QuestionSheet:
    """One of the lab's prediction questions: ``text``, ``options`` (words to tick) and the right ``answer``."""

    number: int
    text: str
    options: tuple[str, ...]
    answer: str


@dataclass(frozen=True)
class Worksheet:
    """A worksheet in ``lang``: the article ``items`` and the lab's ``questions``, questions before answers."""

    lang: str
    title: str
    items: tuple[ItemSheet, ...]
    questions: tuple[QuestionSheet, ...]


def _answer_lines(output: str, english: str, expect: tuple[str, ...]) -> tuple[str, ...]:
    """The lines of ``output`` that hold the article's numbers, in the output's order: for each expected string
    (English, as :data:`~attnlab.articles.ITEMS` has it) the first line that contains it, else (Chinese: other
    words, other wrapping, the same numbers) the first line with the numbers of the English line it is on; the
    whole output when none is found."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    en_lines = [ln.strip() for ln in english.splitlines() if ln.strip()]
    hits: set[int] = set()
    for e in expect:
        hit = next((j for j, ln in enumerate(lines) if e in ln), None)
        nums = _NUMBER.findall(next((ln for ln in en_lines if e in ln), e))
        if hit is None and nums:
            hit = next((j for j, ln in enumerate(lines) if _NUMBER.findall(ln) == nums), None)
        if hit is None and nums:  # the same numbers, maybe more of them on the line
            hit = next((j for j, ln in enumerate(lines) if all(n in _NUMBER.findall(ln) for n in nums)), None)
        if hit is not None:
            hits.add(hit)
    return tuple(lines[j] for j in sorted(hits)) if hits else tuple(lines)


def _blank(line: str) -> str:
    return _NUMBER.sub(BLANK, line)


def worksheet(lang: str = "en", *, items: tuple[int, ...] | None = None, questions: bool = True) -> Worksheet:
    """The worksheet in ``lang`` ("en" or "zh") for ``items`` (1-based numbers into
    :data:`~attnlab.articles.ITEMS`; None: every item) and, with ``questions``, the lab's prediction questions.

    Every answer comes from running the item's ``attnlab explain`` command now (in ``lang``). Raises
    :class:`~attnlab.errors.OptionError` naming ``lang`` or ``items`` for a value it cannot use.
    """
    from ..explain.request import explain_argv

    lang = check_lang(lang)
    numbers = tuple(range(1, len(ITEMS) + 1)) if items is None else items
    numbers = tuple(check_int("items", n, minimum=1, maximum=len(ITEMS)) for n in numbers)
    sheets = []
    for n in numbers:
        it = ITEMS[n - 1]
        _, en = explain_argv(tuple(it.argv), "en")
        _, out = explain_argv(tuple(it.argv), lang) if lang != "en" else (0, en)
        answers = _answer_lines(out, en, tuple(it.expect))
        blanks = tuple(_blank(a) for a in answers) if any(_NUMBER.search(a) for a in answers) else ()
        heading = t(lang, "ws.item", n=n, source=it.source, section=t(lang, it.section))
        sheets.append(ItemSheet(n, heading, " ".join(("attnlab explain", *it.argv, "--lang", lang)), blanks, answers))
    qs: tuple[QuestionSheet, ...] = ()
    if questions:
        qs = tuple(
            QuestionSheet(
                i,
                t(lang, q.text).replace("**", ""),
                tuple(q.label(k, lang) for k, _ in q.options),
                q.label(q.correct, lang),
            )
            for i, q in enumerate(QUESTIONS.values(), 1)
        )
    return Worksheet(lang, t(lang, "ws.title"), tuple(sheets), qs)


def to_markdown(ws: Worksheet) -> str:
    """The worksheet as Markdown: the questions, :data:`PAGE_BREAK`, then the answers."""
    lang = ws.lang
    out = [f"# {ws.title}", "", t(lang, "ws.intro"), ""]
    if ws.items:
        out += [f"## {t(lang, 'ws.items')}", ""]
    for s in ws.items:
        out += [f"### {s.heading}", "", f"{t(lang, 'ws.command')} `{s.command}`", ""]
        if s.blanks:
            out += [t(lang, "ws.fill"), "", "```", *s.blanks, "```", ""]
        else:
            out += [t(lang, "ws.write"), "", "&nbsp;", "", "&nbsp;", ""]
    if ws.questions:
        out += [f"## {t(lang, 'ws.questions')}", ""]
    for q in ws.questions:
        out += [f"### {q.text}", ""]
        out += [f"- [ ] {o}" for o in q.options]
        out += ["", f"{t(lang, 'ws.why')} ____________________", ""]
    out += [PAGE_BREAK, "", f"## {t(lang, 'ws.answers')}", ""]
    for s in ws.items:
        out += [t(lang, "ws.answer_item", n=s.number, cmd=s.command), "", "```", *s.answers, "```", ""]
    for q in ws.questions:
        out += [t(lang, "ws.answer_question", n=q.number, answer=q.answer), ""]
    out += [t(lang, "ws.made_by", lang=lang), ""]
    return "\n".join(out)


_CSS = """
body { font-family: "Noto Sans", "WenQuanYi Micro Hei", "Microsoft YaHei", sans-serif; margin: 2em; color: #000; }
h1 { font-size: 1.5em; } h2 { font-size: 1.25em; border-bottom: 1px solid #999; } h3 { font-size: 1.05em; }
pre { background: #f4f4f4; padding: 6px 10px; font-size: 12px; white-space: pre-wrap; }
.ws-item, .ws-q { break-inside: avoid; page-break-inside: avoid; margin-bottom: 1.2em; }
.ws-lines { border-bottom: 1px solid #999; height: 2.2em; }
ul.ws-options { list-style: none; padding-left: 0; } ul.ws-options li::before { content: "☐ "; }
@media print { body { margin: 1.5cm; } }
"""


def to_html(ws: Worksheet) -> str:
    """The worksheet as one self-contained HTML page (inline CSS, no script): questions, a printed page break,
    answers."""
    lang, e = ws.lang, html.escape
    out = [
        "<!DOCTYPE html>",
        f'<html lang="{"zh-CN" if lang == "zh" else "en"}"><head><meta charset="utf-8">',
        f"<title>{e(ws.title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(ws.title)}</h1><p>{e(t(lang, 'ws.intro'))}</p>",
    ]
    if ws.items:
        out.append(f"<h2>{e(t(lang, 'ws.items'))}</h2>")
    for s in ws.items:
        out.append(
            f'<section class="ws-item" data-item="{s.number}"><h3>{e(s.heading)}</h3>'
            f"<p>{e(t(lang, 'ws.command'))} <code>{e(s.command)}</code></p>"
        )
        if s.blanks:
            out.append(f"<p>{e(t(lang, 'ws.fill'))}</p><pre>{e(chr(10).join(s.blanks))}</pre>")
        else:
            out.append(f"<p>{e(t(lang, 'ws.write'))}</p><div class='ws-lines'></div><div class='ws-lines'></div>")
        out.append("</section>")
    if ws.questions:
        out.append(f"<h2>{e(t(lang, 'ws.questions'))}</h2>")
    for q in ws.questions:
        opts = "".join(f"<li>{e(o)}</li>" for o in q.options)
        out.append(
            f'<section class="ws-q" data-question="{q.number}"><h3>{e(q.text)}</h3>'
            f"<ul class='ws-options'>{opts}</ul><p>{e(t(lang, 'ws.why'))}</p>"
            "<div class='ws-lines'></div></section>"
        )
    out += [PAGE_BREAK, f'<section class="ws-answers"><h2>{e(t(lang, "ws.answers"))}</h2>']
    for s in ws.items:
        words = e(t(lang, "ws.answer_item", n=s.number, cmd=s.command)).replace("`", "")
        out.append(
            f'<div class="ws-item" data-answer="{s.number}"><p>{words}</p><pre>{e(chr(10).join(s.answers))}</pre></div>'
        )
    for q in ws.questions:
        out.append(
            f'<p data-answer-question="{q.number}">{e(t(lang, "ws.answer_question", n=q.number, answer=q.answer))}</p>'
        )
    out += [f"<p>{e(t(lang, 'ws.made_by', lang=lang)).replace('`', '')}</p>", "</section></body></html>", ""]
    return "\n".join(out)
