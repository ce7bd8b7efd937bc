"""The Chinese lab as complete as the English, without a browser: every preset marks the article's numbers in both
languages (43/43 each, the "(marked)" claim only where a mark is), and no English is left in the Chinese page's
server-side parts (the item's output, the tables, the pictures, the steps) by :func:`english_runs`' rule.
tests/test_lab_browser_zh.py applies the same rule to the whole page in Chromium.
"""

from __future__ import annotations

import html
import re
from dataclasses import replace

import pytest

from attnlab.lab import logic, presets
from attnlab.lab.i18n import t

LANGS = ("en", "zh")

#: ASCII words that are not English left behind: symbols and functions of the formulas, names of models, libraries
#: and units, and the terms the Chinese articles themselves write in Latin letters (Self-Attention, KV Cache,
#: one-hot, logits, token, inverted dropout: /work/shared/seeds' 000 and 001).
ALLOWED = {
    "softmax", "Softmax", "exp", "log", "max", "min", "sqrt", "cos", "nan", "NaN", "inf", "rowsum", "delta", "lse",
    "scale", "Var", "std", "float", "bfloat", "True", "False", "attn", "mask", "Mask", "keep",
    "attnlab", "FlashAttention", "PyTorch", "SDPA", "NumPy", "SmolLM", "MiniLM", "Llama", "BERT", "GGUF", "RoPE",
    "ALiBi", "MultiheadAttention", "GQA", "MQA", "MHA", "KV", "MiB", "GiB", "KiB", "GFLOP", "FLOP", "FLOPs",
    "PAD", "CLS", "SEP", "UNK", "KL", "BOS", "EOS",
    "Attention", "Self", "Cross", "Cache", "cache", "token", "tokens", "logits", "logit", "batch", "one", "hot",
    "inverted", "dropout", "Dropout", "Notebook", "sum", "raise", "zero",
}  # fmt: skip

#: A run of English: two or more ASCII words (letters) or numbers one after another (spaces, hyphens, an apostrophe
#: between), at least one a word of 3+ letters that is not :data:`ALLOWED`.
RUN = re.compile(r"[A-Za-z][A-Za-z']*(?:[ \-]+(?:[A-Za-z][A-Za-z']*|\d[\d.,]*))+|\d[\d.,]*(?: +[A-Za-z][A-Za-z']*)+")


def english_runs(text: str) -> list[str]:
    """The runs of English words in ``text`` (what a Chinese page must not show).

    The rule: code and identifiers are not English. Removed first: commands (``attnlab explain causal-4
    --tiled 2``), dotted names (``attnlab.masks.from_blocked``), names with ``_`` or a digit (``d_k``, ``q0``,
    ``bottom_right``, ``float16``), option values with hyphens (``softmax-then-mask``) and ``--flags``. What is left is
    English where two or more words (or a word and a number: "head 0") stand one after another and one of the words
    has 3+ letters and is not :data:`ALLOWED`. A lone ASCII word between Chinese words ("按 token 计") is a term, not
    a run.

    >>> english_runs("第 q0 行：权重之和 = 1；attnlab explain causal-4 --tiled 2")
    []
    >>> english_runs("head 0 · 键 k1 · weight 0.5 · Self-Attention")
    ['head 0', 'weight 0.5']
    """
    text = re.sub(r"attnlab (?:explain|heatmap|lab|check|demo)(?: [\w\-.,=/]+)*", " ", text)
    text = re.sub(r"\b[A-Za-z_]\w*(?:\.\w+)+\b", " ", text)
    text = re.sub(r"--[\w-]+", " ", text)
    text = re.sub(r"\b[a-z]+(?:-[a-z0-9]+)+\b", " ", text)  # softmax-then-mask, causal-4
    text = re.sub(r"\b\w+(?:-\w+)*-\w*\d\w*\b", " ", text)  # all-MiniLM-L6-v2
    text = re.sub(r"\b(?=\w*[A-Za-z])(?=\w*[_\d])\w+\b", " ", text)  # d_k, q0, float16, W_O
    out = []
    for m in RUN.finditer(text):
        words = re.findall(r"[A-Za-z][A-Za-z']*", m.group())
        if any(len(w) >= 3 and w.split("'")[0] not in ALLOWED for w in words):
            out.append(m.group().strip())
    return out


def visible_text(markup: str) -> str:
    """What a person reads in ``markup``: the text outside tags, ``<code>`` removed (a command), with the texts
    that show on hover (``<title>``, ``title=``, ``aria-label=``) and the placeholders."""
    markup = re.sub(r"<(style|script)\b.*?</\1>", " ", markup, flags=re.S)
    markup = re.sub(r"<code>.*?</code>", " ", markup, flags=re.S)
    shown = re.findall(r'(?:title|aria-label|placeholder)="([^"]*)"', markup)
    return html.unescape(re.sub(r"<[^>]+>", "\n", markup) + "\n" + "\n".join(shown))


def test_the_rule_finds_english_and_spares_identifiers():
    assert english_runs("(the future, under a causal mask: a leak)") != []
    assert english_runs("选项：因果（bottom_right） softmax(S + 100 + M) 错误 query-axis：") == []
    assert english_runs("KV Cache MiB，GQA（8 个 KV 头） nan  nan") == []
    assert english_runs("layer 3") == ["layer 3"]


