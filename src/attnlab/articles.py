"""The worked examples of the two articles attnlab grew from, as data (used by the demo, ``explain`` and tests).

Sources: ``000`` is "Compute attention by hand: Q, K, V and the causal mask"; ``001`` is "Attention maths in
detail". Each example keeps the article's inputs exactly; the numbers the articles print are in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

__all__ = [
    "EXAMPLES",
    "EXTRA_EXAMPLES",
    "ITEMS",
    "LESSONS",
    "MULTI_HEAD",
    "VARIANCE_DK",
    "Example",
    "Item",
    "MultiHeadLessonData",
    "example",
    "items_table",
]


@dataclass(frozen=True)
class Example:
    """One worked example: q ``[n_q, d_k]``, k ``[n_k, d_k]``, v ``[n_k, d_v]`` and how it is computed.

    ``weights`` is set for the one example that starts from given weights (the weighted average); ``logits`` for
    the one about softmax alone (saturation). ``mask`` (bool ``[n_q, n_k]``, True = may attend) and ``scale``
    (``None`` = 1/sqrt(d_k)) are set where the article fixes them; so are ``bias`` (additive, broadcastable to
    ``[n_q, n_k]``), ``padding`` (real key positions), ``masked_rows`` (policy), ``tokens`` (labels) and
    ``align`` (how ``causal`` is placed when ``n_q != n_k``: the one-query example decodes, ``"bottom_right"``).
    A *lesson* (:data:`LESSONS`) has none of q, k, v: it is computed by :mod:`attnlab.explain.lessons`.
    """

    name: str
    title: str
    source: str
    q: np.ndarray | None = None
    k: np.ndarray | None = None
    v: np.ndarray | None = None
    causal: bool = False
    weights: np.ndarray | None = None
    logits: tuple[np.ndarray, ...] = field(default_factory=tuple)
    mask: np.ndarray | None = None
    scale: float | None = None
    bias: np.ndarray | None = None
    padding: int | None = None
    masked_rows: str | None = None
    tokens: tuple[str, ...] | None = None
    align: str | None = None


def _a(x) -> np.ndarray:
    a = np.asarray(x)
    a.setflags(write=False)
    return a


class _Inputs(TypedDict):
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray


def _inputs(q, k, v) -> _Inputs:
    """An example's ``q, k, v`` as read-only arrays (``Example(name, title, source, **_inputs(q, k, v))``)."""
    return {"q": _a(q), "k": _a(k), "v": _a(v)}


def _by_name(*examples: Example) -> dict[str, Example]:
    return {e.name: e for e in examples}


_I2 = [[1, 0], [0, 1]]
_V2 = [[10, 0], [0, 20]]
_V3 = [[10, 0], [0, 10], [5, 5]]  # the weighted average's three values (001 §1), read again in §3 and §8
#: The 2×2 example (Q = K = I) and the four positions of article 000's causal example (its self-test adds a bias):
#: each example below that starts from them names them, so the article's numbers are written once.
_TWO = _inputs(_I2, _I2, _V2)
_PAD_QK = [[1, 0], [0, 1], [1, 1], [0, 0]]  # the padding example's queries = keys: three tokens and PAD
_FOUR = _inputs([[1, 0], [0, 1], [1, 1], [1, -1]], [[1, 0], [0, 1], [1, 1], [-1, 1]], [[1, 0], [0, 1], [1, 1], [2, 0]])

#: The six lesson examples of the articles by name (``attnlab explain NAME``; ``2x2`` is the demo's).
EXAMPLES: dict[str, Example] = _by_name(
    Example(
        "weighted-average",
        "Attention is a weighted average: 0.6 v1 + 0.3 v2 + 0.1 v3",
        "001 §1",
        v=_a(_V3),
        weights=_a([[0.6, 0.3, 0.1]]),
    ),
    Example(
        "one-query",
        "One query [1, 0] against keys [1, 0] and [0, 1]",
        "000, 'compute one row by hand'",
        **_inputs([[1, 0]], _I2, _V2),
        align="bottom_right",
    ),
    Example("2x2", "The 2×2 example: Q = K = I, V = [[10, 0], [0, 20]]", "001 §5", **_TWO),
    Example("2x2-causal", "The 2×2 example with the causal mask", "001 §7.3", **_TWO, causal=True),
    Example(
        "causal-4",
        "Four positions under the causal mask: row i has i + 1 legal keys",
        "000, 'causality is an information boundary'",
        **_FOUR,
        causal=True,
    ),
    Example(
        "saturation",
        "Why scale: softmax([1, 2]) vs softmax([10, 20])",
        "001 §4.2",
        logits=(_a([1.0, 2.0]), _a([10.0, 20.0])),
    ),
)


