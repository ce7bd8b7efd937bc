"""Attention by hand: every step as data (:func:`explain`), the classic mistakes next to it (:func:`compare`),
FlashAttention's online softmax block by block (:func:`explain_online`), the backward and dropout by hand
(:func:`explain_backward`, :func:`explain_dropout`), the articles' other lessons (:func:`explain_lesson`), renderers
for terminals, pipes, markdown and JSON, and every text in English or Chinese (:func:`tr`, ``lang="zh"``).

>>> from attnlab.explain import explain_example, to_text
>>> e = explain_example("2x2-causal")
>>> e.weights.round(4).tolist()
[[1.0, 0.0], [0.3302, 0.6698]]
>>> e.output.round(3).tolist()
[[10.0, 0.0], [3.302, 13.395]]
"""

from .i18n import LANGS, tr
from .inputs import load_inputs, load_mask, load_matrix, parse_mask, parse_matrix, parse_tokens
from .lessons import explain_backward, explain_dropout, explain_example, explain_lesson
from .mistakes import MISTAKES, Mistake, compare
from .online import explain_online
from .render import print_rich, to_dict, to_markdown, to_text
from .steps import (
    Explanation,
    Setup,
    Step,
    explain,
    explain_setup,
    explain_softmax,
    explain_weighted_average,
    setup_from_example,
)

__all__ = [
    "LANGS",
    "MISTAKES",
    "Explanation",
    "Mistake",
    "Setup",
    "Step",
    "compare",
    "explain",
    "explain_backward",
    "explain_dropout",
    "explain_example",
    "explain_lesson",
    "explain_online",
    "explain_setup",
    "explain_softmax",
    "explain_weighted_average",
    "load_inputs",
    "load_mask",
    "load_matrix",
    "parse_mask",
    "parse_matrix",
    "parse_tokens",
    "print_rich",
    "setup_from_example",
    "to_dict",
    "to_markdown",
    "to_text",
    "tr",
]