@pytest.mark.parametrize("lang", LANGS)
def test_every_preset_marks_the_articles_numbers_in_each_language(lang):
    counts = {}
    for p in presets.ITEM_PRESETS.values():
        markup = presets.item_html(p, lang)
        found = int(re.search(r'data-found="(\d+)"', markup).group(1))
        counts[p.key] = (found, len(p.expect))
        marked = re.findall(r'<mark data-testid="al-expect">(.*?)</mark>', markup, flags=re.S)
        assert len(marked) == found
        for e, m in zip(p.expect, (html.unescape(x) for x in marked), strict=False):  # the expect's numbers
            want = sorted(n for n, _, _ in presets._numbers(e)) if presets.NUMBER.search(e) else [e]
            got = sorted(n for n, _, _ in presets._numbers(m)) if presets.NUMBER.search(e) else [m]
            assert got == want or any(got == sorted(n for n, _, _ in presets._numbers(x)) for x in p.expect), (p.key, e)
        claim = t(lang, "The article prints these numbers; attnlab computes them (marked):")
        assert (claim in html.unescape(markup)) == (found == len(p.expect))
    assert [k for k, (f, n) in counts.items() if f != n] == []
    assert len(counts) == len(presets.ITEM_PRESETS) == 43


def test_the_chinese_marks_stand_where_the_english_ones_do():
    """The k-th occurrence rule: item-38's 0 is the leak test's 0 (not the first 0 of the output), item-41's
    reordered sentence (1,024 个键的窗口 2.1427 倍) is still found."""
    for key, line in (("item-38", "在因果遮罩下 q0 变化 0"), ("item-41", "1,024 个键的窗口 2.1427 倍")):
        p = presets.ITEM_PRESETS[key]
        text = presets.explain_output(p.argv, "zh")[1]
        spans = presets.expect_spans(p.argv, p.expect, "zh")
        at = text.find(line)
        assert at >= 0 and any(s is not None and at <= s[0] < at + len(line) for s in spans), (key, spans)


def test_the_marked_claim_is_made_only_when_a_mark_is_there():
    p = replace(presets.ITEM_PRESETS["item-00"], expect=("= [123.4567, 7.654]", "q0  0.6698  0.3302"))
    for lang in LANGS:
        half = html.unescape(presets.item_html(p, lang))
        assert 'data-found="1" data-expected="2"' in half
        assert t(lang, "The article prints these numbers; attnlab computes {k} of its {n} (marked):", k=1, n=2) in half
        none = html.unescape(presets.item_html(replace(p, expect=("= [123.4567]",)), lang))
        assert 'data-found="0"' in none and "<mark" not in none
        assert t(lang, "The article prints these numbers; none of them is in this output (nothing marked):") in none
        assert "（已标记）" not in none


def test_no_english_in_the_chinese_page_server_side_for_every_preset():
    left: dict[str, set[str]] = {}
    for p in presets.ITEM_PRESETS.values():
        parts = [presets.item_html(p, "zh")]
        if p.state is not None:
            r = logic.compute(p.state, "zh")
            parts.append(logic.result_html(r, "zh"))
            if r.ok:
                parts += [logic.pictures_html(r, "zh"), logic.steps_html(r, "zh")]
        for run in english_runs(visible_text("\n".join(parts))):
            left.setdefault(run, set()).add(p.key)
    assert left == {}, left


# ---------------------------------------------------------------------------------------------------------------
# issue 22 §5: one number, written one way in every view; one NaN colour


def test_the_saturation_weights_read_the_same_in_every_view():
    """softmax([10, 20]) = [0.000045, 0.999955] (001 §4.2): the terminal's table, the lab's table, the lab's SVG
    heatmap and attnlab.plot's cell text all write 0.000045 and 0.999955 (the SVG said 0.00 / 1.00)."""
    from attnlab.explain.fmt import num
    from attnlab.plot import cell_text

    r = logic.compute(presets.PRESETS["saturation"].state)
    w = r.weights[1]
    assert [num(x) for x in w] == ["0.000045", "0.999955"] == [cell_text(x) for x in w]
    _, text = presets.explain_output(("saturation",))
    assert "0.000045  0.999955" in text
    table = logic.result_html(r)
    svg = logic.pictures_html(r)
    for s in ("0.000045", "0.999955"):
        assert f">{s}</td>" in table and f">{s}</text>" in svg, s
    assert ">0.00<" not in svg and ">1.00<" not in svg


def test_one_nan_colour_in_the_lab_the_pictures_and_the_terminal():
    import io

    from rich.console import Console

    from attnlab import plot
    from attnlab.explain import explain_example
    from attnlab.explain.fmt import NAN_COLOUR
    from attnlab.explain.render import print_rich
    from attnlab.lab import svg

    assert svg.NAN_FILL == plot.NAN_STYLE["facecolor"] == plot.POLICY_NAN_STYLE["facecolor"] == NAN_COLOUR
    out = io.StringIO()
    print_rich(explain_example("all-masked"), console=Console(file=out, force_terminal=True, color_system="truecolor"))
    r, g, b = (int(NAN_COLOUR[i : i + 2], 16) for i in (1, 3, 5))
    assert f"38;2;{r};{g};{b}m" in out.getvalue()  # the NaN cells in the pictures' colour


@pytest.mark.parametrize("lang", LANGS)
def test_the_articles_rounded_printouts_are_noted_where_they_appear(lang):
    for key, argv in (("item-00", ("one-query",)), ("item-20", ("2x2",)), ("item-25", ("2x2-causal",))):
        markup = html.unescape(presets.item_html(presets.ITEM_PRESETS[key], lang))
        assert t(lang, presets.ROUNDED[argv]) in markup, key
    for n in ("13.396", "3.3024", "13.3952"):
        assert n in presets.ROUNDED[("2x2-causal",)]
