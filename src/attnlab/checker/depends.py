"""What a failure depends on: read from a shrunk case, its wrong outputs and a few more predicate calls.

:func:`depends` takes the :class:`~attnlab.checker.shrink.Shrunk` result, the predicate it was shrunk with and the
function's output on the minimal case, and says

* where the output is wrong: which batch elements, heads and query rows (entries beyond the tolerance), and which
  key explains it (the output equals the reference with one key ignored, or one blocked key seen, or the causal
  diagonal moved by one);
* what the failure needs, from the shrinking trace (a step that made it pass is something it needs: the causal
  rule, a mask, masks that differ per batch element or per head, n_q != n_k, a batch element or head more) and
  from extra calls (at most ``max_calls``, default 12): the mask's keys reversed (the padding side), the first key
  unblocked, the case in another dtype, scores of larger magnitude (q and k × 10), and call order (a new shape
  called twice with different values: a first call that passes and a second that fails is state carried
  between calls).

The result is a frozen :class:`Depends` whose :attr:`~Depends.text` is one paragraph for the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from .. import masks as _masks
from .adapters import round_to
from .runner import Case
from .shrink import Shrunk
from .tolerance import FLOORS, golden_output

__all__ = ["Depends", "WrongEntry", "allowed_of", "depends", "wrong_entries"]


@dataclass(frozen=True)
class WrongEntry:
    """One wrong output entry: its index ``[..., h, n_q, d_v]``, the function's value and the reference's."""

    index: tuple[int, ...]
    got: float
    expected: float
    name: str = "out"  #: what is wrong: the output, or a gradient (``dq``, ``dk``, ...)

    @property
    def text(self) -> str:
        """``out[0, 1, 2, 0] = 0.513 (expected 0.4821)``."""
        where = ", ".join(str(i) for i in self.index)
        return f"{self.name}[{where}] = {self.got:.6g} (expected {self.expected:.6g})"


@dataclass(frozen=True)
class Depends:
    """What one failure depends on (see the module doc).

    ``batch``, ``heads``, ``rows``: where the minimal case's output is wrong (empty: no output to read, or the
    failure is not a wrong output); ``keys``: which key explains the wrong output, in words; ``needs``: what the
    failure needs; ``independent``: what was tested and does not matter; ``first_wrong``: the first wrong entries;
    ``calls``: the extra predicate calls made; ``text``: one paragraph saying all of it.
    """

    batch: tuple[int, ...]
    heads: tuple[int, ...]
    rows: tuple[int, ...]
    keys: tuple[str, ...]
    needs: tuple[str, ...]
    independent: tuple[str, ...]
    first_wrong: tuple[WrongEntry, ...]
    calls: int
    text: str


def allowed_of(case: Case) -> np.ndarray:
    """The full boolean mask of ``case`` ``[..., h, n_q, n_k]``: its mask AND its causal rule."""
    n_q, n_k = case.q.shape[-2], case.k.shape[-2]
    full = (*case.q.shape[:-2], n_q, n_k)
    a = np.ones(full, bool) if case.mask is None else np.broadcast_to(case.mask, full)
    if case.causal is not None:
        a = a & _masks.causal(n_q, n_k, align=cast(_masks.Align, case.causal))
    return np.asarray(a)


def _reference(case: Case, allowed: np.ndarray, gqa: str) -> np.ndarray:
    return golden_output(case.q, case.k, case.v, allowed, scale=case.scale, gqa=gqa)


def wrong_entries(
    out: np.ndarray, expected: np.ndarray, rows: np.ndarray, tol: float, *, limit: int = 5, name: str = "out"
) -> tuple[WrongEntry, ...]:
    """The first ``limit`` entries of ``out`` (in index order) farther than ``tol`` from ``expected``, on the query
    rows where ``rows [..., n_q]`` is True (a NaN or inf is wrong); ``name``: what ``out`` is."""
    sel = np.broadcast_to(np.asarray(rows)[..., None], out.shape)
    with np.errstate(invalid="ignore"):
        bad = sel & ~(np.abs(out - expected) <= tol)
    return tuple(
        WrongEntry(tuple(int(i) for i in idx), float(out[tuple(idx)]), float(expected[tuple(idx)]), name)
        for idx in np.argwhere(bad)[:limit]
    )


def _tolerance(case: Case, expected: np.ndarray) -> float:
    return FLOORS.get(case.dtype, 1e-5) * max(1.0, float(np.max(np.abs(expected), initial=0.0))) * 4


def _indices(bad: np.ndarray, axis: int) -> tuple[int, ...]:
    other = tuple(a for a in range(bad.ndim) if a != axis)
    return tuple(int(i) for i in np.flatnonzero(bad.any(axis=other)))


def _key_story(case: Case, out: np.ndarray, tol: float, gqa: str) -> tuple[str, ...]:
    """Which key explains ``out``: ignored, seen although blocked, or the causal diagonal moved by one."""
    allowed = allowed_of(case)
    rows = np.asarray(allowed.any(axis=-1))
    n_q, n_k = case.q.shape[-2], case.k.shape[-2]
    found: list[str] = []

    def matches(alt_allowed: np.ndarray) -> bool:
        alt = _reference(case, alt_allowed, gqa)
        return not wrong_entries(out, alt, rows, tol, limit=1)

    for j in range(min(n_k, 16)):
        col = np.zeros(n_k, bool)
        col[j] = True
        if allowed[..., j].any() and matches(allowed & ~col):
            found.append(f"the output is the reference with key {j} ignored")
        elif not allowed[..., j].all() and matches(allowed | col):
            found.append(f"the output is the reference with key {j} seen although it is blocked")
    if case.causal is not None:
        shift = n_k - n_q if case.causal == "bottom_right" else 0
        qi, kj = np.arange(n_q)[:, None], np.arange(n_k)[None, :]
        user = allowed_of(replace(case, causal=None))
        for d, what in ((1, "one key of its future"), (-1, "one key fewer (its own position)")):
            if matches(user & (kj <= qi + shift + d)):
                found.append(f"the output is the reference where each query sees {what} (the causal rule off by one)")
        other = "top_left" if case.causal == "bottom_right" else "bottom_right"
        if n_q != n_k and matches(allowed_of(replace(case, causal=other))):
            found.append(f"the output is the reference aligned {other.replace('_', '-')}")
    return tuple(found)


def _mask_words(case: Case) -> tuple[str, ...]:
    """The mask's features in words: where the blocked keys are, the first key blocked, per batch / head."""
    if case.mask is None:
        return ()
    m = np.asarray(case.mask)
    words = []
    blocked = ~m
    if blocked.any():
        n_k = m.shape[-1]
        cols = np.asarray(blocked.any(axis=tuple(range(m.ndim - 1))))
        sides = []
        if cols[0]:
            sides.append("start")
        if cols[-1]:
            sides.append("end")
        if n_k > 2 and cols[1:-1].any():
            sides.append("middle")
        words.append(
            "blocked keys at the " + " and ".join(sides) + " of the keys" if n_k > 1 else "the only key blocked"
        )
        if blocked[..., 0].any() and n_k > 1:
            words.append("the first key blocked")
    return tuple(words)


