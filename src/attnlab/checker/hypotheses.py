"""The hypotheses: plausible wrong implementations, each recomputing the golden output the way that bug would.

When an output differs from the float64 reference, :meth:`~attnlab.checker.probes.Battery.diagnose` recomputes the
case under every registered hypothesis, in registration order, and names the first one the output matches (to the
case's tolerance, and at least 10x closer than to the reference). A hypothesis is a small function of a
:class:`Context` (the case, its scores, its allowed mask and the function's own output, from which a free
parameter such as a fill value may be fitted) that returns the output under that bug, or None when it does not
apply to the case; it is registered with its finding code and a message (a template over :meth:`Context.words`
and the words the function returns).

Two bugs at once (a wrong scale, a softmax over the queries or a scale after the softmax, together with a mask
read wrongly, ignored or applied after the softmax) are hypotheses of their own, coded ``"a+b"``: each of the two
is then reported as a finding. ``precision`` is not a hypothesis here: it is the tolerance rule of a lower
precision, tried by :meth:`~attnlab.checker.probes.Battery.lower_precision` when no hypothesis explains the output.

>>> [h.code for h in HYPOTHESES][:3]
['scale-missing', 'scale-wrong', 'scale-wrong']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import numpy as np

from .. import masks as _masks
from .cases import softmax
from .runner import Case
from .tolerance import expand_kv

__all__ = ["FILLS", "HYPOTHESES", "Context", "Hypothesis", "hypothesis", "outputs"]

#: Finite fill values of the blocked scores tried by the ``finite-fill`` hypotheses (at ordinary score sizes only
#: the small ones change the output; the padding probe's large-score case catches the others).
FILLS = (0.0, -1.0, -2.0, -5.0, -10.0, -20.0, -50.0, -100.0, -1e3, -1e4)

_GQA_SAID = {"tile": "i mod h_kv (tile / repeat)", "interleave": "i // (h_q / h_kv) (repeat_interleave)"}


@dataclass(frozen=True)
class Context:
    """A mismatching case, ready for the hypotheses.

    Shapes: ``q [..., h, n_q, d_k]``; ``k``, ``v`` expanded to q's heads with the declared GQA mapping;
    ``allowed [..., h, n_q, n_k]`` (the user mask AND the causal part); ``scores = q kᵀ`` (unscaled);
    ``out`` the function's output ``[..., h, n_q, d_v]``.
    """

    case: Case
    out: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    allowed: np.ndarray
    scores: np.ndarray
    scale: float
    mask_received: bool  #: the function received a mask (the user mask, or the causal part inside it)
    causal_in_mask: bool  #: the causal part reached the function inside its mask
    alignment_received: bool  #: the causal alignment reached the function (in the mask or as a string)
    inverted_text: str
    gqa_map: str
    rows: np.ndarray = field(repr=False)  #: the query rows compared ``[..., h, n_q]``

    @classmethod
    def build(
        cls,
        case: Case,
        out: np.ndarray,
        allowed: np.ndarray,
        *,
        causal_in_mask: bool,
        alignment_received: bool,
        inverted_text: str,
        gqa_map: str,
    ) -> Context:
        """The context of one wrong output: the case, what came back, the mask applied, the expanded K and V, the
        scores and how the mask and the causal alignment reached the function."""
        q = case.q
        k, v = expand_kv(q, case.k, gqa_map), expand_kv(q, case.v, gqa_map)
        s0 = case.scale if case.scale is not None else 1 / math.sqrt(q.shape[-1])
        return cls(
            case,
            out,
            q,
            k,
            v,
            allowed,
            q @ np.swapaxes(k, -1, -2),
            s0,
            case.mask is not None or causal_in_mask,
            causal_in_mask,
            alignment_received,
            inverted_text,
            gqa_map,
            np.asarray(allowed.any(axis=-1)),
        )

    # ----------------------------------------------------------------------------------------- building blocks
    @property
    def d_k(self) -> int:
        """The query/key width."""
        return self.q.shape[-1]

    @property
    def heads(self) -> int:
        """The number of query heads (1 for 2-D inputs)."""
        return self.q.shape[-3] if self.q.ndim >= 3 else 1

    @property
    def batch(self) -> int:
        """The batch size (1 below 4-D inputs)."""
        return self.q.shape[0] if self.q.ndim == 4 else 1

    def words(self) -> dict[str, Any]:
        """The values a message template may name."""
        return {
            "d_k": self.d_k,
            "d_v": self.v.shape[-1],
            "d_model": self.heads * self.d_k,
            "scale": self.case.scale,
            "inverted": self.inverted_text[len("your function ") :],
            "inverted_text": self.inverted_text,
            "declared_gqa": self.gqa_map,
        }

    def attend(self, scale: float | None = None, allowed: np.ndarray | None = None, *, v: Any = None) -> np.ndarray:
        """softmax(scores · scale, masked where not ``allowed``) @ v (defaults: the case's scale, mask and V)."""
        lg = self.scores * (self.scale if scale is None else scale)
        a = self.allowed if allowed is None else allowed
        return softmax(np.where(a, lg, -np.inf), -1) @ (self.v if v is None else v)

    def user_mask(self) -> np.ndarray:
        """The user mask alone, broadcast to ``[..., h, n_q, n_k]`` (all True without one)."""
        if self.case.mask is None:
            return np.ones(self.allowed.shape, bool)
        return np.broadcast_to(self.case.mask, self.allowed.shape)

    def causal_part(self, align: str | None = "same") -> np.ndarray:
        """The causal part ``[n_q, n_k]`` with the case's alignment (or ``align``; all True when not causal)."""
        a = self.case.causal if align == "same" else align
        n_q, n_k = self.q.shape[-2], self.k.shape[-2]
        return np.ones((n_q, n_k), bool) if a is None else _masks.causal(n_q, n_k, align=cast(_masks.Align, a))

    def inverted(self) -> np.ndarray | None:
        """The mask as a function that reads it inverted uses it (None when it received no mask)."""
        if not self.mask_received:
            return None
        if self.causal_in_mask:  # one mask, causal part included: all of it inverted
            return ~self.allowed
        return ~self.user_mask() & self.causal_part()


@dataclass(frozen=True)
class Hypothesis:
    """One registered hypothesis: its finding ``code``, its ``message`` template and the function computing the
    output under it (``compute(ctx) -> array | (array, words) | None``)."""

    code: str
    message: str
    compute: Callable[[Context], Any]


#: Every hypothesis, in the order they are tried.
HYPOTHESES: list[Hypothesis] = []


def hypothesis(code: str, message: str) -> Callable[[Callable[[Context], Any]], Callable[[Context], Any]]:
    """Register the decorated function as a hypothesis for ``code`` (``message`` names what the bug does)."""

    def register(fn: Callable[[Context], Any]) -> Callable[[Context], Any]:
        HYPOTHESES.append(Hypothesis(code, message, fn))
        return fn

    return register


def outputs(ctx: Context) -> Iterator[tuple[str, str, np.ndarray]]:
    """``(code, message, output)`` of every hypothesis that applies to ``ctx``, in registration order."""
    words = ctx.words()
    for h in HYPOTHESES:
        with np.errstate(all="ignore"):
            res = h.compute(ctx)
        if res is None:
            continue
        extra: dict[str, Any] = {}
        if isinstance(res, tuple):
            res, extra = res
        yield h.code, h.message.format(**words, **extra), res


# ---------------------------------------------------------------------------------------------------- scale
# A wrong scale is a choice of the factor the scores are multiplied by (None: the choice does not apply).
_SCALES: list[tuple[str, str, Callable[[Context], float | None]]] = [
    (
        "scale-missing",
        "your function does not scale the scores by 1/sqrt(d_k)",
        lambda c: 1.0 if c.case.scale is None else None,
    ),
    (
        "scale-wrong",
        "your function ignores the scale argument ({scale}) and uses 1/sqrt(d_k)",
        lambda c: 1 / math.sqrt(c.d_k) if c.case.scale is not None else None,
    ),
    (
        "scale-wrong",
        "your function divides by the scale argument instead of multiplying by it",
        lambda c: 1 / c.scale if c.case.scale is not None else None,
    ),
    (
        "scale-wrong",
        "your function scales the scores by 1/d_k = 1/{d_k} instead of 1/sqrt(d_k)",
        lambda c: 1 / c.d_k if c.d_k > 1 else None,
    ),
    (
        "scale-wrong",
        "your function multiplies the scores by sqrt(d_k) instead of dividing by it",
        lambda c: math.sqrt(c.d_k) if c.d_k > 1 else None,
    ),
    (
        "scale-wrong",
        "your function scales by 1/sqrt(d_model), d_model = h·d_k = {d_model}, instead of the per-head "
        "1/sqrt(d_k = {d_k})",
        lambda c: 1 / math.sqrt(c.heads * c.d_k) if c.heads > 1 else None,
    ),
    (
        "scale-wrong",
        "your function scales by 1/sqrt(d_v) = 1/sqrt({d_v}) instead of 1/sqrt(d_k)",
        lambda c: 1 / math.sqrt(c.v.shape[-1]) if c.v.shape[-1] != c.d_k else None,
    ),
]

for _code, _text, _factor in _SCALES:

    def _wrong_scale(ctx: Context, factor: Callable[[Context], float | None] = _factor) -> np.ndarray | None:
        s = factor(ctx)
        return None if s is None else ctx.attend(s)

    hypothesis(_code, _text)(_wrong_scale)


@hypothesis(
    "scale-after-softmax",
    "your function applies the scale to the weights after the softmax (the scores are not scaled)",
)
def _scale_after_softmax(ctx: Context) -> np.ndarray:
    return ctx.attend(1.0) * ctx.scale


@hypothesis("scale-after-softmax", "your function scales the scores and then the weights again after the softmax")
def _scale_twice(ctx: Context) -> np.ndarray:
    return ctx.attend() * ctx.scale


# ---------------------------------------------------------------------------------------------------- softmax axis
def _softmax_over(axes: tuple[int, ...], ctx: Context) -> np.ndarray | None:
    if any(-a > ctx.q.ndim or (a == 0 and ctx.q.ndim < 4) for a in axes):
        return None  # no such axis (axis 0 is the batch of 4-D inputs only)
    lg = np.where(ctx.allowed, ctx.scores * ctx.scale, -np.inf)
    return softmax(lg, axes) @ ctx.v


_AXES = [
    ((-2,), "the queries (axis -2) instead of the keys (axis -1)"),
    ((-3, -2), "the heads and queries flattened together (h·n_q) instead of each row's keys"),
    ((-3, -2, -1), "all the scores of a batch element flattened together (h·n_q·n_k) instead of each row's keys"),
    ((-2, -1), "the queries and keys flattened together (n_q·n_k) instead of each row's keys"),
    ((-3, -1), "the heads and keys flattened together (h·n_k) instead of each head's keys"),
    ((-3,), "the heads (axis -3) instead of the keys (axis -1)"),
    ((0, -1), "the batch and keys flattened together (B·n_k) instead of each batch element's keys"),
    ((0,), "the batch (axis 0) instead of the keys (axis -1)"),
]

for _axes, _what in _AXES:

    def _wrong_axis(ctx: Context, axes: tuple[int, ...] = _axes) -> np.ndarray | None:
        return _softmax_over(axes, ctx)

    hypothesis("softmax-axis", f"your function takes the softmax over {_what}")(_wrong_axis)


# ---------------------------------------------------------------------------------------------------- masks
@hypothesis("mask-inverted", "{inverted_text}")
def _mask_inverted(ctx: Context) -> np.ndarray | None:
    inv = ctx.inverted()
    return None if inv is None else ctx.attend(allowed=inv)


@hypothesis("padding-leak", "your function ignores the mask")
def _mask_ignored(ctx: Context) -> np.ndarray | None:
    if ctx.case.mask is None:
        return None
    return ctx.attend(allowed=np.broadcast_to(ctx.causal_part(), ctx.allowed.shape))


def _zero_keys(ctx: Context, count: np.ndarray) -> np.ndarray:
    """The output when each row attends its allowed keys and also ``count [..., h, n_q, 1]`` keys that are zero
    vectors with zero values (score 0): their weight is lost from the allowed keys, nothing is added."""
    lg = np.where(ctx.allowed, ctx.scores * ctx.scale, -np.inf)
    top = np.maximum(np.max(lg, axis=-1, keepdims=True), 0.0)  # the zero keys' score 0 takes part in the max
    e = np.where(ctx.allowed, np.exp(lg - top), 0.0)
    return (e @ ctx.v) / (e.sum(axis=-1, keepdims=True) + count * np.exp(-top))


@hypothesis(
    "padding-leak",
    "your function zeroes the blocked keys and values instead of masking their scores: each blocked key still "
    "takes the weight of a score 0",
)
def _zeroed_blocked_keys(ctx: Context) -> np.ndarray | None:
    if ctx.case.mask is None:
        return None
    zeroed = ~ctx.allowed if ctx.causal_in_mask else ctx.causal_part() & ~ctx.user_mask()  # causal: still -inf
    count = zeroed.sum(axis=-1, keepdims=True)
    return None if not count.any() else _zero_keys(ctx, count)


@hypothesis(
    "padding-leak",
    "your function pads every sequence's keys with zeros to the longest one ({longest} keys) and attends the "
    "padding without a mask: each padded key takes the weight of a score 0",
)
def _zero_padded_to_longest(ctx: Context) -> tuple[np.ndarray, dict[str, Any]] | None:
    if ctx.case.mask is None or ctx.case.causal is not None:
        return None
    lengths = ctx.allowed.sum(axis=-1, keepdims=True)
    longest = int(lengths.max(initial=0))
    pads = longest - lengths
    if longest == ctx.k.shape[-2] or not pads.any():
        return None  # the same as zeroed blocked keys, or no padding at all
    return _zero_keys(ctx, pads), {"longest": longest}


@hypothesis(
    "mask-after-softmax",
    "your function applies the mask after the softmax (multiplies the weights by it, or fills them with 0), so "
    "the weights of the allowed keys no longer sum to 1",
)
def _mask_after_softmax(ctx: Context) -> np.ndarray:
    return (softmax(ctx.scores * ctx.scale, -1) * ctx.allowed) @ ctx.v


@hypothesis("causal-leak", "your function ignores the causal mask")
def _causal_ignored(ctx: Context) -> np.ndarray | None:
    if ctx.case.causal is None:
        return None
    return ctx.attend(allowed=ctx.user_mask())


@hypothesis(
    "mask-after-softmax",
    "your function applies the mask after the (causal) softmax, so the allowed weights no longer sum to 1",
)
def _mask_after_causal_softmax(ctx: Context) -> np.ndarray | None:
    if ctx.case.causal is None or ctx.case.mask is None:
        return None
    causal = np.broadcast_to(ctx.causal_part(), ctx.allowed.shape)
    return (softmax(np.where(causal, ctx.scores * ctx.scale, -np.inf), -1) * ctx.allowed) @ ctx.v


@hypothesis(
    "fill-after-softmax",
    "your function fills the weights of blocked keys with {fill} after the softmax, instead of masking the scores "
    "before it",
)
def _fill_after_softmax(ctx: Context) -> tuple[np.ndarray, dict[str, Any]] | None:
    """w = softmax(scores) (masked before it, or not); then w[blocked] = fill: out = A + fill · (blocked @ V)."""
    blocked = ~ctx.allowed
    if not blocked.any():
        return None
    b = blocked.astype(np.float64) @ ctx.v
    out = ctx.out
    rows = np.broadcast_to(ctx.rows[..., None], out.shape)
    best = None
    for w in (
        softmax(ctx.scores * ctx.scale, -1) * ctx.allowed,
        softmax(np.where(ctx.allowed, ctx.scores * ctx.scale, -np.inf), -1),
    ):
        a = w @ ctx.v
        if (~np.isfinite(out) & rows).any():
            # -inf written into the weights: inf/NaN exactly where -inf · V gives them (the signs of V at the
            # blocked keys decide +inf, -inf or NaN, which tells it from garbage)
            alt = np.where(blocked, -np.inf, w) @ ctx.v
            informative = (np.isinf(alt) & rows).any() or (np.isfinite(alt) & rows).any()
            if informative and all(
                np.array_equal(f(out) & rows, f(alt) & rows) for f in (np.isposinf, np.isneginf, np.isnan)
            ):
                return alt, {"fill": "-inf"}
            continue
        sel = rows & (np.abs(b) > 0)
        den = float(np.sum(b[sel] ** 2))
        if den == 0:
            continue
        fill = float(np.sum((out - a)[sel] * b[sel]) / den)
        if abs(fill) < 1e-3 or not math.isfinite(fill):
            continue  # a fill of 0 is the mask applied after the softmax
        alt = a + fill * b
        err = float(np.max(np.abs(alt - out)[rows])) if rows.any() else math.inf
        if best is None or err < best[0]:
            best = (err, alt, fill)
    if best is None:
        return None
    return best[1], {"fill": f"{best[2]:.4g}"}


def _finite_fill(ctx: Context, mode: str) -> tuple[np.ndarray, dict[str, Any]] | None:
    if not (~ctx.allowed).any():
        return None
    lg = ctx.scores * ctx.scale
    best = None
    for fill in FILLS if mode == "replace" else FILLS[1:]:  # adding 0 is no mask at all (padding-leak)
        filled = np.where(ctx.allowed, lg, fill if mode == "replace" else lg + fill)
        alt = softmax(filled, -1) @ ctx.v
        err = float(np.max(np.abs(alt - ctx.out)[np.broadcast_to(ctx.rows[..., None], alt.shape)], initial=0.0))
        if best is None or err < best[0]:
            best = (err, alt, fill)
    assert best is not None  # FILLS has more than one fill
    return best[1], {"fill": f"{best[2]:g}"}


#: The two finite fills, in this order: what blocked scores become, and how the message says it.
for _mode, _message in (
    (
        "replace",
        "your function fills blocked scores with the finite value {fill} instead of -inf (or finfo(dtype).min): "
        "blocked keys keep a weight of about exp({fill} - score)",
    ),
    (
        "add",
        "your function adds the finite value {fill} to blocked scores instead of -inf (or finfo(dtype).min): "
        "blocked keys keep a weight of about exp({fill})",
    ),
):
    hypothesis("finite-fill", _message)(partial(_finite_fill, mode=_mode))
del _mode, _message


def _head_orders(b: int, h: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """The wrong ways of expanding a mask over ``B·h`` batch-and-head slots: ``(how, src_b, src_h)``, where slot
    ``(b, head)`` uses the mask of ``(src_b, src_h)``."""
    i = np.arange(b)[:, None] * h + np.arange(h)[None, :]  # batch-major slot of (b, head)
    j = np.arange(h)[None, :] * b + np.arange(b)[:, None]  # head-major slot of (b, head)
    return [
        ("mask.repeat(h, ...) (tile: slot b·h + head gets mask[(b·h + head) % B]) where repeat_interleave is needed",
         i % b, i // b),
        ("a head-major mask (slot head·B + b) read batch-major (or repeat_interleave where the inputs are "
         "flattened head-major)", j // h, j % h),
    ]  # fmt: skip


@hypothesis("mask-wrong-heads", "your function expands the mask to the heads in the wrong order: {how}")
def _mask_wrong_heads(ctx: Context) -> tuple[np.ndarray, dict[str, Any]] | None:
    if ctx.case.mask is None or ctx.q.ndim != 4 or ctx.batch < 2 or ctx.heads < 2:
        return None
    best = None
    for how, sb, sh in _head_orders(ctx.batch, ctx.heads):
        a = ctx.allowed[sb, sh]
        if np.array_equal(a, ctx.allowed):
            continue
        alt = ctx.attend(allowed=a)
        err = float(np.max(np.abs(alt - ctx.out)[np.broadcast_to(ctx.rows[..., None], alt.shape)], initial=0.0))
        if best is None or err < best[0]:
            best = (err, alt, how)
    return None if best is None else (best[1], {"how": best[2]})


@hypothesis(
    "causal-alignment",
    "your function aligns the causal mask {found} although the mask it was given is {given} (n_q != n_k): it "
    "rebuilds the causal part instead of following the mask",
)
def _causal_other_alignment(ctx: Context) -> tuple[np.ndarray, dict[str, Any]] | None:
    c = ctx.case.causal
    if c is None or not ctx.alignment_received or ctx.q.shape[-2] == ctx.k.shape[-2]:
        return None
    other = "top_left" if c == "bottom_right" else "bottom_right"
    alt = ctx.attend(allowed=ctx.user_mask() & ctx.causal_part(other))
    return alt, {"found": other.replace("_", "-"), "given": c.replace("_", "-")}


# ---------------------------------------------------------------------------------------------------- heads, batch
@hypothesis(
    "gqa-mapping",
    "K/V heads are mapped wrongly: query head i uses K/V head {said} instead of {declared}, as declared "
    "(gqa='{declared_gqa}')",
)
def _gqa_other_mapping(ctx: Context) -> tuple[np.ndarray, dict[str, Any]] | None:
    if not ctx.case.gqa:
        return None
    other = "interleave" if ctx.gqa_map == "tile" else "tile"
    k, v = expand_kv(ctx.q, ctx.case.k, other), expand_kv(ctx.q, ctx.case.v, other)
    lg = ctx.q @ np.swapaxes(k, -1, -2) * ctx.scale
    out = softmax(np.where(ctx.allowed, lg, -np.inf), -1) @ v
    return out, {"said": _GQA_SAID[other], "declared": _GQA_SAID[ctx.gqa_map]}


@hypothesis("gqa-mapping", "every query head uses K/V head 0 (the K/V heads are not expanded to the query heads)")
def _gqa_head_zero(ctx: Context) -> np.ndarray | None:
    if not ctx.case.gqa:
        return None
    k, v = ctx.case.k[..., :1, :, :], ctx.case.v[..., :1, :, :]
    lg = ctx.q @ np.swapaxes(k, -1, -2) * ctx.scale
    return softmax(np.where(ctx.allowed, lg, -np.inf), -1) @ v


def _reused(ctx: Context, axis: int, index: int, which: str) -> np.ndarray | None:
    """The output when every batch element (axis 0) or head (axis -3) uses K/V (or V) of element ``index``."""
    q = ctx.q
    if (axis == 0 and (q.ndim != 4 or ctx.batch < 2)) or (axis == -3 and (q.ndim < 3 or ctx.heads < 2)):
        return None
    sel = [slice(None)] * q.ndim
    sel[axis] = slice(index, index + 1) if index >= 0 else slice(index, None)
    k = ctx.k[tuple(sel)] if "k" in which else ctx.k
    v = ctx.v[tuple(sel)] if "v" in which else ctx.v
    lg = q @ np.swapaxes(np.broadcast_to(k, ctx.k.shape), -1, -2) * ctx.scale
    return softmax(np.where(ctx.allowed, lg, -np.inf), -1) @ np.broadcast_to(v, ctx.v.shape)


for _axis, _index, _which, _what in [
    (0, 0, "kv", "the K and V of batch element 0 for every batch element (a loop that reuses one element)"),
    (0, 0, "v", "the V of batch element 0 for every batch element (a loop that reuses one element's values)"),
    (0, -1, "kv", "the K and V of the last batch element for every batch element (a loop variable reused)"),
    (-3, 0, "kv", "the K and V of head 0 for every head (a loop that reuses one head)"),
    (-3, 0, "v", "the V of head 0 for every head (a loop that reuses one head's values)"),
]:

    def _reuse(ctx: Context, axis: int = _axis, index: int = _index, which: str = _which) -> np.ndarray | None:
        return _reused(ctx, axis, index, which)

    hypothesis("batch-leak", f"your function uses {_what}")(_reuse)


@hypothesis(
    "not-normalized",
    "your function does not divide exp(logits) by its row sum (the weights are not normalized)",
)
def _not_normalized(ctx: Context) -> np.ndarray:
    lg = np.where(ctx.allowed, ctx.scores * ctx.scale, -np.inf)
    row_max = np.max(np.where(ctx.allowed, lg, -1e300), axis=-1, keepdims=True)
    e = np.where(ctx.allowed, np.exp(np.where(ctx.allowed, lg, row_max) - row_max), 0.0)
    return e @ ctx.v


# ---------------------------------------------------------------------------------------------------- two at once
# Two independent bugs: a scale or softmax bug, and a mask bug; both are named. A mask bug is the mask the scores
# are filled with before the softmax and the mask the weights are multiplied by after it (None: the case's own,
# nothing); a scale/softmax bug computes the output from those.
_Masks = tuple[np.ndarray, np.ndarray | None]

_MASK_BUGS: list[tuple[str, str, Callable[[Context], _Masks | None]]] = [
    ("mask-inverted", "{inverted}", lambda c: None if (m := c.inverted()) is None else (m, None)),
    ("causal-leak", "ignores the causal mask", lambda c: None if c.case.causal is None else (c.user_mask(), None)),
    (
        "padding-leak",
        "ignores the mask",
        lambda c: None if c.case.mask is None else (np.broadcast_to(c.causal_part(), c.allowed.shape), None),
    ),
    (
        "mask-after-softmax",
        "applies the mask after the softmax",
        lambda c: None if not c.mask_received else (np.ones(c.allowed.shape, bool), c.allowed),
    ),
]


def _with_masks(ctx: Context, masks: _Masks, scale: float, axes: tuple[int, ...] = (-1,), after: float = 1.0) -> Any:
    before, multiply = masks
    w = softmax(np.where(before, ctx.scores * scale, -np.inf), axes)
    if multiply is not None:
        w = w * multiply
    return (w * after) @ ctx.v


_FIRST_BUGS: list[tuple[str, str, Callable[[Context, _Masks], np.ndarray | None]]] = [
    (code, text, lambda c, m, factor=factor: None if factor(c) is None else _with_masks(c, m, factor(c)))
    for code, text, factor in _SCALES
] + [
    (
        "softmax-axis",
        "your function takes the softmax over the queries (axis -2)",
        lambda c, m: _with_masks(c, m, c.scale, (-2,)),
    ),
    (
        "scale-after-softmax",
        "your function applies the scale after the softmax",
        lambda c, m: _with_masks(c, m, 1.0, after=c.scale),
    ),
]

for _fcode, _ftext, _first in _FIRST_BUGS:
    for _mcode, _mtext, _mask_bug in _MASK_BUGS:

        def _two(
            ctx: Context,
            first: Callable[[Context, _Masks], np.ndarray | None] = _first,
            masks: Callable[[Context], _Masks | None] = _mask_bug,
        ) -> np.ndarray | None:
            m = masks(ctx)
            return None if m is None else first(ctx, m)

        hypothesis(f"{_fcode}+{_mcode}", f"{_ftext}; and {_mtext}")(_two)
