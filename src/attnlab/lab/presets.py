"""One lab preset for each worked example of the two articles (:mod:`attnlab.articles`), built from the same data.

A preset is the lab's inputs (:class:`~attnlab.lab.logic.LabState`) that reproduce the example exactly:

* an example with Q, K, V is typed into the boxes as it is, with its causal flag, mask, padding, scale, per-key
  bias, fully-masked-row policy and token labels (a one-query causal example is a decoding query, bottom-right);
* the weighted average (given weights ``a``, article 001 §1) becomes one query of width 1 against keys
  ``ln a_j`` with scale 1, so softmax returns ``a`` itself and the output is ``Σ a_j v_j``;
* the softmax-only example (given logits) becomes one-hot queries against keys holding the logits, scale 1, so
  every row of scores *is* one row of logits.

>>> p = PRESETS["weighted-average"]
>>> p.state.q, p.state.scale
('1', '1')
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..articles import EXAMPLES, EXTRA_EXAMPLES

__all__ = [
    "DEFAULT_PRESET",
    "ITEM_PRESETS",
    "NUMBER",
    "PRESETS",
    "ROUNDED",
    "ItemPreset",
    "Preset",
    "expect_spans",
    "explain_output",
    "item_html",
    "item_preset",
    "matrix_text",
    "preset_of",
]

#: The preset the lab opens with: article 000's four positions under the causal mask.
DEFAULT_PRESET = "causal-4"


@dataclass(frozen=True)
class Preset:
    """A named lab input: ``title`` and ``source`` from the article, ``state`` the lab's inputs, ``how`` (English,
    empty for a plain Q/K/V example) how the lab turned the example into attention."""

    name: str
    title: str
    source: str
    state: Any
    how: str = ""


def matrix_text(m: Any) -> str:
    """A matrix as the lab's text boxes show it: one row per line, numbers separated by ", " (exact: repr)."""
    a = np.atleast_2d(np.asarray(m, dtype=np.float64))
    return "\n".join(", ".join(_n(x) for x in row) for row in a)


