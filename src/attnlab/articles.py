"""The worked examples of the two articles attnlab grew from, as data (used by the demo, ``explain`` and tests).

Sources: ``000`` is "Compute attention by hand: Q, K, V and the causal mask"; ``001`` is "Attention maths in
detail". Each example keeps the article's inputs exactly; the numbers the articles print are in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["EXAMPLES", "EXTRA_EXAMPLES", "Example", "example"]


@dataclass(frozen=True)
class Example:
    """One worked example: q ``[n_q, d_k]``, k ``[n_k, d_k]``, v ``[n_k, d_v]`` and how it is computed.

    ``weights`` is set for the one example that starts from given weights (the weighted average); ``logits`` for
    the one about softmax alone (saturation). ``mask`` (bool ``[n_q, n_k]``, True = may attend) and ``scale``
    (``None`` = 1/sqrt(d_k)) are set where the article fixes them.
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


def _a(x) -> np.ndarray:
    a = np.asarray(x)
    a.setflags(write=False)
    return a


_I2 = [[1, 0], [0, 1]]
_V2 = [[10, 0], [0, 20]]

EXAMPLES: dict[str, Example] = {
    e.name: e
    for e in (
        Example(
            "weighted-average",
            "Attention is a weighted average: 0.6 v1 + 0.3 v2 + 0.1 v3",
            "001 §1",
            v=_a([[10, 0], [0, 10], [5, 5]]),
            weights=_a([[0.6, 0.3, 0.1]]),
        ),
        Example(
            "one-query",
            "One query [1, 0] against keys [1, 0] and [0, 1]",
            "000, 'compute one row by hand'",
            q=_a([[1, 0]]),
            k=_a(_I2),
            v=_a(_V2),
        ),
        Example("2x2", "The 2×2 example: Q = K = I, V = [[10, 0], [0, 20]]", "001 §5", q=_a(_I2), k=_a(_I2), v=_a(_V2)),
        Example(
            "2x2-causal",
            "The 2×2 example with the causal mask",
            "001 §8",
            q=_a(_I2),
            k=_a(_I2),
            v=_a(_V2),
            causal=True,
        ),
        Example(
            "causal-4",
            "Four positions under the causal mask: row i has i + 1 legal keys",
            "000, 'causality is an information boundary'",
            q=_a([[1, 0], [0, 1], [1, 1], [1, -1]]),
            k=_a([[1, 0], [0, 1], [1, 1], [-1, 1]]),
            v=_a([[1, 0], [0, 1], [1, 1], [2, 0]]),
            causal=True,
        ),
        Example(
            "saturation",
            "Why scale: softmax([1, 2]) vs softmax([10, 20])",
            "001 §4.2",
            logits=(_a([1.0, 2.0]), _a([10.0, 20.0])),
        ),
    )
}


#: Further worked numbers the articles use to make a point (kept apart from the six lesson examples above).
EXTRA_EXAMPLES: dict[str, Example] = {
    e.name: e
    for e in (
        Example(
            "mask-order",
            "Mask before softmax: scores [1, 2] with the second key masked",
            "001 §7.4",
            q=_a([[1]]),
            k=_a([[1], [2]]),
            v=_a(_V2),
            mask=_a([[True, False]]),
            scale=1.0,
        ),
    )
}


def example(name: str) -> Example:
    """The worked example called ``name`` (in ``EXAMPLES`` or ``EXTRA_EXAMPLES``), with the names on a typo."""
    if name in EXAMPLES:
        return EXAMPLES[name]
    if name in EXTRA_EXAMPLES:
        return EXTRA_EXAMPLES[name]
    names = ", ".join([*EXAMPLES, *EXTRA_EXAMPLES])
    raise KeyError(f"no worked example {name!r}; choose one of {names}")
