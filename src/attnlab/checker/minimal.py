"""A finding's smallest failing case: shrunk, explained and written out as a reproduction, for the report.

:func:`minimal_case` is what the checker runs for every finding it reports (after the probes, only on failures):
it turns the finding's code into a predicate on one call (:func:`predicate`), shrinks the case it was first seen
in (:func:`~attnlab.checker.shrink.shrink`, at most :data:`FINDING_CALLS` calls and :data:`FINDING_SECONDS`
seconds per finding), says what the failure depends on (:func:`~attnlab.checker.depends.depends`, at most 12
calls more) and writes the reproduction (:func:`~attnlab.checker.reproduction.reproduction`).

The predicate of each code: ``crash``, the call raises the same exception type (or returns the same kind of
unusable value); ``dtype``, ``output-type``, ``mutates-input``, the property itself; ``nondeterministic``, two
of three repeated calls differ from the first; ``masked-row-nan`` / ``masked-row-policy``, a fully masked row is
non-finite / breaks the declared policy; every other code, the output differs from the float64 reference beyond
the tolerance rule.
``timeout`` is not shrunk (each call may take the whole time limit). A finding whose case does not fail on one
call (a perturbation experiment that needs two calls to compare) is shown as seen, not shrunk, and says so.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import masks as _masks
from .depends import Depends, allowed_of, depends, wrong_entries
from .reproduction import CallWords, reproduction
from .runner import Case
from .shrink import Shrunk, form_valid, shrink
from .tolerance import bound, expand_kv, golden_output, naive_output

__all__ = [
    "FINDING_CALLS",
    "FINDING_SECONDS",
    "Caller",
    "Minimal",
    "caller_of",
    "minimal_case",
    "predicate",
    "shrink_findings",
    "unshrunk",
]

#: The most predicate calls the shrinking of one finding makes.
FINDING_CALLS = 300
#: The most seconds the shrinking of one finding takes.
FINDING_SECONDS = 20.0


@dataclass(frozen=True)
class Caller:
    """How the checker calls the function and judges one call, in its own terms.

    ``call(case) -> Outcome`` (:class:`~attnlab.checker.runner.Outcome`: ``ok``, ``out``, ``error``,
    ``returned``, ``mutated``) makes one call without recording a finding; ``expected(case) -> (golden, tol,
    rows)``: the float64 reference ``[..., h, n_q, d_v]``, the tolerance rule's bound and the compared rows
    ``[..., h, n_q]``; ``passed(case) -> (case as passed, causal argument)``; ``words``: the call in the adapter's
    words; ``gqa``: the head mapping; ``form``: the mask form; ``masked_rows``: the declared policy;
    ``keep_mask_entries``: the mask holds a per-sequence causal rule (single entries are never changed);
    ``grads``: in a gradient session, its strategy: a call is wrong when a gradient breaks its bound.
    """

    call: Callable[[Case], Any]
    expected: Callable[[Case], tuple[np.ndarray, float, np.ndarray]]
    passed: Callable[[Case], tuple[Case, bool | str]]
    words: CallWords
    gqa: str = "interleave"
    form: str = "full"
    masked_rows: str = "any"
    work: Callable[[str], str] = str  #: the dtype whose tolerance rule applies to a case of a dtype
    #: a gradient session's strategy (:class:`~attnlab.checker.gradients.Gradients`), which judges the calls
    grads: Any = None


@dataclass(frozen=True)
class Minimal:
    """A finding's smallest failing case as the report shows it.

    ``shapes``; ``causal`` (the alignment, or ``""``); ``mask`` (drawn with :func:`attnlab.masks.to_string`, one
    block per distinct batch element and head, ``""`` without a mask); ``first_wrong`` (the first wrong entries
    against the reference); ``depends`` (one paragraph); ``reproduction`` (a script); ``calls`` (spent on it);
    ``bounded`` (a bound stopped the shrinking); ``shrunk`` (False: shown as seen, ``reason`` says why); ``case``
    (the canonical case itself, not in JSON); ``kind`` (what the reproduction asserts). How the case was called,
    for :meth:`script` (not in JSON): ``words``, ``work`` (the dtype whose tolerance rule applies), ``gqa``,
    ``in_mask`` (the causal part went inside the mask), ``flag`` (the causal argument), ``earlier`` (the script
    makes an earlier call first), ``title``.
    """

    shapes: str
    causal: str
    mask: str
    first_wrong: tuple[str, ...]
    depends: str
    reproduction: str
    calls: int
    bounded: bool
    shrunk: bool
    reason: str = ""
    kind: str = "output"
    case: Case | None = field(default=None, repr=False, compare=False)
    words: CallWords = field(default_factory=CallWords, repr=False, compare=False)
    work: str = "float64"
    gqa: str = "interleave"
    in_mask: bool = False
    flag: bool | str = False
    earlier: bool = False
    title: str = ""
    #: a gradient case's bound per gradient (the gradient strategy's), for :meth:`script`
    bounds: Callable[[Case], dict[str, float]] | None = field(default=None, repr=False, compare=False)

    def script(self, case: Case) -> str:
        """The reproduction of ``case`` called as this finding's case was (the same words, causal argument, kind
        and tolerance rule): for the minimal case itself, and for cases one step smaller (which must pass).

        Shapes: ``q [..., h, n_q, d_k]``, ``k``/``v [..., h_kv, n_k, *]``, ``mask [..., h, n_q, n_k]`` or None.
        """
        allowed = allowed_of(case)
        passed = replace(case, mask=allowed, causal=None, flag=False) if self.in_mask else case
        if self.bounds is not None:
            return reproduction(
                case, self.words, tol=self.bounds(case), passed=passed, flag=self.flag, title=self.title, kind=self.kind
            )
        golden = golden_output(case.q, case.k, case.v, case.mask, scale=case.scale, causal=case.causal, gqa=self.gqa)
        naive = naive_output(case.q, case.k, case.v, allowed, dtype=self.work, scale=case.scale, gqa=self.gqa)
        return reproduction(
            case,
            self.words,
            tol=bound(self.work, golden, naive),
            passed=passed,
            flag=self.flag,
            earlier_call=self.earlier,
            title=self.title,
            kind=self.kind,
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready data (a finding's ``minimal`` entry)."""
        return {
            "shrunk": self.shrunk,
            "reason": self.reason,
            "shapes": self.shapes,
            "causal": self.causal,
            "mask": self.mask,
            "first_wrong": list(self.first_wrong),
            "depends": self.depends,
            "reproduction": self.reproduction,
            "calls": self.calls,
            "bounded": self.bounded,
        }

    def lines(self) -> list[str]:
        """The text report's block (indented two spaces, the reproduction four)."""
        head = "smallest case" if self.shrunk else "case (not shrunk: " + self.reason + ")"
        out = [f"  {head}: {self.shapes}" + (f", causal {self.causal}" if self.causal else "")]
        if self.shrunk:
            out[-1] += f" ({self.calls} calls" + (", stopped by the bound)" if self.bounded else ")")
        if self.mask:
            out.append("  mask (■ may attend):")
            out += ["    " + line for line in self.mask.splitlines()]
        for w in self.first_wrong:
            out.append(f"  wrong: {w}")
        if self.depends:  # a paragraph: wrapped, so that text and rich renderings agree at any width over 110
            out += textwrap.wrap(self.depends, 110, initial_indent="  depends: ", subsequent_indent="    ")
        if self.reproduction:
            out.append("  reproduction:")
            out += ["    " + line if line else "" for line in self.reproduction.splitlines()]
        return out


