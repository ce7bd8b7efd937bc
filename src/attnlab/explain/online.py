"""FlashAttention's online softmax by hand (article 001, tiling + online softmax): the keys in blocks, and per query a
running maximum ``m``, a running sum ``l`` and an accumulator ``acc`` that are rescaled whenever a larger score
arrives; one division at the end. Every number is checked against the dense computation of the same setup.

This is the recurrence :func:`attnlab.flash_attention` runs on 512×512 blocks, written out for matrices small
enough to follow (one head; every query row at once).

>>> from attnlab.explain import setup_from_example
>>> e = explain_online(setup_from_example("2x2"), block_k=1)
>>> [s.key for s in e.steps]
['blocks', 'block0', 'block1', 'normalize']
>>> e.step("block1").lines[1].split("; ")[:2]  # query 1 meets its larger score in the second block
['q1: m = max(0, 0.7071) = 0.7071', 'α = exp(0 - 0.7071) = 0.4931']
>>> e.output.round(4).tolist()
[[6.6976, 6.6048], [3.3024, 13.3952]]
"""

from __future__ import annotations

import numpy as np

from ..validate import check_int
from .fmt import num, vec
from .i18n import check_lang, tr
from .steps import MAX_WRITTEN, Explanation, Setup, Step

__all__ = ["explain_online"]

#: How many terms of ``P V_b`` are written out per row before "…".
_MAX_TERMS = 4


def _check_block(block_k: object) -> int:
    return check_int("block_k", block_k, minimum=1)


def _pv_terms(p: np.ndarray, v: np.ndarray) -> str:
    js = np.flatnonzero(p)
    if js.size == 0:
        return "0"
    terms = [f"{num(p[j])}×{vec(v[j])}" for j in js[:_MAX_TERMS]]
    return " + ".join(terms) + (" + …" if js.size > _MAX_TERMS else "")


