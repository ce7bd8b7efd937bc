"""The case-space probes: cases drawn (from the session's seeded generator) from what the declared interface can
express, beyond the grid's full-size masks and fresh single calls.

* ``mask-space``: masks whose padding is at the start, the end, both ends or in the middle, the first key or the
  last key alone blocked, different per batch element and per head (as far as the mask form can say so), at sizes
  that divide no block size with n_q < n_k and n_q > n_k; each compared with the reference, then the K/V of the
  keys a sequence blocks are changed (its valid outputs must not move: ``padding-leak``). With a ``full`` or
  ``batch`` mask form the mask is also passed *broadcast* (``[n_k]``, ``[n_q, n_k]``, ``[B, 1, 1, n_k]``,
  ``[B, 1, n_q, n_k]``, ``[1, h, n_q, n_k]``); a broadcast shape the function refuses is a note, never a bug, and
  silences no other case.
* ``decode``: a single query (n_q = 1) against 17 keys with key padding, then with padding and causal (bottom-right
  unless another alignment is declared: the query is the last position, every key before it visible).
* ``call-order``: two new shapes, each called twice with fresh values (A, B of one shape, C, D of another), then A
  again: an output that depends on earlier calls (a KV cache never reset, a memo keyed by shape) is
  ``nondeterministic``.

Together they add at most 20 calls (2 x 2 + 5 + 3 + 5, fewer for what the function does not take).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..cases import LENGTH_FORMS, Geom, random_mask
from ..fixes import NOT_DIAGNOSES
from ..registry import ProbeSkip, probe
from ..runner import Case, Outcome
from ..tolerance import FLOORS, compare
from .common import change, largest

if TYPE_CHECKING:
    from ..session import Session

__all__ = ["call_order", "decode", "key_patterns", "mask_space", "patterned_mask"]

#: The sizes of the mask-space cases (n_q, n_k): divisible by no block size, n_q < n_k and n_q > n_k.
SIZES = ((9, 33), (33, 17))


def fitted(s: Session, g: Geom) -> Geom:
    """``g`` within what the function is declared not to support, and square where n_q != n_k was not seen to
    work (no ``cross`` capability: a layer in module mode attends a sequence to itself)."""
    g = s.fit(g)
    if "cross" not in s.caps and g.n_q != g.n_k:
        g = replace(g, n_q=max(g.n_q, g.n_k), n_k=max(g.n_q, g.n_k))
    return g


def key_patterns(n_k: int) -> dict[str, np.ndarray]:
    """Which of ``n_k`` keys are valid (True) for each padding position: ``start``, ``end``, ``both``,
    ``middle``, ``first`` (key 0 alone blocked) and ``last`` (the last key alone blocked)."""
    j = np.arange(n_k)
    w = max(1, n_k // 5)
    mid = n_k // 2
    return {
        "start": j >= w,
        "end": j < n_k - w,
        "both": (j >= w // 2 + 1) & (j < n_k - (w // 2 + 1)),
        "middle": (j < mid - w // 2) | (j >= mid - w // 2 + w),
        "first": j != 0,
        "last": j != n_k - 1,
    }


def patterned_mask(s: Session, g: Geom, shape: tuple[int, ...] | None = None) -> np.ndarray | None:
    """A mask ``[B, h, n_q, n_k]`` whose key rows are the padding patterns of :func:`key_patterns` in a seeded
    order, one per batch element and head where the session's mask form holds a head axis (per batch element for
    ``batch`` and ``key_padding``); ``shape``: build it in that broadcast shape first. Length forms get their own
    prefix masks; None for packed sequences (``varlen``)."""
    form = s.mask_form
    if form == "varlen":
        return None
    full = (*g.lead(g.h), g.n_q, g.n_k)
    if form in LENGTH_FORMS:
        return random_mask(s.rng, g, form)
    pats = list(key_patterns(g.n_k).values())
    order = s.rng.permutation(len(pats))
    if shape is None:  # one pattern per sequence (and head), the same for its every query
        rows = patterned_mask(s, g, (full[0], full[1] if form == "full" else 1, 1, g.n_k))
        return None if rows is None else np.broadcast_to(rows, full).copy()
    rows_shape = (*shape[:-2], 1, g.n_k) if len(shape) >= 2 else shape  # the same keys for every query
    small = np.empty(rows_shape, bool)
    flat = small.reshape(-1, g.n_k)
    for i in range(flat.shape[0]):
        flat[i] = pats[order[i % len(pats)]]
    return np.broadcast_to(small, shape).copy()


def blocked_leak(s: Session, case: Case, base: Outcome, passed_mask: np.ndarray | None = None) -> None:
    """Change the K/V of the keys one (batch element, head) blocks for every query (one whose blocked keys
    include the first key, then one whose include the last); that sequence's valid outputs must not move (a
    ``padding-leak`` otherwise). Only its own outputs are compared: a function that mixes batch elements or heads
    is ``batch``'s finding. ``passed_mask``: the mask as passed (broadcast), as in ``base``."""
    allowed = s.allowed(case)
    if case.gqa or allowed.ndim != 4 or base.out.shape != (*case.q.shape[:-1], case.v.shape[-1]):
        return
    dead = ~allowed.any(axis=-2)  # [B, h, n_k]: keys no query of that sequence and head may attend
    groups: list[tuple[int, int]] = []
    for col in (0, -1):
        hit = np.argwhere(dead[..., col])
        if len(hit) and tuple(hit[0]) not in groups:
            groups.append((int(hit[0][0]), int(hit[0][1])))
    if not groups and dead.any():
        at = np.unravel_index(int(np.argmax(dead.sum(axis=-1))), dead.shape[:2])
        groups.append((int(at[0]), int(at[1])))
    rows = allowed.any(axis=-1)
    for b, h in groups:
        k, v = case.k.copy(), case.v.copy()
        keys = np.flatnonzero(dead[b, h])
        k[b, h, keys] = s.rng.normal(0, 3, k[b, h, keys].shape)
        v[b, h, keys] = s.rng.normal(0, 3, v[b, h, keys].shape)
        out = s.call(replace(case, k=k, v=v), passed_mask=passed_mask)
        if not out.ok:
            s.crash(out)
            return
        if out.out.shape != base.out.shape:
            return
        tol = FLOORS[case.dtype] * max(1.0, float(np.max(np.abs(base.out[b, h])))) * 4
        d = np.where(rows[b, h][..., None], change(out.out[b, h], base.out[b, h]), 0.0)
        if np.all(d <= tol):
            continue
        s.compare(out)  # the perturbed case against the reference: its diagnosis may name the leak's cause
        s.bug(
            "padding-leak",
            "the output of valid positions changes when the K/V of keys the mask blocks change",
            f"case {case.label}: {case.shapes()}; blocked keys {keys.tolist()} of batch element {b}, head {h} "
            f"changed; its outputs move by up to {largest(d):.3g} (tolerance {tol:.2g})",
        )
        return


