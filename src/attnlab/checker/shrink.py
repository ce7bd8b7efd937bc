"""Shrinking a failing case to its smallest form, as Hypothesis shrinks a failing example.

:func:`shrink` takes a canonical :class:`~attnlab.checker.runner.Case` and a predicate ``fails(case) -> bool``
(it calls the function under test and compares with the reference) and applies simplifications greedily, keeping
each one that still fails, until no single one does:

1. remove batch elements (keep one, then remove them one by one);
2. remove heads: a query head with its K/V head when there is no GQA, else a K/V head together with its query
   group (``gqa="interleave"``: heads ``j·g .. j·g + g - 1``; ``"tile"``: heads ``j, j + h_kv, ...``), or one query
   head of every group at once, so that every group keeps the same size;
3. drop the causal rule (a case that still fails without it does not need it), then remove queries and keys, in
   halving blocks then one by one. Every case keeps its causal alignment as a rule (``top_left``: query ``i``
   sees keys ``j <= i``; ``bottom_right``: ``j <= i + n_k - n_q``) and the reference is recomputed from the
   smaller case, so it stays defined; query rows left with no key are not compared (the checker's policy);
4. simplify the mask: no mask at all, one mask shared by every batch element, by every head, then blocked entries
   set to True (in halving blocks); a candidate the function's mask form cannot express (``valid(mask)``) is
   skipped without a call;
5. shrink the head dims ``d_k`` and ``d_v`` (drop columns);
6. simplify values: q, k, v (and a gradient case's ``d_out``) rounded to integers, then entries set to 0 (in
   halving blocks). Integers are exact in every dtype the checker uses.

A gradient case (:class:`~attnlab.checker.gradient_oracle.GradCase`) is shrunk by the same steps: its upstream
gradient ``d_out [..., h, n_q, d_v]`` loses what q (and v's columns) lose, its dropout keep mask and bias
``[..., h, n_q, n_k]`` what the mask loses.

Bounds: at most ``max_calls`` predicate calls (:data:`MAX_CALLS`, 300) and ``seconds`` of wall time
(:data:`SECONDS`, 20 s), whichever comes first; :attr:`Shrunk.bounded` says that a bound stopped it (the case is
then smaller than the original but maybe not minimal).

A predicate that raises counts as "still fails" only when the original case raised too (a crash being shrunk);
otherwise it counts as "passes".

>>> import numpy as np
>>> from attnlab.checker.runner import Case
>>> rng = np.random.default_rng(0)
>>> q, k, v = rng.normal(size=(2, 3, 5, 4)), rng.normal(size=(2, 3, 7, 4)), rng.normal(size=(2, 3, 7, 4))
>>> s = shrink(Case(q, k, v), lambda c: c.k.shape[-2] >= 3)  # "fails" whenever there are 3 keys or more
>>> s.case.shapes()
'q (1, 1, 1, 1), k (1, 1, 3, 1), v (1, 1, 3, 1), float64'
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .runner import Case

__all__ = ["MAX_CALLS", "SECONDS", "Shrunk", "form_valid", "shrink"]

#: The most predicate calls one :func:`shrink` makes.
MAX_CALLS = 300
#: The most wall-clock seconds one :func:`shrink` spends (checked between calls).
SECONDS = 20.0
#: The most rounds of every step (each round that keeps a step starts another one).
_ROUNDS = 30


@dataclass(frozen=True)
class Shrunk:
    """The result of :func:`shrink`: the smallest failing ``case`` found and how it was found.

    ``calls``: predicate calls made (the first, on the original case, included); ``bounded``: a bound
    (calls or time) stopped the search before no simplification was left; ``steps``: the simplifications kept, in
    order; ``rejected``: those tried on the final case's way that made it pass (what the failure needs);
    ``crash``: the original failure was the predicate raising; ``failed``: the original case failed at all (if not,
    ``case`` is the original, unshrunk).
    """

    case: Case
    original: Case
    calls: int
    bounded: bool
    seconds: float
    steps: tuple[str, ...] = ()
    rejected: tuple[str, ...] = ()
    crash: bool = False
    failed: bool = True


class _Stop(Exception):
    """A bound was reached."""


class _Search:
    """The state of one shrink: the current case, the budget, the trace."""

    def __init__(
        self, fails: Callable[[Case], bool], valid: Callable[[np.ndarray], bool], max_calls: int, seconds: float
    ):
        self.fails = fails
        self.valid = valid
        self.max_calls = max_calls
        self.deadline = time.perf_counter() + seconds
        self.calls = 0
        self.crash = False
        self.steps: list[str] = []
        self.rejected: list[str] = []

    def run(self, case: Case) -> bool:
        """Whether ``case`` still fails (a raise counts when the original raised)."""
        if self.calls >= self.max_calls or time.perf_counter() > self.deadline:
            raise _Stop
        self.calls += 1
        try:
            return bool(self.fails(case))
        except Exception:  # the predicate (the function under test) crashed
            return self.crash

    def attempt(self, case: Case | None, what: str) -> bool:
        """Try ``case`` (None: the step does not apply); record it as kept or rejected."""
        if case is None or (case.mask is not None and not self.valid(case.mask)):
            return False
        if self.run(case):
            self.steps.append(what)
            return True
        self.rejected.append(what)
        return False


def form_valid(form: str, gqa: bool = False) -> Callable[[np.ndarray], bool]:
    """Whether a canonical mask ``[B, h, n_q, n_k]`` is expressible in mask form ``form`` (the interfaces of
    :mod:`attnlab.checker.interfaces`): ``full`` always; ``batch`` when every head has the same mask;
    ``key_padding`` when also every query row is the same; ``valid_lens``/``kv_cache``/``varlen`` when the allowed
    keys are also a prefix (``varlen``: of both queries and keys). Used as :func:`shrink`'s ``valid``."""

    def valid(m: np.ndarray) -> bool:
        if form == "full" or m.ndim < 4:
            return True
        same_heads = bool((m == m[:, :1]).all())
        if form == "batch":
            return same_heads
        if form == "varlen":
            lk = m.any(axis=-2).sum(axis=-1)  # [B, h]
            lq = m.any(axis=-1).sum(axis=-1)
            n_q, n_k = m.shape[-2:]
            want = (np.arange(n_q)[:, None] < lq[..., None, None]) & (np.arange(n_k) < lk[..., None, None])
            return same_heads and bool((want == m).all())
        rows = bool((m == m[..., -1:, :]).all())
        if form == "key_padding":
            return same_heads and rows
        lengths = m[..., -1, :].sum(axis=-1)  # [B, h]
        prefix = np.arange(m.shape[-1]) < lengths[..., None]
        return same_heads and rows and bool((prefix == m[..., -1, :]).all())

    return valid