#: Further worked numbers the articles use to make a point (kept apart from the six lesson examples above).
EXTRA_EXAMPLES: dict[str, Example] = _by_name(
    Example(
        "mask-order",
        "Mask before softmax: scores [1, 2] with the second key masked",
        "001 §7.4",
        **_inputs([[1]], [[1], [2]], _V2),
        mask=_a([[True, False]]),
        scale=1.0,
    ),
    Example(
        "one-query-v100",
        "The one-query example with v0 = [100, 0]: the same weights, another output",
        "000, notebook",
        **_inputs([[1, 0]], _I2, [[100, 0], [0, 20]]),
        align="bottom_right",
    ),
    Example(
        "dot-product",
        "A dot product is a match score, not a probability: same direction, opposite, orthogonal",
        "001 §3, §3.1",
        **_inputs([[1, 1]], [[1, 1], [-1, -1], [1, -1]], _V3),
    ),
    Example(
        "cross",
        "Cross attention: 2 queries read 3 source positions; A is [n_q, n_k] = [2, 3], not square",
        "001 §2.2, §8",
        **_inputs(_I2, [[1, 0], [0, 1], [1, 1]], _V3),
    ),
    Example(
        "padding",
        "Padding masks the PAD key column; the PAD query still gets an output",
        "001 §7.1, §17.4",
        **_inputs(_PAD_QK, _PAD_QK, [[1, 0], [0, 1], [1, 1], [9, 9]]),
        padding=3,
        tokens=("我", "喜欢", "猫", "PAD"),
    ),
    Example(
        "all-masked",
        "A query row with every key masked: softmax over nothing is 0/0 = NaN",
        "001 §7.5; 000, engineering trap",
        **_TWO,
        mask=_a([[False, False], [True, True]]),
        masked_rows="nan",
    ),
    Example(
        "column-bias",
        "Self-test, second half: a different bias per column changes the weights",
        "000, self-test",
        **_FOUR,
        causal=True,
        bias=_a([[0.0, 1.0, 2.0, 3.0]]),
    ),
)


#: Lessons computed by :mod:`attnlab.explain.lessons` (no Q, K, V of their own): name -> title and source.
LESSONS: dict[str, Example] = _by_name(
    Example("variance", "Why 1/sqrt(d_k): the variance of q·k grows with d_k; the scale restores it", "001 §4.1"),
    Example("overflow", "Stable softmax: e^1000 overflows unless the row max is subtracted first", "001 §6"),
    Example("fp16-mask", "Additive masks and dtypes: -1e9 is fine in float32 and becomes -inf in float16", "001 §7"),
    Example("self-test", "Self-test: add 100 to every legal score; then a different bias per column", "000, self-test"),
    Example(
        "multi-head",
        "Multi-head: split -> per-head attention -> concat -> W_O, with the shapes",
        "001 §10-§11; 000",
    ),
    Example("dropout", "Dropout on the weights: after inverted dropout the rows no longer sum to 1", "001 §18"),
    Example(
        "growth",
        "T² growth: 1,024 -> 4,096 tokens is 4x the length and 16x the score elements",
        "000; 001 §13, §19",
    ),
    Example(
        "complexity", "Cost: projections O(B n d²), scores O(B n² d), memory O(B h n²), the KV cache", "001 §13-§15"
    ),
    Example("leak-test", "Leak test: change a future token; a causal output must not move", "001 §17.3, §20"),
    Example(
        "mask-not-access",
        "A mask is not access control: b never attends to the secret, yet reads it through a in a second layer",
        "001 §17.5, §21",
    ),
    Example(
        "long-context",
        "Long context: doubling n is 4x the score elements; a window, MQA/GQA and the KV cache grow otherwise",
        "001 §19",
    ),
    Example("invariants", "The six invariants of every attention implementation, each with its number", "001 §21"),
)