def stateless(s: Session) -> None:
    """Skip a probe whose experiments assume a function without state once ``call-order`` has seen state."""
    if any(o.case.startswith("call-order") for o in s.obs):
        raise ProbeSkip("the function carries state between calls (call-order): its experiments would not hold")


def checked(s: Session, case: Case, key: str, passed_mask: np.ndarray | None = None) -> Outcome:
    """Call ``case`` (its mask passed as ``passed_mask`` when given), compare it with the reference, and change
    what its blocked keys hold. Returns the first call's outcome."""
    s.case_key = key
    out = s.call(case, passed_mask=passed_mask)
    if not out.ok:
        if passed_mask is None:
            s.crash(out)
        return out
    ok = s.compare(out)
    if s.strategy.name != "outputs":  # the experiments below move outputs; the gradients' are grad-batch's
        return out
    if not ok and not named(s, key):
        batch_moves(s, case, out, passed_mask)
    blocked_leak(s, case, out, passed_mask)
    return out


def named(s: Session, key: str) -> bool:
    """Whether a named bug (not a bare mismatch or crash) was seen in the case ``key``."""
    return any(o.case == key and o.finding.code not in NOT_DIAGNOSES for o in s.obs)


def batch_moves(s: Session, case: Case, base: Outcome, passed_mask: np.ndarray | None) -> None:
    """An unnamed mismatch: change the last batch element's inputs, then the last head's; the other batch
    elements' (heads') outputs must not move (a ``batch-leak`` in this case otherwise)."""
    if case.q.ndim != 4 or case.gqa or base.out.shape != (*case.q.shape[:-1], case.v.shape[-1]):
        return
    for axis, what in ((0, "batch element"), (1, "head")):
        n = case.q.shape[axis]
        if n < 2:
            continue
        sel = (-1,) if axis == 0 else (slice(None), -1)
        rest = (slice(0, n - 1),) if axis == 0 else (slice(None), slice(0, n - 1))
        out = s.call(s.perturbed(case, sel), passed_mask=passed_mask)
        if not out.ok or out.out.shape != base.out.shape:
            return
        tol = FLOORS[case.dtype] * max(1.0, float(np.max(np.abs(base.out[rest])))) * 4
        d = change(out.out[rest], base.out[rest])
        if np.any(d > tol):
            s.bug(
                "batch-leak",
                f"the output of {what}s 0..{n - 2} changes when only the last {what} changes",
                f"case {case.label}: {case.shapes()}; max change {largest(d):.3g} (tolerance {tol:.2g})",
            )
            return