def _differs(m: np.ndarray | None, axis: int) -> bool:
    return m is not None and m.ndim >= 3 and m.shape[axis] > 1 and not bool((m == np.take(m, [0], axis)).all())


#: Steps of the shrinker that made the case pass (their prefix), what that says the failure needs, and when it
#: still applies to the final case.
_NEEDS: tuple[tuple[str, str, Callable[[Case], bool]], ...] = (
    ("causal rule dropped", "the causal rule", lambda c: c.causal is not None),
    ("mask dropped", "a mask", lambda c: c.mask is not None),
    ("mask of batch element", "masks that differ per batch element", lambda c: _differs(c.mask, 0)),
    ("mask of head", "masks that differ per head", lambda c: c.mask is not None and _differs(c.mask, c.mask.ndim - 3)),
    ("batch element", "more than one batch element", lambda c: c.q.ndim == 4 and c.q.shape[0] > 1),
    ("K/V head", "more than one K/V head", lambda c: c.q.ndim >= 3 and c.k.shape[-3] > 1),
    ("head", "more than one head", lambda c: c.q.ndim >= 3 and c.q.shape[-3] > 1),
    (
        "query head",
        "more than one query head per K/V head (GQA)",
        lambda c: c.q.ndim >= 3 and c.q.shape[-3] > c.k.shape[-3],
    ),
)


def _trace_needs(shrunk: Shrunk) -> list[str]:
    """What the failure needs, from the steps the shrinker tried that made the case pass."""
    c = shrunk.case
    needs = []
    for prefix, what, applies in _NEEDS:
        if not applies(c) or not any(r.startswith(prefix) for r in shrunk.rejected):
            continue
        if prefix == "causal rule dropped" and c.causal is not None:
            what = f"the causal rule ({c.causal.replace('_', '-')})"
        if what not in needs:
            needs.append(what)
    return needs


class _Calls:
    def __init__(self, fails: Callable[[Case], bool], budget: int):
        self.fails, self.left, self.made = fails, budget, 0

    def __call__(self, case: Case | None) -> bool | None:
        """True/False, or None when over budget (or no case)."""
        if case is None or self.left <= 0:
            return None
        self.left -= 1
        self.made += 1
        try:
            return bool(self.fails(case))
        except Exception:  # the function crashed: not the failure being studied
            return None


