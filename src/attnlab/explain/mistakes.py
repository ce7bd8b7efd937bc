"""The classic attention mistakes, computed next to the right answer (article 001 §7.4, §10.2, §17).

Each mistake is run through attnlab's core with the one thing changed that the mistake changes, so the difference
is exactly the mistake's. The article's own example of softmax-then-mask:

>>> from attnlab.explain import setup_from_example
>>> m = compare(setup_from_example("mask-order"), "softmax-then-mask")
>>> m.wrong_weights.round(3).tolist(), m.wrong_weights.sum().round(3)
([[0.269, 0.0]], np.float64(0.269))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core import masked_softmax
from .fmt import num, vec
from .steps import Setup

__all__ = ["MISTAKES", "Mistake", "compare"]

#: name -> one-line title of each classic mistake.
MISTAKES: dict[str, str] = {
    "softmax-then-mask": "softmax first, then zero the masked weights (no renormalisation)",
    "no-scale": "forgetting to divide the scores by sqrt(d_k)",
    "sqrt-d-model": "dividing by sqrt(d_model) instead of sqrt(d_head) in multi-head attention",
    "query-axis": "softmax over the query axis (columns) instead of the key axis (rows)",
    "inverted-mask": "a True = may-attend mask given to code where True means blocked",
}


@dataclass(frozen=True)
class Mistake:
    """A mistake next to the right computation.

    Shapes: ``right_weights``/``wrong_weights`` ``[n_q, n_k]``, ``right_output``/``wrong_output`` ``[n_q, d_v]``,
    ``wrong_row_sums [n_q]``. ``wrong_allowed`` is the mask the mistaken code applied (for ``inverted-mask``).
    ``explanation`` says, with these numbers, what went wrong and how to see it.
    """

    name: str
    title: str
    right_weights: np.ndarray
    wrong_weights: np.ndarray
    right_output: np.ndarray
    wrong_output: np.ndarray
    wrong_row_sums: np.ndarray
    explanation: str
    wrong_allowed: np.ndarray | None = None

    @property
    def max_weight_diff(self) -> float:
        """Largest |wrong - right| weight (NaN if the mistake produced NaN)."""
        return float(np.max(np.abs(self.wrong_weights - self.right_weights)))

    @property
    def max_output_diff(self) -> float:
        return float(np.max(np.abs(self.wrong_output - self.right_output)))


def _rows(sums: np.ndarray) -> str:
    return vec(sums)


def compare(setup: Setup, name: str, *, heads: int = 8) -> Mistake:
    """Run ``setup`` right and with the mistake ``name`` (a key of :data:`MISTAKES`).

    Args:
        setup: the problem (one head, q ``[n_q, d_k]``, k ``[n_k, d_k]``, v ``[n_k, d_v]``).
        name: which mistake.
        heads: for ``sqrt-d-model``: d_model = heads · d_k (the article: 8 heads of 64 in d_model = 512).

    Raises:
        KeyError: unknown ``name`` (the message lists the mistakes).
    """
    if name not in MISTAKES:
        raise KeyError(f"mistake: no mistake {name!r}; choose one of {', '.join(MISTAKES)}")
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise ValueError(f"heads: expected an int >= 1, got {heads!r}")
    right = setup.trace(masked_rows="zero")
    rw, ro = np.asarray(right.weights), np.asarray(right.output)
    allowed = np.asarray(right.allowed)
    v = np.asarray(right.v)
    wrong_allowed = None
    if name == "softmax-then-mask":
        free = setup.trace(mask=None, causal=False)
        ww = np.asarray(free.weights) * allowed  # [n_q, n_k]: softmax over every key, then zero the masked ones
        wo = ww @ v
        sums = ww.sum(axis=-1)
        if allowed.all():
            text = (
                "Nothing is masked here, so the order does not matter yet; add a mask (--causal, --padding) to see "
                "the row sums fall below 1."
            )
        else:
            low = int(np.argmin(sums))
            text = (
                f"softmax ran over every key, masked ones included, and the masked weights were zeroed afterwards: "
                f"the row sums are {_rows(sums)} instead of 1 (row {setup.qlabels[low]}: {num(sums[low])}). "
                f"The result is no longer a "
                f"probability distribution and the masked keys still steered the legal weights. Mask first "
                f"(-inf before softmax), so softmax renormalises over the legal keys only."
            )
    elif name == "no-scale":
        t = setup.trace(scale=1.0, masked_rows="zero")
        ww, wo = np.asarray(t.weights), np.asarray(t.output)
        sums = ww.sum(axis=-1)
        factor = 1.0 / right.scale
        text = (
            f"without the scale the logits are {num(factor)}× larger (sqrt(d_k) = sqrt({setup.d_k})), so the "
            f"weights are sharper: the largest weight per row goes from {vec(rw.max(axis=-1))} to "
            f"{vec(ww.max(axis=-1))}. With large d_k softmax saturates toward one-hot and its gradients vanish."
        )
    elif name == "sqrt-d-model":
        d_model = heads * setup.d_k
        t = setup.trace(scale=1.0 / math.sqrt(d_model), masked_rows="zero")
        ww, wo = np.asarray(t.weights), np.asarray(t.output)
        sums = ww.sum(axis=-1)
        text = (
            f"with {heads} heads of d_head = {setup.d_k}, d_model = {d_model}; dividing by sqrt({d_model}) instead "
            f"of sqrt({setup.d_k}) makes every logit sqrt({heads}) = {num(math.sqrt(heads))}× too small, "
            f"so the weights "
            f"are flatter: the largest weight per row goes from {vec(rw.max(axis=-1))} to {vec(ww.max(axis=-1))}. "
            f"Each head attends in its own d_head-dim space: scale by 1/sqrt(d_head)."
        )
    elif name == "query-axis":
        logits = np.asarray(right.logits)
        wt, _, _ = masked_softmax(logits.T, allowed.T)  # softmax down each column
        ww = np.asarray(wt).T  # [n_q, n_k]
        wo = ww @ v
        sums = ww.sum(axis=-1)
        text = (
            f"softmax ran down each column (over the queries), so each KEY's column sums to 1 and the query rows sum "
            f"to {_rows(sums)}. That measures how much each key is read by different queries, not where each query "
            f"reads from. Check: weights.sum(axis=-1) must be 1 on every legal row."
        )
    else:  # inverted-mask
        wrong_allowed = ~allowed
        t = setup.trace(mask=wrong_allowed, causal=False, masked_rows="nan")
        ww = np.asarray(t.weights)
        wo = ww @ v
        sums = ww.sum(axis=-1)
        nan_rows = [setup.qlabels[i] for i in range(ww.shape[0]) if np.isnan(ww[i]).any()]
        if allowed.all():
            text = (
                "every key was allowed, so read as True = blocked the mask blocks everything: every row is 0/0 = NaN. "
                "Convert conventions at the edge (attnlab.masks.from_blocked / to_blocked), never by guessing."
            )
        else:
            text = (
                "the mask was read with the opposite meaning: each query now reads exactly the keys it must not see"
                + (" (the future, under a causal mask: a leak)" if setup.causal else "")
                + (
                    f", and row(s) {', '.join(map(str, nan_rows))} are left with no key at all: 0/0 = NaN"
                    if nan_rows
                    else ""
                )
                + ". Check which convention a library uses (PyTorch SDPA bool: True = attend; nn.MultiheadAttention: "
                "True = blocked) and convert with attnlab.masks.from_blocked."
            )
    return Mistake(
        name=name,
        title=MISTAKES[name],
        right_weights=rw,
        wrong_weights=ww,
        right_output=ro,
        wrong_output=wo,
        wrong_row_sums=sums,
        explanation=text,
        wrong_allowed=wrong_allowed,
    )