#: d_k values of the variance experiment (001 §4.1): 2 and 8, the articles' d_head 64, their d_model 512.
VARIANCE_DK: tuple[int, ...] = (2, 8, 64, 512)


@dataclass(frozen=True)
class MultiHeadLessonData:
    """The multi-head lesson's numbers: ``x [n, d_model]`` and the ``x @ W`` weights of 2 heads of width 2.

    ``shapes`` is the articles' layer (000: d_model 512, 8 heads of 64) whose shape chain the lesson writes out.
    """

    x: np.ndarray
    w_q: np.ndarray
    w_k: np.ndarray
    w_v: np.ndarray
    w_o: np.ndarray
    heads: int
    shapes: tuple[int, int, int, int] = (1, 4, 512, 8)  # B, n, d_model, h


#: The multi-head lesson's inputs and weights (``attnlab explain multi-head``).
MULTI_HEAD = MultiHeadLessonData(
    x=_a([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]]),
    w_q=_a(np.eye(4)),
    w_k=_a([[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]]),
    w_v=_a(np.diag([10.0, 10.0, 1.0, 1.0])),
    w_o=_a([[1.0, 0, 1, 0], [0, 1, 0, 1], [1, 0, -1, 0], [0, 1, 0, -1]]),
    heads=2,
)


@dataclass(frozen=True)
class Item:
    """One item of the articles (a worked number, experiment, trap or self-test question) and the
    ``attnlab explain`` command that reproduces it: ``argv`` (after ``attnlab explain``) prints every string of
    ``expect`` (the article's number as attnlab writes it). ``lab`` names the lab preset for the same item (the
    example or lesson name; the lab wires its presets by these names). Each expect holds numbers, or is written the
    same in every language (a mask picture, a name): the lab finds it in the Chinese output by its numbers
    (:func:`attnlab.lab.presets.expect_spans`)."""

    source: str
    section: str
    what: str
    argv: tuple[str, ...]
    expect: tuple[str, ...]
    lab: str = ""


def _i(source: str, section: str, what: str, argv: str, *expect: str) -> Item:
    args = tuple(argv.split())
    return Item(source, section, what, args, expect, args[0] if args and not args[0].startswith("-") else "")