def _other_dtype(case: Case) -> Case:
    target = "float32" if case.dtype == "float64" else "float64"
    return replace(
        case,
        dtype=target,
        q=round_to(case.q, target).astype(np.float64),
        k=round_to(case.k, target).astype(np.float64),
        v=round_to(case.v, target).astype(np.float64),
    )


def _grown(case: Case) -> Case:
    """``case`` with its first query repeated after the last and its last key repeated too (shapes the function
    has probably not seen; n_q - n_k is kept)."""
    q = np.concatenate([case.q, case.q[..., :1, :]], axis=-2)
    k = np.concatenate([case.k, case.k[..., -1:, :]], axis=-2)
    v = np.concatenate([case.v, case.v[..., -1:, :]], axis=-2)
    mask = case.mask
    if mask is not None:
        mask = np.concatenate([mask, mask[..., :1, :]], axis=-2)
        mask = np.concatenate([mask, mask[..., -1:]], axis=-1)
    return replace(case, q=q, k=k, v=v, mask=mask)


def _square(case: Case) -> Case:
    """``case`` made square without changing what its queries see: fewer keys than queries, the queries that see
    least are removed; more keys, queries are added (copies of the first, before it for bottom-right alignment,
    else of the last after it)."""
    n_q, n_k = case.q.shape[-2], case.k.shape[-2]
    front = case.causal == "bottom_right"
    if n_q > n_k:
        keep = slice(n_q - n_k, None) if front else slice(0, n_k)
        mask = None if case.mask is None else case.mask[..., keep, :]
        return replace(case, q=case.q[..., keep, :], mask=mask)
    extra = n_k - n_q
    row = slice(0, 1) if front else slice(n_q - 1, n_q)

    def grow(x: np.ndarray) -> np.ndarray:
        more = np.repeat(x[..., row, :], extra, axis=-2)
        return np.concatenate([more, x] if front else [x, more], axis=-2)

    return replace(case, q=grow(case.q), mask=None if case.mask is None else grow(case.mask))


def depends(
    shrunk: Shrunk,
    fails: Callable[[Case], bool],
    *,
    out: Any = None,
    gqa: str = "interleave",
    tol: float | None = None,
    valid: Callable[[np.ndarray], bool] | None = None,
    max_calls: int = 12,
) -> Depends:
    """What the failure of ``shrunk.case`` depends on (see the module doc).

    Args:
        shrunk: the result of :func:`~attnlab.checker.shrink.shrink`.
        fails: the predicate it was shrunk with.
        out: the function's output on ``shrunk.case`` ``[..., h, n_q, d_v]`` (None: no output, e.g. a crash).
        gqa: the query-head to K/V-head mapping (``"interleave"`` or ``"tile"``).
        tol: the largest acceptable error of an entry (default: the case dtype's floor, × 4).
        valid: whether the function's mask form can express a mask (:func:`~attnlab.checker.shrink.form_valid`).
        max_calls: the most extra predicate calls.
    """
    case = shrunk.case
    valid = valid or (lambda m: True)
    call = _Calls(fails, max_calls)
    allowed = allowed_of(case)
    rows = np.asarray(allowed.any(axis=-1))
    expected = _reference(case, allowed, gqa)
    tol = _tolerance(case, expected) if tol is None else tol
    where = _where(case, out, expected, rows, tol, gqa)
    needs = _trace_needs(shrunk)
    independent: list[str] = []
    for variant, need, fine in _experiments(case):
        if variant.mask is not None and not valid(variant.mask):
            continue
        r = call(variant)
        if r is False and need:
            needs.append(need)
        elif r and fine:
            independent.append(fine)
    needs += _call_order(case, call, valid)
    text = _paragraph(case, shrunk, where, needs, independent, _mask_words(case))
    return Depends(*where[:4], tuple(needs), tuple(independent), where[4], call.made, text)


_Where = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[str, ...], tuple[WrongEntry, ...]]


def _where(case: Case, out: Any, expected: np.ndarray, rows: np.ndarray, tol: float, gqa: str) -> _Where:
    """The batch elements, heads and query rows where ``out`` is wrong, the key story, the first wrong entries."""
    if out is None or np.shape(out) != expected.shape:
        return (), (), (), (), ()
    out = np.asarray(out, dtype=np.float64)
    sel = np.broadcast_to(rows[..., None], out.shape)
    with np.errstate(invalid="ignore"):
        bad = sel & ~(np.abs(out - expected) <= tol)
    first = wrong_entries(out, expected, rows, tol)
    if not bad.any():
        return (), (), (), (), first
    batch = _indices(bad, 0) if out.ndim == 4 else ()
    heads = _indices(bad, out.ndim - 3) if out.ndim >= 3 else ()
    return batch, heads, _indices(bad, out.ndim - 2), _key_story(case, out, tol, gqa), first