def _n(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


def _mask_text(m: Any) -> str:
    a = np.atleast_2d(np.asarray(m, dtype=bool))
    return "\n".join(" ".join("1" if x else "0" for x in row) for row in a)


def preset_of(ex: Any) -> Preset:
    """The :class:`Preset` of one :class:`~attnlab.articles.Example`."""
    from .logic import LabState

    how = ""
    if ex.weights is not None:
        w = np.asarray(ex.weights, dtype=np.float64)[0]
        state = LabState(q="1", k="\n".join(repr(math.log(x)) for x in w), v=matrix_text(ex.v), scale="1", causal=False)
        how = "given weights a: one query of width 1 against keys ln a_j, scale 1, so softmax gives a back exactly"
    elif ex.logits:
        x = np.stack([np.asarray(r, dtype=np.float64).ravel() for r in ex.logits])  # [rows, n]
        state = LabState(
            q=matrix_text(np.eye(x.shape[0])),
            k=matrix_text(x.T),
            v=matrix_text(np.eye(x.shape[1])),
            scale="1",
            causal=False,
        )
        how = "given logits: one-hot queries against keys holding the logits, scale 1, so each row of scores is one row"
    else:
        n_k = np.shape(ex.k)[0]
        padding = getattr(ex, "padding", None)
        bias = getattr(ex, "bias", None)
        tokens = getattr(ex, "tokens", None)
        state = LabState(
            q=matrix_text(ex.q),
            k=matrix_text(ex.k),
            v=matrix_text(ex.v),
            causal=bool(ex.causal),
            mask="" if ex.mask is None else _mask_text(ex.mask),
            scale="" if ex.scale is None else _n(ex.scale),
            padded=0 if padding is None else n_k - int(padding),
            bias="" if bias is None else matrix_text(bias),
            masked_rows=getattr(ex, "masked_rows", None) or "raise",
            tokens="" if not tokens else " ".join(tokens),
        )
    return Preset(ex.name, ex.title, ex.source, state, how)


#: Every worked example of :mod:`attnlab.articles` (``EXAMPLES`` then ``EXTRA_EXAMPLES``) as a lab preset.
PRESETS: dict[str, Preset] = {name: preset_of(ex) for name, ex in {**EXAMPLES, **EXTRA_EXAMPLES}.items()}


@dataclass(frozen=True)
class ItemPreset:
    """One item of the articles (:data:`attnlab.articles.ITEMS`) as the lab shows it: ``state`` the lab's inputs
    (None for a lesson without Q, K, V: the controls stay as they are), ``argv`` the ``attnlab explain`` command
    whose output the lab shows next to them, ``expect`` the article's numbers in that output."""

    key: str
    source: str
    section: str
    what: str
    state: Any
    argv: tuple[str, ...]
    expect: tuple[str, ...]
    lab: str

    def label(self, lang: str = "en") -> str:
        """The dropdown's words: article, section and what the item shows."""
        from .i18n import t

        return t(
            lang,
            "{source} {section}: {what}",
            source=self.source,
            section=t(lang, self.section),
            what=t(lang, self.what),
        )


def _flags(argv: tuple[str, ...]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    i = 1 if argv and not argv[0].startswith("-") else 0
    while i < len(argv):
        a = argv[i]
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[a] = argv[i + 1]
            i += 2
        else:
            out[a] = True
            i += 1
    return out


def item_preset(index: int, item: Any) -> ItemPreset:
    """The :class:`ItemPreset` of ``item`` (the ``index``-th of :data:`~attnlab.articles.ITEMS`)."""
    from dataclasses import replace

    state = None
    if item.lab in PRESETS:
        state = PRESETS[item.lab].state
        f = _flags(tuple(item.argv))
        changes: dict[str, Any] = {}
        if "--shift" in f:
            changes["shift"] = float(f["--shift"])
        if "--temperature" in f:
            changes["temperature"] = float(f["--temperature"])
        if "--no-causal" in f:
            changes["causal"] = False
        if "--causal" in f:
            changes["causal"] = True
        if "--bias" in f:
            changes["bias"] = str(f["--bias"]).replace(",", ", ")
        state = replace(state, **changes)
    return ItemPreset(
        f"item-{index:02d}", item.source, item.section, item.what, state, tuple(item.argv), tuple(item.expect), item.lab
    )


def _items() -> dict[str, ItemPreset]:
    try:
        from ..articles import ITEMS
    except ImportError:  # an attnlab without the items table: one preset per example
        return {}
    return {p.key: p for p in (item_preset(i, it) for i, it in enumerate(ITEMS))}


#: Every item of both articles (:data:`attnlab.articles.ITEMS`), in article order, as a lab preset.
ITEM_PRESETS: dict[str, ItemPreset] = _items()


@functools.lru_cache(maxsize=256)
def explain_output(argv: tuple[str, ...], lang: str = "en") -> tuple[int, str]:
    """What ``attnlab explain ARGV --format text`` shows: (exit status, text), from
    :func:`attnlab.explain.request.explain_argv` (no command line run, no output captured; the same text is
    returned again without recomputing it)."""
    from ..explain.request import explain_argv

    return explain_argv(argv, lang)


#: A number as explain writes it, in any language: 0.6698, -2.2118, 1,048,576, 4.1e-01, nan, -inf; not the digits
#: of a name (q0, float16, k1).
NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[+-]?\d+)?|(?<![\w.])-?(?:nan|inf)(?!\w)")


def _numbers(text: str) -> list[tuple[str, int, int]]:
    return [(m.group().replace(",", ""), m.start(), m.end()) for m in NUMBER.finditer(text)]


def _occurrences(text: str, expect: str) -> list[tuple[int, int]]:
    """Where ``expect``'s numbers stand in ``text``, one after another (no other number between, in any order: a
    translation may turn a sentence around): the spans from the first number to the last; an expect without a
    number (a mask picture, a name) where it stands as written."""
    want = sorted(n for n, _, _ in _numbers(expect))
    if not want:
        return [(m.start(), m.end()) for m in re.finditer(re.escape(expect), text)]
    got = _numbers(text)
    return [
        (got[i][1], got[i + len(want) - 1][2])
        for i in range(len(got) - len(want) + 1)
        if sorted(n for n, _, _ in got[i : i + len(want)]) == want
    ]


def expect_spans(argv: tuple[str, ...], expect: tuple[str, ...], lang: str = "en") -> list[tuple[int, int] | None]:
    """Where each of the article's numbers ``expect`` stands in ``attnlab explain ARGV``'s text in ``lang`` (None:
    not there).

    One rule for every language: an expect is written as the English output prints it (``"q0  0.6698  0.3302"``,
    :data:`attnlab.articles.ITEMS`); its *numbers* (:data:`NUMBER`) are what is looked for, so the words around
    them may be in any language. The English text says which occurrence is meant: the k-th place where those
    numbers stand one after another (in any order) in the English text is the k-th in the other language's text.
    An expect without a number is looked for as written (it must be written the same in every language:
    ``■ ■ ⬚ ⬚``, ``RoPE``).

    >>> text = explain_output(("leak-test",), "zh")[1]
    >>> [text[s - 13 : e] for s, e in expect_spans(("leak-test",), ("q0 moves 0 under the causal mask",), "zh")]
    ['在因果遮罩下 q0 变化 0']
    """
    en = explain_output(argv, "en")[1]
    text = en if lang == "en" else explain_output(argv, lang)[1]
    out: list[tuple[int, int] | None] = []
    for e in expect:
        at = en.find(e)
        if at < 0:
            out.append(None)
            continue
        first = NUMBER.search(e)
        start = at + (first.start() if first else 0)
        k = sum(1 for s, _ in _occurrences(en, e) if s < start)
        there = _occurrences(text, e)
        out.append(there[k] if k < len(there) else None)
    return out


#: Where the articles print a number rounded further than attnlab (``attnlab explain ARGV``'s output -> the note
#: shown under it; English, Chinese in :mod:`attnlab.lab.i18n`). ``attnlab demo`` says the same for 001 §5.
ROUNDED: dict[tuple[str, ...], str] = {
    ("one-query",): "000 writes the output rounded to 2 decimals: [6.70, 6.60] is [6.6976, 6.6048].",
    ("2x2",): (
        "001 §5 prints O ≈ [[6.698, 6.604], [3.302, 13.396]]: V multiplied by the weights rounded to 0.6698 and "
        "0.3302. The exact output is [[6.6976, 6.6048], [3.3024, 13.3952]]; §12's expected printout writes 6.6041 "
        "and 13.3959 for 6.6048 and 13.3952."
    ),
    ("2x2-causal",): (
        "001 §7.3 prints O = [[10, 0], [3.302, 13.396]] (the weights rounded to 0.3302 and 0.6698) and §12's "
        "expected printout 13.3959: the exact output is [[10, 0], [3.3024, 13.3952]]."
    ),
}


def item_html(preset: ItemPreset, lang: str = "en") -> str:
    """The item's ``attnlab explain`` output with the article's numbers marked (``data-testid="al-item"``,
    ``data-found``: how many of them are marked, :func:`expect_spans`)."""
    import html

    from .i18n import t

    code, text = explain_output(preset.argv, lang)
    text = text.rstrip("\n")
    spans = sorted({s for s in expect_spans(preset.argv, preset.expect, lang) if s is not None})
    found = len(spans)
    parts, end = [], 0
    for s, e in spans:
        if s < end:  # overlapping another mark: already inside it
            continue
        parts += [html.escape(text[end:s]), f'<mark data-testid="al-expect">{html.escape(text[s:e])}</mark>']
        end = e
    body = "".join(parts) + html.escape(text[end:])
    n = len(preset.expect)
    if found == n:
        claim = t(lang, "The article prints these numbers; attnlab computes them (marked):")
    elif found:
        claim = t(lang, "The article prints these numbers; attnlab computes {k} of its {n} (marked):", k=found, n=n)
    else:
        claim = t(lang, "The article prints these numbers; none of them is in this output (nothing marked):")
    cmd = html.escape(" ".join(("attnlab explain", *preset.argv)))
    note = ROUNDED.get(tuple(preset.argv))
    rounded = f'<p data-testid="al-rounded"><em>{html.escape(t(lang, note))}</em></p>' if note else ""
    return (
        f'<div data-testid="al-item" data-key="{preset.key}" data-found="{found}" data-expected="{n}"'
        f' data-code="{code}">'
        f"<p>{html.escape(claim)} "
        f"<code>{cmd}</code></p>"
        f'<pre style="white-space:pre;overflow-x:auto;font-size:12px;max-height:420px;overflow-y:auto;'
        f'background:#f7f7f7;color:#000;padding:8px">{body}</pre>{rounded}</div>'
    )