def _drawn(case: Case) -> str:
    if case.mask is None:
        return ""
    m = np.asarray(case.mask)
    flat = m.reshape(-1, *m.shape[-2:])
    lead = m.shape[:-2]
    if all(np.array_equal(flat[0], f) for f in flat[1:]):
        return _masks.to_string(flat[0]) + ("\n(every batch element and head)" if flat.shape[0] > 1 else "")
    blocks = []
    for i, f in enumerate(flat):
        idx = ", ".join(str(int(j)) for j in np.unravel_index(i, lead))
        blocks.append(f"[{idx}]\n{_masks.to_string(f)}")
    return "\n".join(blocks)


def _same_error(first: Any) -> Callable[[Any], bool]:
    e = first.error
    if e is not None:
        return lambda o: o.error is not None and not o.error.library and o.error.type_name == e.type_name
    return lambda o: o.error is None and o.returned.problem is not None


def predicate(code: str, first: Any, caller: Caller) -> tuple[Callable[[Case], bool] | None, str]:
    """The predicate "still fails" of finding ``code`` (see the module doc) and the reproduction's kind, given
    ``first``, the outcome of the call that showed it; ``(None, reason)`` when the code is not shrunk."""
    call = caller.call
    grads = caller.grads
    if code == "timeout":
        return None, "each call may take the whole time limit"
    if code == "crash":
        same = _same_error(first)
        return (lambda c: same(call(c))), "output" if grads is None else "gradients"
    if code == "dtype" and grads is not None:
        return (lambda c: (o := call(c)).ok and bool(set(o.returned.dtypes.values()) - {c.dtype})), "gradients-dtype"
    if code == "dtype":
        return (lambda c: (o := call(c)).ok and o.returned.out_dtype not in (None, c.dtype)), "dtype"
    if code == "output-type":
        kind = "output-type" if grads is None else "gradients"  # a gradient of the wrong kind breaks the compare
        return (lambda c: (o := call(c)).ok and o.returned.wrong_type is not None), kind
    if code == "mutates-input":
        return (lambda c: bool(call(c).mutated)), "mutates" if grads is None else "gradients-mutates"
    if grads is not None:  # every other gradient code: a gradient breaks its bound
        return (lambda c: (o := call(c)).ok and bool(grads.gross_error(o, 0.0))), "gradients"
    if code == "nondeterministic":

        def differs(c: Case) -> bool:  # two of three repeated calls differ from the first: not by chance
            a = call(c)
            if not a.ok:
                return False
            again = [call(c) for _ in range(3)]
            return (
                sum(
                    b.ok and (b.out.shape != a.out.shape or not np.array_equal(a.out, b.out, equal_nan=True))
                    for b in again
                )
                >= 2
            )

        return differs, "nondeterministic"
    if code in ("masked-row-nan", "masked-row-policy"):
        policy = "nan" if code == "masked-row-nan" else caller.masked_rows
        if policy not in ("nan", "zeros", "uniform"):
            return None, f"the declared policy masked_rows={policy!r} names no single output"

        def masked(c: Case) -> bool:
            o = call(c)
            empty = ~allowed_of(c).any(axis=-1)
            if not o.ok or not empty.any() or o.out.shape[:-1] != empty.shape:
                return False
            row = o.out[empty]
            if policy == "nan":
                return not bool(np.isfinite(row).all())
            v = np.broadcast_to(np.mean(_v_heads(c, caller.gqa), axis=-2, keepdims=True), o.out.shape)[empty]
            want = 0.0 if policy == "zeros" else v
            _, tol, _ = caller.expected(c)
            return not bool(np.all(np.abs(row - want) <= tol))

        return masked, f"masked-rows-{policy}"

    def mismatch(c: Case) -> bool:
        o = call(c)
        if not o.ok:
            return False
        golden, tol, rows = caller.expected(c)
        if o.out.shape != golden.shape:
            return True
        sel = np.broadcast_to(rows[..., None], golden.shape)
        with np.errstate(invalid="ignore"):
            return bool(sel.any()) and not bool(np.all(np.abs(o.out - golden)[sel] <= tol))

    return mismatch, "output"