def _experiments(case: Case) -> list[tuple[Case, str, str]]:
    """The variants of ``case`` to call, each with what a pass says it needs and what a failure says it does not
    depend on: made square, keys reversed (the padding side), the first key unblocked, another dtype, q and k × 10."""
    n_q, n_k = case.q.shape[-2], case.k.shape[-2]
    out = []
    if n_q != n_k:
        out.append(
            (
                _square(case),
                f"n_q != n_k ({n_q} queries, {n_k} keys; made square, it passes)",
                "n_q != n_k (made square, it fails too)",
            )
        )
    m = case.mask
    if m is not None and case.causal is None and (~m).any():
        with_keys = {n: x[..., ::-1] for n in ("keep", "bias") if (x := getattr(case, n, None)) is not None}
        flipped = replace(case, k=case.k[..., ::-1, :], v=case.v[..., ::-1, :], mask=m[..., ::-1], **with_keys)
        out.append(
            (
                flipped,
                "the side of the blocked keys (the same case with the keys reversed passes)",
                "the side of the blocked keys (reversed, it fails too)",
            )
        )
    if m is not None and (~m[..., 0]).any() and n_k > 1:
        first_open = m.copy()
        first_open[..., 0] = True
        out.append((replace(case, mask=first_open), "the first key blocked", ""))
    other = _other_dtype(case)
    out.append((other, f"dtype {case.dtype} (it passes in {other.dtype})", f"the dtype (fails in {other.dtype} too)"))
    out.append(
        (
            replace(case, q=case.q * 10, k=case.k * 10),
            "scores of this magnitude (q and k × 10 pass)",
            "the magnitude of the scores (q and k × 10 fail too)",
        )
    )
    return out


def _call_order(case: Case, call: _Calls, valid: Callable[[np.ndarray], bool]) -> list[str]:
    """What the calls before it change: a new shape that passes on its first call and fails on the next (state
    carried between calls), and the case itself called again."""
    needs = []
    grown = _grown(case)
    if grown.mask is None or valid(grown.mask):
        rng = np.random.default_rng(0)  # other values of the same shapes (integers: exact in every dtype)
        second = replace(
            grown,
            q=round_to(grown.q + rng.integers(-2, 3, grown.q.shape), case.dtype).astype(np.float64),
            k=round_to(grown.k + rng.integers(-2, 3, grown.k.shape), case.dtype).astype(np.float64),
            v=round_to(grown.v + rng.integers(-2, 3, grown.v.shape), case.dtype).astype(np.float64),
        )
        f1, f2 = call(grown), call(second)
        if f1 is False and f2:
            needs.append(
                "an earlier call of the same shape (a new shape passes on its first call and fails on the next: "
                "state carried between calls, such as a cache keyed by shape)"
            )
    if call(case) is False:
        needs.append("the calls before it (the same case passes when called again: state or nondeterminism)")
    return needs


def _span(idx: tuple[int, ...], n: int, what: str) -> str:
    if len(idx) == n and n > 1:
        return f"every {what} ({n})"
    return f"{what}{'s' if len(idx) > 1 else ''} {', '.join(str(i) for i in idx)} of {n}"


def _paragraph(
    case: Case, shrunk: Shrunk, where: _Where, needs: list[str], independent: list[str], mask_words: tuple[str, ...]
) -> str:
    batch, heads, rows, keys, _ = where
    parts = [
        f"Smallest failing case: {case.shapes()}" + (f", causal {case.causal.replace('_', '-')}" if case.causal else "")
    ]
    if case.mask is not None:
        parts[-1] += ", with a mask" + (f" ({'; '.join(mask_words)})" if mask_words else "")
    parts[-1] += f" ({shrunk.calls} calls to shrink it" + (", stopped by the bound)" if shrunk.bounded else ")")
    if rows:
        at = []
        if case.q.ndim == 4:
            at.append(_span(batch, case.q.shape[0], "batch element"))
        if case.q.ndim >= 3:
            at.append(_span(heads, case.q.shape[-3], "head"))
        at.append(_span(rows, case.q.shape[-2], "query row"))
        parts.append("wrong in " + ", ".join(at))
    if keys:
        parts.append("; ".join(keys))
    if needs:
        parts.append("it needs " + "; ".join(needs))
    if independent:
        parts.append("it does not depend on " + "; ".join(independent))
    if not rows and not needs and not keys:
        parts.append("no single feature of the case explains it")
    return ". ".join(p[0].upper() + p[1:] for p in parts) + "."