def explain_online(setup: Setup, block_k: int, *, lang: str = "en") -> Explanation:
    """The online softmax of ``setup`` with the keys in blocks of ``block_k``, step by step.

    Steps: ``blocks`` (the logits, cut into key blocks), one ``block{b}`` per key block (the block's
    ``P = exp(S_b - m')`` and the running ``m``, ``l``, ``acc`` after it), ``normalize`` (``O = acc / l``,
    ``lse = m + log l``, compared with the dense output and log-sum-exp). Fully masked rows follow the setup's
    ``masked_rows`` policy, as in the core.
    """
    block_k = _check_block(block_k)
    lang = check_lang(lang)
    t = setup.trace()  # raises for fully masked rows under masked_rows="raise"
    logits = np.asarray(t.logits, dtype=np.float64)  # [n_q, n_k], -inf where masked
    v = np.asarray(t.v, dtype=np.float64)  # [n_k, d_v]
    ql, kl = setup.qlabels, setup.klabels
    n_q, n_k, d_v = logits.shape[0], logits.shape[1], v.shape[1]
    dcols = tuple(f"d{c}" for c in range(d_v))
    starts = list(range(0, n_k, block_k))
    shown = ql[:MAX_WRITTEN]
    cuts = " | ".join(f"{kl[j0]}..{kl[min(j0 + block_k, n_k) - 1]}" for j0 in starts)
    steps = [
        Step(
            "blocks",
            tr("online.blocks.title", lang, n=len(starts), b=block_k),
            cuts,
            logits,
            ql,
            kl,
            (),
            tr("online.blocks.note", lang),
        )
    ]
    m = np.full(n_q, -np.inf)  # running max
    l = np.zeros(n_q)  # running sum of exp(x - m)
    acc = np.zeros((n_q, d_v))  # running sum of exp(x - m) v
    for b, j0 in enumerate(starts):
        j1 = min(j0 + block_k, n_k)
        s = logits[:, j0:j1]  # [n_q, bk]
        block_max = s.max(axis=1)
        m_new = np.maximum(m, block_max)
        seen = np.isfinite(m_new)  # some legal key so far
        base = np.where(seen, m_new, 0.0)
        alpha = np.where(np.isfinite(m), np.exp(m - base), 0.0)  # nothing to rescale before the first legal key
        p = np.where(np.isfinite(s), np.exp(s - base[:, None]), 0.0)  # [n_q, bk], exactly 0 where masked
        l_new = alpha * l + p.sum(axis=1)
        acc_new = alpha[:, None] * acc + p @ v[j0:j1]
        lines = []
        for i, r in enumerate(shown):
            if not seen[i]:
                lines.append(tr("online.none_yet", lang, r=r))
                continue
            lines.append(
                f"{r}: m = max({num(m[i])}, {num(block_max[i])}) = {num(m_new[i])}; "
                f"α = exp({num(m[i])} - {num(m_new[i])}) = {num(alpha[i])}; "
                f"l = {num(alpha[i])}×{num(l[i])} + {' + '.join(num(x) for x in p[i][:_MAX_TERMS])}"
                f"{' + …' if p.shape[1] > _MAX_TERMS else ''} = {num(l_new[i])}; "
                f"acc = {num(alpha[i])}×{vec(acc[i])} + {_pv_terms(p[i], v[j0:j1])} = {vec(acc_new[i])}"
            )
        rescaled = [r for r, a in zip(ql, alpha, strict=True) if 0 < a < 1]
        if b == 0:
            note = tr("online.first", lang)
        elif rescaled:
            note = tr("online.rescaled", lang, rows=", ".join(rescaled))
        else:
            note = tr("online.same", lang)
        blind = [r for r, x, y in zip(ql, np.asarray(np.isfinite(s).any(axis=1)), seen, strict=True) if y and not x]
        if blind:
            note += " " + tr("online.blind", lang, rows=", ".join(blind))
        steps.append(
            Step(
                f"block{b}",
                tr("online.block.title", lang, b=b, a=kl[j0], z=kl[j1 - 1]),
                "m' = max(m, rowmax S_b);  α = exp(m - m');  P = exp(S_b - m');  l' = α·l + rowsum P;  "
                "acc' = α·acc + P V_b",
                p,
                ql,
                kl[j0:j1],
                tuple(lines),
                note,
                extra=(
                    ("m", m_new[:, None], ql, ("max",)),
                    ("l", l_new[:, None], ql, (tr("label.sum", lang),)),
                    ("acc", acc_new, ql, dcols),
                ),
            )
        )
        m, l, acc = m_new, l_new, acc_new

    empty = l == 0
    out = acc / np.where(empty, 1.0, l)[:, None]
    if empty.any() and setup.masked_rows == "nan":
        out[empty] = np.nan
    lse = np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, l)))
    full = ~empty
    dense, dense_lse = np.asarray(t.output, np.float64)[full], np.asarray(t.lse, np.float64)[full]
    diff = float(np.abs(out[full] - dense).max(initial=0.0))
    diff_lse = float(np.abs(lse[full] - dense_lse).max(initial=0.0))
    if not (np.allclose(out[full], dense, rtol=1e-9, atol=1e-9) and np.allclose(lse[full], dense_lse, rtol=1e-9)):
        raise AssertionError("explain: the online softmax disagrees with attnlab.attention_trace")
    lines = [
        f"o[{r}] = {vec(acc[i])} / {num(l[i])} = {vec(out[i])};  lse = {num(m[i])} + log {num(l[i])} = {num(lse[i])}"
        if not empty[i]
        else tr("online.empty", lang, r=r, p=repr(setup.masked_rows), o=vec(out[i]))
        for i, r in enumerate(shown)
    ]
    steps.append(
        Step(
            "normalize",
            tr("online.normalize.title", lang),
            "O = acc / l;  lse = m + log l",
            out,
            ql,
            dcols,
            tuple(lines),
            tr("online.normalize.note", lang, d=f"{diff:.1e}", l=f"{diff_lse:.1e}"),
        )
    )
    return Explanation(
        title=tr(
            "online.title",
            lang,
            title=setup.title if setup.title != "Your matrices" else tr("label.your_matrices", lang),
            b=block_k,
        ),
        source=" · ".join(x for x in (setup.source, tr("online.source", lang)) if x),
        steps=tuple(steps),
        weights=None,
        output=out,
        setup=setup,
        trace=t,
        lang=lang,
    )