def _v_heads(c: Case, gqa: str) -> np.ndarray:
    return expand_kv(c.q, c.v, gqa)


def unshrunk(case: Case, reason: str) -> Minimal:
    """The case a finding was seen in, shown as seen (not shrunk, for ``reason``)."""
    return Minimal(
        case.shapes(),
        (case.causal or "").replace("_", "-"),
        _drawn(case),
        (),
        "",
        "",
        0,
        False,
        False,
        reason,
        case=case,
    )


def minimal_case(
    code: str,
    case: Case,
    first: Any,
    caller: Caller,
    *,
    title: str = "",
    max_calls: int = FINDING_CALLS,
    seconds: float = FINDING_SECONDS,
) -> Minimal:
    """The smallest failing case of finding ``code``, first seen in ``case`` with outcome ``first`` (see the module
    doc); ``title``: the reproduction's first line."""
    fails, kind = predicate(code, first, caller)
    if fails is None:
        return unshrunk(case, kind)
    valid = form_valid(caller.form)
    shrunk: Shrunk = shrink(
        case,
        fails,
        gqa=caller.gqa,
        valid=valid,
        keep_mask_entries=case.flag or caller.form in ("kv_cache", "varlen"),
        max_calls=max_calls,
        seconds=seconds,
    )
    small = shrunk.case
    reason = "" if shrunk.failed else "the failure does not show on one call of this case alone"
    out = caller.call(small)
    if caller.grads is not None:  # the gradients: the first wrong entries of each wrong one
        got, tol, first_wrong = None, None, caller.grads.first_wrong(out)
    else:
        golden, tol, rows = caller.expected(small)
        got = out.out if out.ok and out.out is not None and out.out.shape == golden.shape else None
        first_wrong = () if got is None else tuple(w.text for w in wrong_entries(got, golden, rows, tol))
    dep: Depends | None = None
    if shrunk.failed:
        dep = depends(shrunk, fails, out=got, gqa=caller.gqa, tol=tol, valid=valid)
    passed, flag = caller.passed(small)
    made = Minimal(
        small.shapes(),
        (small.causal or "").replace("_", "-"),
        _drawn(small),
        first_wrong,
        "" if dep is None else dep.text,
        "",
        shrunk.calls + (0 if dep is None else dep.calls) + 1,
        shrunk.bounded,
        shrunk.failed,
        reason,
        kind,
        case=small,
        words=caller.words,
        work=caller.work(small.dtype),
        gqa=caller.gqa,
        in_mask=small.causal is not None and passed.causal is None,
        flag=flag,
        earlier=dep is not None and any("an earlier call" in n for n in dep.needs),
        title=title,
        bounds=None if caller.grads is None else caller.grads.bounds,
    )
    return replace(made, reproduction=made.script(small))


