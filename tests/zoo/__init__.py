"""The bug zoo: deliberately broken attention implementations (and correct ones) the checker must diagnose.

Each :class:`Entry` names a function, the options that describe it to :func:`attnlab.checker.check`, the finding
codes it must produce (empty for correct implementations) and other codes its bug legitimately also causes.
The zoo lives in the tests, not in the installed package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Entry:
    name: str
    fn: Any
    expected: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    also: tuple[str, ...] = ()
    subtle: bool = False
    doc: str = ""


def all_entries() -> list[Entry]:
    from .numpy_zoo import ENTRIES as NP
    from .torch_zoo import ENTRIES as TORCH

    return [*NP, *TORCH]


def one_step_smaller(case: Any, gqa: str = "interleave") -> list[Any]:
    """Every case one step smaller than the canonical ``case`` (``q [B, h, n_q, d_k]`` or ``[h, n_q, d_k]``): one
    batch element, one head (with GQA: one K/V head with its query group), one query or one key removed. Written
    here, apart from attnlab.checker.shrink, so that a minimality test does not reuse the shrinker's own moves. A
    gradient case's ``d_out [..., h, n_q, d_v]``, ``keep`` and ``bias [..., h, n_q, n_k]`` lose the same entries."""
    from dataclasses import replace

    import numpy as np

    def drop(x: Any, axis: int, i: Any) -> Any:
        return None if x is None else np.delete(x, i, axis=axis)

    def cut(case: Any, idx: Any, q_axis: int | None, mask_axis: int, **arrays: Any) -> Any:
        """``case`` with ``arrays``; a gradient case's d_out cut along q's axis, its keep and bias the mask's."""
        d_out = getattr(case, "d_out", None)
        if d_out is not None and q_axis is not None:
            arrays["d_out"] = drop(d_out, q_axis, idx)
        for name in ("keep", "bias"):
            if getattr(case, name, None) is not None:
                arrays[name] = drop(getattr(case, name), mask_axis, idx)
        return replace(case, **arrays)

    out = []
    if case.q.ndim == 4:
        for b in range(case.q.shape[0] if case.q.shape[0] > 1 else 0):
            q, k, v, m = (drop(x, 0, b) for x in (case.q, case.k, case.v, case.mask))
            out.append(cut(case, b, 0, 0, q=q, k=k, v=v, mask=m))
    ax = case.q.ndim - 3
    h, h_kv = case.q.shape[ax], case.k.shape[ax]
    g = h // h_kv
    for j in range(h_kv if h_kv > 1 else 0):
        group = [j * g + r for r in range(g)] if gqa != "tile" else [j + r * h_kv for r in range(g)]
        q, m = drop(case.q, ax, group), drop(case.mask, ax, group)
        out.append(cut(case, group, ax, ax, q=q, k=drop(case.k, ax, j), v=drop(case.v, ax, j), mask=m))
    for i in range(case.q.shape[-2] if case.q.shape[-2] > 1 else 0):
        out.append(cut(case, i, -2, -2, q=drop(case.q, -2, i), mask=drop(case.mask, -2, i)))
    for j in range(case.k.shape[-2] if case.k.shape[-2] > 1 else 0):
        k, v = drop(case.k, -2, j), drop(case.v, -2, j)
        out.append(cut(case, j, None, -1, k=k, v=v, mask=drop(case.mask, -1, j)))
    return out


def reproduction_fails(text: str, fn: Any = None) -> str | None:
    """The AssertionError message of a reproduction script run on its own (in a fresh namespace), or None. ``fn``:
    the function, for a script that leaves ``fn = ...`` to fill in (a zoo entry made by a factory has no importable
    name)."""
    lines = ["pass" if fn is not None and line.startswith("fn = ...") else line for line in text.splitlines()]
    try:
        exec(compile("\n".join(lines), "<reproduction>", "exec"), {} if fn is None else {"fn": fn})
    except AssertionError as err:
        return str(err) or "AssertionError"
    return None


def same_failure(message: str | None, first: str) -> bool:
    """Whether a reproduction's failure ``message`` is the same kind of failure as ``first``: the same exception
    raised, a wrong output (or gradient: any of them, a smaller case may show the bug in another one), or the same
    property."""
    if message is None:
        return False
    if first.startswith("fn raised"):
        return message.split(":")[0] == first.split(":")[0]
    wrong = ("max |out - expected|", "output shape", "max |d", "dq shape", "dk shape", "dv shape", "dbias shape")
    if first.startswith(wrong):
        return message.startswith(wrong)
    return message.split(" ")[:2] == first.split(" ")[:2]


def assert_findings_minimal(report: Any, fn: Any = None) -> None:
    """Issue 20 §3 on one report: every finding carries its smallest failing case (a ``timeout`` is shown as seen);
    its printed reproduction, run on its own, fails (up to 3 tries: noise); every case one step smaller
    (:func:`one_step_smaller`) passes or fails another way. ``fn``: as :func:`reproduction_fails`."""
    import textwrap

    for f in report.findings:
        m = f.minimal
        if f.code == "timeout":  # a hanging call is not shrunk (each call may take the whole time limit)
            assert m is not None and not m.shrunk and "time limit" in m.reason
            continue
        if f.code == "mod-mismatch":  # about a declared mod, not a call: its evidence is the smallest geometry
            assert m is None and f.evidence.startswith("geometry B, h, n_q, n_k = ")
            continue
        assert m is not None and m.shrunk and not m.bounded, (f.code, report.to_text())
        assert textwrap.indent(m.reproduction, "    ").rstrip() in report.to_text()
        assert m.as_dict()["reproduction"] == m.reproduction
        tries = (reproduction_fails(m.reproduction, fn) for _ in range(3))
        first = next((t for t in tries if t is not None), None)
        assert first is not None, (f.code, m.reproduction)
        if f.code == "nondeterministic":  # a smaller case may agree twice by chance: minimality is not testable
            continue
        for smaller in one_step_smaller(m.case, m.gqa):
            message = reproduction_fails(m.script(smaller), fn)
            assert not same_failure(message, first), (f.code, smaller.shapes(), first, message)