def shrink(
    case: Case,
    fails: Callable[[Case], bool],
    *,
    gqa: str = "interleave",
    valid: Callable[[np.ndarray], bool] | None = None,
    keep_mask_entries: bool = False,
    max_calls: int = MAX_CALLS,
    seconds: float = SECONDS,
) -> Shrunk:
    """The smallest case found that still ``fails`` (see the module doc for the steps and the bounds).

    Args:
        case: the failing case; ``q [..., h, n_q, d_k]``, ``k [..., h_kv, n_k, d_k]``, ``v [..., h_kv, n_k, d_v]``,
            ``mask [..., h, n_q, n_k]`` (True = may attend) or None.
        fails: ``fails(case) -> bool``, True while the failure is still there (a raise: see the module doc).
        gqa: how query heads map to K/V heads (``"interleave"`` or ``"tile"``), to remove a K/V head with its group.
        valid: ``valid(mask) -> bool``, whether the function's mask interface can express ``mask``
            (:func:`form_valid`); default: every mask.
        keep_mask_entries: never change single mask entries (the mask holds a per-sequence causal rule).
        max_calls: the most predicate calls (the first included).
        seconds: the most wall-clock seconds.

    Returns:
        A :class:`Shrunk`; ``Shrunk.case`` fails, and (unless ``bounded``) every single further step passes.
    """
    t0 = time.perf_counter()
    search = _Search(fails, valid or (lambda m: True), max_calls, seconds)
    try:
        first = bool(fails(case))
    except Exception:  # the original failure is a crash
        first, search.crash = True, True
    search.calls = 1
    if not first:
        return Shrunk(case, case, 1, False, time.perf_counter() - t0, crash=False, failed=False)
    current, bounded = case, False
    try:
        changed, rounds = True, 0
        while changed and rounds < _ROUNDS:
            changed, rounds = False, rounds + 1
            for step in (_batch, _heads, _causal, _queries, _keys, _mask, _dims, _values):
                new = step(current, search, gqa, not keep_mask_entries)
                if new is not current:
                    current, changed = new, True
    except _Stop:
        bounded = True
    except Exception:  # a case the search built that the predicate's own code could not take: stop there
        bounded = True
    seen = set(search.steps)
    return Shrunk(
        current,
        case,
        search.calls,
        bounded,
        time.perf_counter() - t0,
        tuple(search.steps),
        tuple(dict.fromkeys(r for r in search.rejected if r not in seen)),
        search.crash,
    )


# ---------------------------------------------------------------------------------------------------------------
# building smaller cases