def broadcast_shapes(s: Session, g: Geom) -> list[tuple[int, ...]]:
    """The broadcast mask shapes the mask form accepts for 4-D geometry ``g`` (none for forms without one)."""
    b, h, n_q, n_k = g.b or 1, g.h, g.n_q, g.n_k
    mode = str(getattr(s.backend.resolved, "mode", "") or "")
    if g.b is None or (mode and not mode.startswith("backward")):  # module mode builds its own masks
        return []
    if s.mask_form == "full":
        return [(n_k,), (n_q, n_k), (b, 1, 1, n_k), (b, 1, n_q, n_k), (1, h, n_q, n_k)]
    if s.mask_form == "batch":
        return [(b, 1, 1, n_k)]
    return []


@probe("grad-mask-space")
@probe("mask-space")
def mask_space(s: Session) -> None:
    """The ``mask-space`` probe: padding anywhere, per batch element and head, broadcast (see the module)."""
    stateless(s)
    if "mask" not in s.caps:
        raise ProbeSkip("needs mask")
    seen: set[tuple[int, int]] = set()
    for n_q, n_k in SIZES:
        g = fitted(s, Geom(3, 2, n_q, n_k, 4, 4))
        if (g.n_q, g.n_k) in seen:
            continue
        seen.add((g.n_q, g.n_k))
        m = patterned_mask(s, g)
        if m is None:
            raise ProbeSkip("mask_form='varlen' holds prefixes only")
        label = f"mask space {g.n_q}x{g.n_k}"
        checked(s, s.make(g, s.primary, label=label, mask=m), f"mask-space: {label}")
    g = fitted(s, Geom(2, 2, 7, 11, 4, 4))
    refused = []
    for shape in broadcast_shapes(s, g):
        small = patterned_mask(s, g, shape)
        assert small is not None  # broadcast shapes exist only for full and batch forms
        label = f"mask broadcast {list(shape)}"
        out = checked(s, s.make(g, s.primary, label=label, mask=small), f"mask-space: {label}", small)
        if not out.ok:
            refused.append(f"{list(shape)}: {(out.error_text.splitlines() or ['error'])[0][:120]}")
    if refused:
        s.note(
            "mask-broadcast",
            "your function refuses some mask shapes that broadcast to [B, h, n_q, n_k]; they were not checked",
            "; ".join(refused),
            "broadcast the mask to the scores' shape (np.broadcast_to / Tensor.expand) or declare mask_form=...",
        )