def caller_of(session: Any) -> Caller:
    """How :func:`minimal_case` calls the function of a :class:`~attnlab.checker.session.Session`: through its
    runner, as the session passes a case, with no finding recorded."""

    def call(case: Case) -> Any:
        d_out = getattr(case, "d_out", None)
        if d_out is not None and d_out.shape != (*case.q.shape[:-1], case.v.shape[-1]):
            raise ValueError("d_out does not fit the case")  # a variant made for outputs: not this failure's
        passed, flag = session.as_passed(case)
        out = session.runner.call(passed, causal_flag=flag, gqa=case.gqa)
        out.case = case
        return out

    backend = session.backend
    adapter = getattr(backend, "adapter", None)
    target = getattr(backend, "target", None) or getattr(adapter, "original", None)
    # a flash backward's own forward: the worker's target names it, an in-process adapter holds it
    forward = getattr(getattr(adapter, "forward", None), "original", None) or getattr(backend.spec, "forward", None)
    return Caller(
        call,
        session.expected,
        session.as_passed,
        CallWords.of(backend.resolved, session.spec, target, forward),
        session.gqa_map,
        session.mask_form,
        getattr(session.spec, "masked_rows", "any"),
        session.work_dtype,
        None if session.strategy.name == "outputs" else session.strategy,
    )


def shrink_findings(session: Any) -> None:
    """Shrink the first failing case of every finding a :class:`~attnlab.checker.session.Session` reports (its
    ``failing`` calls) into its ``minimal`` entries, outputs and gradients alike; once the runner has stopped (a
    timeout, the worker gone), each is shown as seen."""
    bugs, _ = session.strategy.findings()
    caller = None
    for f in bugs:
        seen = session.failing.get(f.code)
        if not seen:
            continue
        if session.runner.stopped is not None and f.code != "timeout":
            session.minimal[f.code] = unshrunk(seen[0].case, f"no call is made after this: {session.runner.stopped}")
            continue
        caller = caller or caller_of(session)
        first = _failing(f.code, seen, caller)
        session.minimal[f.code] = minimal_case(f.code, first.case, first, caller, title=f"{f.code}: {f.message}")


def _failing(code: str, seen: list[Any], caller: Caller) -> Any:
    """Of the calls a finding was recorded after (the compared one first, then the latest), the first whose case
    still fails on one call (a perturbation probe records its finding after its last call, not the one that
    showed it); the first one when none does."""
    for out in seen:
        fails, _ = predicate(code, out, caller)
        try:
            if fails is None or fails(out.case):
                return out
        except Exception:  # the function crashed on it: not this finding's failure
            continue
    return seen[0]