def _take(case: Case, like_q: Any = None, like_mask: Any = None, /, **arrays: Any) -> Case:
    """``case`` with ``arrays`` replaced; a gradient case's ``d_out`` cut by ``like_q`` (as q is), its ``keep`` and
    ``bias`` by ``like_mask`` (as the mask is)."""
    for name, cut in (("d_out", like_q), ("keep", like_mask), ("bias", like_mask)):
        x = getattr(case, name, None)
        if x is not None and cut is not None:
            arrays[name] = cut(x)
    return replace(case, **arrays)


def _keep(x: np.ndarray | None, axis: int, idx: np.ndarray) -> np.ndarray | None:
    """``x`` with only the indices ``idx`` along ``axis`` (an axis of size 1 is broadcast and kept)."""
    if x is None or x.shape[axis] == 1:
        return x
    return np.take(x, idx, axis=axis)


def _without(n: int, drop: Iterable[int]) -> np.ndarray:
    d = set(drop)
    return np.array([i for i in range(n) if i not in d], dtype=np.intp)


def _greedy(items: list[int], attempt: Callable[[list[int]], bool], *, keep_one: bool) -> list[int]:
    """Remove blocks of ``items`` while ``attempt(remaining)`` still fails: halves, then quarters, ... then single
    items, each size swept once (a removal that fails keeps its place, so the sweep goes on from there); returns
    the items left. ``keep_one``: never try to remove the last item."""
    size = max(1, len(items) // 2)
    while items:
        i = 0
        while i < len(items):
            rest = items[:i] + items[i + size :]
            if (rest or not keep_one) and attempt(rest):
                items = rest
            else:
                i += size
        if size == 1:
            return items
        size = max(1, size // 2)
    return items


def _shrink_axis(
    case: Case, search: _Search, size: Callable[[Case], int], cut: Callable[[Case, np.ndarray], Case], name: str
) -> Case:
    """Remove indices along one axis: keep a single index first, then blocks, then one index at a time."""
    n = size(case)
    if n <= 1:
        return case
    for i in range(n):
        if search.attempt(cut(case, np.array([i])), f"{name}: only {name} {i} kept"):
            return cut(case, np.array([i]))
    base = case

    def attempt(rest: list[int]) -> bool:
        gone = sorted(set(range(n)) - set(rest))
        what = f"{name} {gone[0]} removed" if len(gone) == 1 else f"{name}s {', '.join(map(str, gone))} removed"
        return search.attempt(cut(base, np.array(rest, dtype=np.intp)), what)

    kept = _greedy(list(range(n)), attempt, keep_one=True)
    return case if len(kept) == n else cut(base, np.array(kept, dtype=np.intp))


def _batch(case: Case, search: _Search, gqa: str, entries: bool) -> Case:
    if case.q.ndim != 4:
        return case

    def cut(c: Case, idx: np.ndarray) -> Case:
        def on(x: Any) -> Any:
            return _keep(x, 0, idx)

        return _take(c, on, on, q=on(c.q), k=on(c.k), v=on(c.v), mask=on(c.mask))

    return _shrink_axis(case, search, lambda c: c.q.shape[0], cut, "batch element")


def _heads(case: Case, search: _Search, gqa: str, entries: bool) -> Case:
    if case.q.ndim < 3:
        return case
    h, h_kv = case.q.shape[-3], case.k.shape[-3]
    g = h // h_kv
    ax = case.q.ndim - 3

    def query_heads(kv: np.ndarray, h_kv: int, g: int) -> np.ndarray:
        if gqa == "tile":
            return np.array([j + r * h_kv for r in range(g) for j in kv], dtype=np.intp)
        return np.array([j * g + r for j in kv for r in range(g)], dtype=np.intp)

    def cut_kv(c: Case, kv: np.ndarray) -> Case:
        hq = np.sort(query_heads(kv, c.k.shape[-3], c.q.shape[-3] // c.k.shape[-3]))
        return _take(
            c,
            lambda x: np.take(x, hq, ax),
            lambda x: _keep(x, ax, hq),
            q=np.take(c.q, hq, ax),
            k=np.take(c.k, kv, ax),
            v=np.take(c.v, kv, ax),
            mask=_keep(c.mask, ax, hq),
        )

    if h_kv > 1:
        case = _shrink_axis(case, search, lambda c: c.k.shape[-3], cut_kv, "K/V head" if g > 1 else "head")
    # one query head of every group at once (the group size shrinks, GQA stays consistent)
    while True:
        h, h_kv = case.q.shape[-3], case.k.shape[-3]
        g = h // h_kv
        if g <= 1:
            return case
        for r in range(g - 1, -1, -1):
            keep = [x for x in range(h) if (x % g if gqa != "tile" else x // h_kv) != r]
            idx = np.array(keep, dtype=np.intp)
            on_q, on_m = (lambda x, i=idx: np.take(x, i, ax)), (lambda x, i=idx: _keep(x, ax, i))
            new = _take(case, on_q, on_m, q=on_q(case.q), mask=on_m(case.mask))
            if search.attempt(new, f"query head {r} of every group removed"):
                case = new
                break
        else:
            return case


def _causal(case: Case, search: _Search, gqa: str, entries: bool) -> Case:
    if case.causal is None:
        return case
    new = replace(case, causal=None)
    return new if search.attempt(new, "causal rule dropped") else case


def _queries(case: Case, search: _Search, gqa: str, entries: bool) -> Case:
    def cut(c: Case, idx: np.ndarray) -> Case:
        on_q, on_m = (lambda x: np.take(x, idx, -2)), (lambda x: _keep(x, -2, idx))
        return _take(c, on_q, on_m, q=on_q(c.q), mask=on_m(c.mask))

    return _shrink_axis(case, search, lambda c: c.q.shape[-2], cut, "query")


def _keys(case: Case, search: _Search, gqa: str, entries: bool) -> Case:
    def cut(c: Case, idx: np.ndarray) -> Case:
        def on_m(x: Any) -> Any:
            return _keep(x, -1, idx)

        return _take(c, None, on_m, k=np.take(c.k, idx, -2), v=np.take(c.v, idx, -2), mask=on_m(c.mask))

    return _shrink_axis(case, search, lambda c: c.k.shape[-2], cut, "key")


def _mask(case: Case, search: _Search, gqa: str, entries: bool) -> Case:
    m = case.mask
    if m is None:
        return case
    if search.attempt(replace(case, mask=None), "mask dropped"):
        return replace(case, mask=None)
    for axis, name in ((0, "batch element"), (m.ndim - 3, "head")):
        if m.ndim < 3 or (axis == 0 and m.ndim != 4) or m.shape[axis] == 1:
            continue
        if bool((m == np.take(m, [0], axis)).all()):
            continue  # already the same for every one
        for i in range(m.shape[axis]):
            shared = np.broadcast_to(np.take(m, [i], axis), m.shape).copy()
            if (~shared).sum() > (~m).sum():
                continue  # never more blocked entries: each kept step makes the mask simpler, so the search ends
            if search.attempt(replace(case, mask=shared), f"mask of {name} {i} shared by every {name}"):
                m = shared
                case = replace(case, mask=m)
                break
    if not entries:
        return case
    base = case.mask.copy()  # type: ignore[union-attr]  # the mask is not None here
    blocked = [int(i) for i in np.flatnonzero(~base)]

    def with_true(rest: list[int]) -> Case:
        new = np.ones_like(base)
        new.flat[rest] = False  # the entries still blocked
        return replace(case, mask=new)

    def attempt(rest: list[int]) -> bool:
        n = len(blocked) - len(rest)
        return search.attempt(with_true(rest), f"{n} blocked mask entr{'y' if n == 1 else 'ies'} set to True")

    still = _greedy(blocked, attempt, keep_one=False)
    return case if len(still) == len(blocked) else with_true(still)


def _dims(case: Case, search: _Search, gqa: str, entries: bool) -> Case:
    case = _shrink_axis(
        case, search, lambda c: c.q.shape[-1], lambda c, i: _take(c, q=c.q[..., i], k=c.k[..., i]), "d_k column"
    )
    return _shrink_axis(
        case, search, lambda c: c.v.shape[-1], lambda c, i: _take(c, lambda x: x[..., i], v=c.v[..., i]), "d_v column"
    )


def _values(case: Case, search: _Search, gqa: str, entries: bool) -> Case:
    names = ("v", "k", "q") + (("d_out",) if getattr(case, "d_out", None) is not None else ())
    for name in names:
        x = getattr(case, name)
        rounded = np.round(x)
        if not np.array_equal(rounded, x) and search.attempt(_take(case, **{name: rounded}), f"{name} rounded"):
            case = _take(case, **{name: rounded})
    for name in names:
        case = _zero_out(case, name, search)
    return case


def _zero_out(case: Case, name: str, search: _Search) -> Case:
    """``case`` with as many entries of its array ``name`` set to 0 as keep it failing."""
    base = getattr(case, name)
    nonzero = [int(i) for i in np.flatnonzero(base)]

    def zeroed(rest: list[int]) -> np.ndarray:
        new = np.zeros_like(base)
        new.flat[rest] = base.flat[rest]
        return new

    def attempt(rest: list[int]) -> bool:
        n = len(nonzero) - len(rest)
        return search.attempt(
            _take(case, **{name: zeroed(rest)}), f"{name}: {n} entr{'y' if n == 1 else 'ies'} set to 0"
        )

    left = _greedy(nonzero, attempt, keep_one=False)
    return case if len(left) == len(nonzero) else _take(case, **{name: zeroed(left)})
