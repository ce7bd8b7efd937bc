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
from ..validate import check_int
from .args import MISTAKE_NAMES
from .fmt import num, vec
from .i18n import check_lang, tr
from .steps import Setup

__all__ = ["MISTAKES", "Mistake", "compare"]

#: name -> one-line title of each classic mistake.
MISTAKES: dict[str, str] = {n: tr(f"mistake.{n}") for n in MISTAKE_NAMES}


@dataclass(frozen=True)
class Mistake:
    """A mistake next to the right computation.

    Shapes: ``right_weights``/``wrong_weights`` ``[n_q, n_k]``, ``right_output``/``wrong_output`` ``[n_q, d_v]``,
    ``wrong_row_sums [n_q]``. ``wrong_allowed`` is the mask the mistaken code applied (for ``inverted-mask``).
    ``explanation`` says, with these numbers, what went wrong and how to see it; ``title`` and ``explanation``
    are in ``lang``.
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
    lang: str = "en"

    @property
    def max_weight_diff(self) -> float:
        """Largest |wrong - right| weight (NaN if the mistake produced NaN)."""
        return float(np.max(np.abs(self.wrong_weights - self.right_weights)))

    @property
    def max_output_diff(self) -> float:
        """The largest absolute difference between the mistaken and the right output."""
        return float(np.max(np.abs(self.wrong_output - self.right_output)))


def _rows(sums: np.ndarray) -> str:
    return vec(sums)


def compare(setup: Setup, name: str, *, heads: int = 8, lang: str = "en") -> Mistake:
    """Run ``setup`` right and with the mistake ``name`` (a key of :data:`MISTAKES`).

    Args:
        setup: the problem (one head, q ``[n_q, d_k]``, k ``[n_k, d_k]``, v ``[n_k, d_v]``).
        name: which mistake.
        heads: for ``sqrt-d-model``: d_model = heads · d_k (the article: 8 heads of 64 in d_model = 512).
        lang: "en" or "zh", the language of the title and explanation.

    Raises:
        KeyError: unknown ``name`` (the message lists the mistakes).
    """
    if name not in MISTAKES:
        raise KeyError(f"mistake: no mistake {name!r}; choose one of {', '.join(MISTAKES)}")
    heads = check_int("heads", heads, minimum=1)
    lang = check_lang(lang)
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
            text = tr("mistake.stm.nothing", lang)
        else:
            low = int(np.argmin(sums))
            text = tr("mistake.stm.text", lang, sums=_rows(sums), r=setup.qlabels[low], s=num(sums[low]))
    elif name == "no-scale":
        t = setup.trace(scale=1.0, masked_rows="zero")
        ww, wo = np.asarray(t.weights), np.asarray(t.output)
        sums = ww.sum(axis=-1)
        factor = 1.0 / right.scale
        text = tr(
            "mistake.noscale.text", lang, f=num(factor), d=setup.d_k, a=vec(rw.max(axis=-1)), b=vec(ww.max(axis=-1))
        )
    elif name == "sqrt-d-model":
        d_model = heads * setup.d_k
        t = setup.trace(scale=1.0 / math.sqrt(d_model), masked_rows="zero")
        ww, wo = np.asarray(t.weights), np.asarray(t.output)
        sums = ww.sum(axis=-1)
        text = tr(
            "mistake.dmodel.text",
            lang,
            h=heads,
            d=setup.d_k,
            dm=d_model,
            f=num(math.sqrt(heads)),
            a=vec(rw.max(axis=-1)),
            b=vec(ww.max(axis=-1)),
        )
    elif name == "query-axis":
        logits = np.asarray(right.logits)
        wt, _, _ = masked_softmax(logits.T, allowed.T)  # softmax down each column
        ww = np.asarray(wt).T  # [n_q, n_k]
        wo = ww @ v
        sums = ww.sum(axis=-1)
        text = tr("mistake.axis.text", lang, sums=_rows(sums))
        if ww.shape == rw.shape and np.allclose(ww, rw, atol=1e-12):
            text += " " + tr("mistake.axis.symmetric", lang)
    else:  # inverted-mask
        wrong_allowed = ~allowed
        t = setup.trace(mask=wrong_allowed, causal=False, masked_rows="nan")
        ww = np.asarray(t.weights)
        wo = ww @ v
        sums = ww.sum(axis=-1)
        nan_rows = [setup.qlabels[i] for i in range(ww.shape[0]) if np.isnan(ww[i]).any()]
        if allowed.all():
            text = tr("mistake.inv.all", lang)
        else:
            text = (
                tr("mistake.inv.text", lang)
                + (tr("mistake.inv.leak", lang) if setup.causal else "")
                + (tr("mistake.inv.nan", lang, rows=", ".join(map(str, nan_rows))) if nan_rows else "")
                + tr("mistake.inv.check", lang)
            )
    return Mistake(
        name=name,
        title=tr(f"mistake.{name}", lang),
        right_weights=rw,
        wrong_weights=ww,
        right_output=ro,
        wrong_output=wo,
        wrong_row_sums=sums,
        explanation=text,
        wrong_allowed=wrong_allowed,
        lang=lang,
    )