@probe("grad-decode")
@probe("decode")
def decode(s: Session) -> None:
    """The ``decode`` probe: one query with key padding, then with padding and causal (see the module)."""
    stateless(s)
    g = fitted(s, Geom(2, 2, 1, 17, 4, 4))
    if g.n_q != 1:
        raise ProbeSkip("needs n_q != n_k (cross)")
    if "mask" not in s.caps and "causal" not in s.caps:
        raise ProbeSkip("needs mask or causal")
    # a bool causal flag's alignment is the forward's business; the gradient side decodes causally when declared
    causal = "causal" in s.caps and "causal-cross" in s.caps
    causal = causal and (s.strategy.name == "outputs" or s.spec.causal_align is not None)
    if "mask" in s.caps and s.mask_form != "varlen":
        m = patterned_mask(s, g)
        if m is None:  # not reached: only packed sequences (varlen) have no pattern
            raise ProbeSkip("no key-padding pattern for this mask form")
        checked(s, s.make(g, s.primary, label="decode + mask", mask=m), "decode: key padding")
        if causal:
            g = replace(g, n_k=19)  # a new shape: a cache keyed by shape is seen by call-order, not here
            m = patterned_mask(s, g)
            if m is None:
                raise ProbeSkip("no key-padding pattern for this mask form")
            case = s.make(g, s.primary, label="decode + mask + causal", mask=m, causal=True)
            checked(s, case, "decode: key padding + causal")
    elif causal:
        checked(s, s.make(g, s.primary, label="decode + causal", causal=True), "decode: causal")
    else:
        raise ProbeSkip("needs mask, or causal with a declared causal_align")


def matches(s: Session, out: Outcome) -> bool:
    """Whether ``out`` is within the reference's bound (no diagnosis)."""
    if not out.ok:
        return False
    golden, tol, rows = s.expected(out.case)
    return compare(out.out, golden, tol, rows).ok


@probe("call-order")
def call_order(s: Session) -> None:
    """The ``call-order`` probe: state carried from one call to the next (see the module)."""
    with_mask = "mask" in s.caps and s.mask_form != "varlen"
    cases = []
    for i, g in enumerate((Geom(1, 3, 1, 7, 4, 4), Geom(2, 1, 1, 10, 4, 4))):
        g = fitted(s, g)
        for j in range(2):
            m = patterned_mask(s, g) if with_mask else None
            label = f"call order {'AC'[i] if j == 0 else 'BD'[i]}"
            cases.append(s.make(g, s.primary, label=label, mask=m if m is not None else False))
    s.case_key = "call-order: A, B (one shape), C, D (another), A"
    outs = []
    for case in (*cases, cases[0]):
        out = s.call(case)
        if not out.ok:
            s.crash(out)
            return
        outs.append(out)
    a1, b1, c1, d1, a2 = outs
    shapes = f"A, B {cases[0].shapes()}; C, D {cases[2].shapes()}"
    _, tol, rows = s.expected(a1.case)
    moved = largest(np.where(rows[..., None], change(a2.out, a1.out), 0.0)) if a2.out.shape == a1.out.shape else 0.0
    if moved > tol:  # a NaN or infinity that stays the same is no change
        s.bug(
            "nondeterministic",
            "the same inputs give a different output after other calls: the function carries state from one "
            "call to the next (a KV cache or buffer never reset)",
            f"calls A, B, C, D, A: {shapes}; the second call of A differs from the first by {moved:.3g} "
            f"(tolerance {tol:.2g})",
        )
        return
    first = [matches(s, o) for o in (a1, c1)]
    second = [matches(s, o) for o in (b1, d1)]
    if all(first) and not any(second):
        s.bug(
            "nondeterministic",
            "the first call of each shape is right and the second, with new values, wrong: the output depends on "
            "an earlier call (a cache or memo keyed by shape, not by the values)",
            f"calls A, B, C, D: {shapes}; A and C match the reference, B and D do not",
        )