#: Every item of both articles, in article order, with the command that shows its numbers (docs/learn.md's table).
ITEMS: tuple[Item, ...] = (
    _i(
        "000",
        "one row by hand",
        "q = [1, 0]: scores [0.707, 0], exp [2.028, 1], weights [0.670, 0.330], output [6.70, 6.60]",
        "one-query",
        "exp = [2.0281, 1]",
        "q0  0.6698  0.3302",
        "= [6.6976, 6.6048]",
    ),
    _i(
        "000",
        "notebook",
        "v0 = [100, 0]: the weights stay, the output changes",
        "one-query-v100",
        "q0  0.6698  0.3302",
        "= [66.9762, 6.6048]",
    ),
    _i(
        "000",
        "one decoding query, causal",
        "a query that sees every earlier key (n_q = 1 < n_k = 2, bottom-right)",
        "one-query --causal",
        "bottom_right",
        "q0  0.6698  0.3302",
    ),
    _i(
        "000",
        "causality",
        "four positions: row i has i + 1 legal keys",
        "causal-4",
        "■ ■ ⬚ ⬚",
        "q0       1       0       0       0",
    ),
    _i(
        "000",
        "trap: all-masked row",
        "a row with no legal key: 0/0 = NaN",
        "all-masked",
        "row q0: sum of weights = nan",
    ),
    _i(
        "000",
        "trap: True = allow vs True = block",
        "the same mask read the other way: the future leaks",
        "2x2-causal --mistake inverted-mask",
        "right 1, 1; wrong 1, nan",
    ),
    _i(
        "000",
        "multi-head",
        "d_model 512, 8 heads of 64: split, attend, concat, W_O",
        "multi-head",
        "[1, 8, 4, 64]",
        "[1, 4, 512]",
    ),
    _i(
        "000", "T² growth", "1,024 -> 4,096 tokens: 16x the elements", "growth", "1,048,576 -> 16,777,216 elements, 16x"
    ),
    _i(
        "000",
        "experiment: +10 on every legal score",
        "predict, then run: the weights stay",
        "causal-4 --shift 10",
        "q3  0.5388   0.131  0.2657  0.0646",
    ),
    _i(
        "000",
        "experiment: raise the temperature",
        "rows flatten over the legal keys; the first row stays [1, 0, 0, 0]",
        "causal-4 --temperature 3",
        "q0       1       0       0       0",
        "x / T = x / 3",
    ),
    _i(
        "000",
        "experiment: mask off",
        "the same four Q/K pairs without the causal mask",
        "causal-4 --no-causal",
        "q0  0.3655  0.1802  0.3655  0.0889",
    ),
    _i("000", "why sqrt(d_k)", "the variance of q·k grows with d_k", "variance", "d_k=512: Var(q·k) ="),
    _i(
        "000",
        "FlashAttention",
        "exact attention in key blocks with a running max and sum",
        "causal-4 --tiled 2",
        "[1.7328, 0.7362] / 1.8561 = [0.9336, 0.3966]",
    ),
    _i(
        "000",
        "self-test",
        "+100 on every legal score: no change; a bias per column: a change",
        "self-test",
        "+100 on every legal score",
        "A different bias per column: b = [0, 1, 2, 3]",
    ),
    _i(
        "000",
        "self-test, second half",
        "a different bias per column, on your own command line",
        "causal-4 --bias 0,1,2,3",
        "b = [0, 1, 2, 3]",
        "q1  0.1535  0.8465       0       0",
    ),
    _i("001", "§1", "o = 0.6 v1 + 0.3 v2 + 0.1 v3 = [6.5, 3.5]", "weighted-average", "= [6.5, 3.5]"),
    _i(
        "001",
        "§2.1-§2.2, §8",
        "self vs cross attention: A is [n_q, n_k] = [2, 3]",
        "cross",
        "K [n_k=3, d_k=2]",
        "n_q=2 != n_k=3",
    ),
    _i(
        "001",
        "§3, §3.1",
        "a dot product is not a probability: scores [2, -2, 0], row sum 0",
        "dot-product",
        "q0   2  -2   0",
        "row q0: sum of scores = 0",
    ),
    _i("001", "§4.1", "Var(q·k) ≈ d_k, Var(q·k / sqrt(d_k)) ≈ 1", "variance", "d_k=64: Var(q·k) ="),
    _i(
        "001",
        "§4.2",
        "softmax([1, 2]) = [0.269, 0.731]; softmax([10, 20]) = [0.000045, 0.999955]",
        "saturation",
        "0.2689    0.7311",
        "0.000045  0.999955",
    ),
    _i(
        "001",
        "§5",
        "the 2×2 example: A = [[0.6698, 0.3302], [0.3302, 0.6698]], O = [[6.698, 6.604], [3.302, 13.396]]",
        "2x2",
        "q0  0.6698  0.3302",
        "= [3.3024, 13.3952]",
    ),
    _i("001", "§6", "e^1000 overflows without the max", "overflow", "exp(1000) = inf", "0.7311  0.2689"),
    _i("001", "§7", "-1e9 in float32 and float16", "fp16-mask", "float16 -inf  <- overflow"),
    _i(
        "001",
        "§7.1, §17.4",
        "padding masks keys; the PAD query still has an output",
        "padding",
        "PAD  0.6667  0.6667",
    ),
    _i("001", "§7.2", "the causal allow matrix C for length 4", "causal-4", "■ ■ ■ ⬚"),
    _i(
        "001",
        "§7.3, §12",
        "the 2×2 example with the causal mask: A = [[1, 0], [0.3302, 0.6698]], O = [[10, 0], [3.302, 13.396]]",
        "2x2-causal",
        "q1  0.3302  0.6698",
        "o[q0] = 1×[10, 0] = [10, 0]",
    ),
    _i(
        "001",
        "§7.4",
        "softmax then mask: row sum 0.269",
        "mask-order --mistake softmax-then-mask",
        "right 1; wrong 0.2689",
    ),
    _i("001", "§7.5", "a fully masked row is 0/0 = NaN", "all-masked", "q0     nan     nan"),
    _i(
        "001",
        "§9",
        "the backward: dV = Aᵀ G_O, dA = G_O Vᵀ, dS, dQ, dK",
        "2x2 --backward",
        "dS[q0,k0] = 0.6698×(10 - 13.3024) = -2.2118",
        "q0  -1.564  1.564",
    ),
    _i(
        "001",
        "§10-§11",
        "multi-head split -> concat -> W_O with the shapes",
        "multi-head",
        "d_head = d_model / h = 512 / 8 = 64",
    ),
    _i(
        "001",
        "§10.2",
        "sqrt(d_model) instead of sqrt(d_head)",
        "2x2 --mistake sqrt-d-model",
        "dividing by sqrt(16) instead of sqrt(2)",
    ),
    _i(
        "001",
        "§13, §15",
        "projections vs scores, heads at a fixed d_model",
        "complexity",
        "the n² term overtakes the projections at n ≈ 1024",
    ),
    _i("001", "§13.4", "FlashAttention's online softmax by hand", "2x2 --tiled 1", "α = exp(0 - 0.7071) = 0.4931"),
    _i("001", "§14", "the KV cache size formula", "complexity", "= 512 MiB (GQA, 8 KV heads)"),
    _i("001", "§16", "permutation equivariance; RoPE breaks it", "--positions", "RoPE"),
    _i(
        "001",
        "§17.1",
        "no 1/sqrt(d_k)",
        "causal-4 --mistake no-scale",
        "without the scale the logits are 1.4142× larger",
    ),
    _i(
        "001",
        "§17.2",
        "softmax over the wrong axis (visible on causal-4)",
        "causal-4 --mistake query-axis",
        "each KEY's column sums to 1",
    ),
    _i("001", "§17.2", "... and invisible on the symmetric 2×2", "2x2 --mistake query-axis", "right 1, 1; wrong 1, 1"),
    _i("001", "§17.3, §20", "the leak test: change a future token", "leak-test", "q0 moves 0 under the causal mask"),
    _i(
        "001",
        "§17.5",
        "a mask is not access control: the secret reaches b through a",
        "mask-not-access",
        "b's weight on the secret: 0",
        "b moves 0 after one layer and 10.7967 after two",
    ),
    _i(
        "001",
        "§18",
        "dropout: the row sums after inverted dropout",
        "dropout",
        "row q3: sum = 1.6089",
        "row q0: sum = 2",
    ),
    _i(
        "001",
        "§19",
        "long context: doubling n, window, MQA/GQA, KV cache",
        "long-context",
        "4,096 -> 8,192: 4x the score elements",
        "2.1427x with a window of 1,024 keys",
        "GQA (8 KV heads) 4x smaller, MQA 32x",
    ),
    _i(
        "001",
        "§21",
        "the six invariants, each with its number",
        "invariants",
        "shape(Q Kᵀ) = [n_q, n_k] = [2, 3]",
        "valid rows sum to 1: 1, 1",
        "attnlab.invariants.check: 0 violations",
    ),
)


def items_table() -> str:
    """:data:`ITEMS` as the markdown table of docs/learn.md (article section -> command -> lab preset)."""
    rows = ["| article | item | command | it prints | lab preset |", "|---|---|---|---|---|"]
    for it in ITEMS:
        cmd = " ".join(("attnlab explain", *it.argv))
        shown = "<br>".join(f"`{e.strip()}`" for e in it.expect)
        rows.append(f"| {it.source} {it.section} | {it.what} | `{cmd}` | {shown} | {it.lab or '—'} |")
    return "\n".join(rows) + "\n"


def example(name: str) -> Example:
    """The worked example or lesson called ``name`` (``EXAMPLES``, ``EXTRA_EXAMPLES``, ``LESSONS``), with the names
    on a typo."""
    for table in (EXAMPLES, EXTRA_EXAMPLES, LESSONS):
        if name in table:
            return table[name]
    names = ", ".join([*EXAMPLES, *EXTRA_EXAMPLES, *LESSONS])
    raise KeyError(f"no worked example {name!r}; choose one of {names}")
