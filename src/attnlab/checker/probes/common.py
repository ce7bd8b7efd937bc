"""Helpers the probes share."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from ..registry import ProbeSkip
from ..runner import Case, Outcome
from ..tolerance import expand_kv

if TYPE_CHECKING:
    from ..gradient_oracle import GradReturned
    from ..session import Session

__all__ = ["base_call", "change", "golden_logit_range", "grad_pairs", "largest", "repeated", "report_leak", "require"]


def change(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``|a - b|`` where a NaN (or an infinity) that stays the same is no change, and a new one an infinite one."""
    with np.errstate(invalid="ignore", over="ignore"):
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        return np.where(same, 0.0, np.where(np.isfinite(a) & np.isfinite(b), np.abs(a - b), np.inf))


def largest(d: np.ndarray) -> float:
    """The largest entry of a non-empty array of changes (inf when one is infinite)."""
    return float(np.max(d)) if d.size else 0.0


def golden_logit_range(case: Case, mapping: str = "interleave") -> tuple[float, float]:
    """The smallest and the largest scaled logit ``q kᵀ · scale`` of ``case`` (for evidence lines)."""
    k = expand_kv(case.q, case.k, mapping)
    s0 = case.scale if case.scale is not None else 1 / math.sqrt(case.q.shape[-1])
    lg = case.q @ np.swapaxes(k, -1, -2) * s0
    return float(lg.min()), float(lg.max())


def base_call(s: Session, case: Case, key: str) -> Outcome | None:
    """The base call of a perturbation experiment, or None when it failed.

    It is compared with the reference (a named bug it shows is seen in this case, and explains a leak found
    here) and repeated once: noise between two identical calls is nondeterminism, not a leak.
    """
    s.case_key = key
    base = s.call(case)
    if not base.ok:
        s.crash(base)
        return None
    s.compare(base)
    repeated(s, base)
    return base


def repeated(s: Session, first: Outcome) -> bool:
    """Call ``first``'s case again: a ``nondeterministic`` bug when the output is not bitwise the same. True when
    the repeated call returned the same output."""
    again = s.call(first.case)
    if not again.ok:
        s.crash(again)
        return False
    if again.out.shape == first.out.shape and np.array_equal(again.out, first.out, equal_nan=True):
        return True
    diff = np.abs(again.out - first.out) if again.out.shape == first.out.shape else np.array([np.inf])
    s.bug(
        "nondeterministic",
        "the same inputs give different outputs from one call to the next",
        f"case {first.case.label}: {first.case.shapes()}; max difference {float(np.nanmax(diff)):.3g} between two "
        "identical calls",
    )
    return False


def require(s: Session, cap: str) -> None:
    """Skip the probe (``ProbeSkip("needs <cap>")``) unless the function under test has the capability ``cap``."""
    if cap not in s.caps:
        raise ProbeSkip(f"needs {cap}")


def report_leak(s: Session, code: str, message: str, case: Case, found: str, tol: float, *, where: str = "") -> None:
    """Report a leak bug ``code``: changing one part of the inputs moved an output it must not move.

    The evidence line reads ``case <label>: <shapes><where>; <found> (tolerance <tol>)``, ``found`` saying by how
    much it moved, ``where`` (e.g. `` (layout bhnd)``) what else locates the case.
    """
    s.bug(code, message, f"case {case.label}: {case.shapes()}{where}; {found} (tolerance {tol:.2g})")


def grad_pairs(first: GradReturned, second: GradReturned) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """``(name, a, b)`` for each of ``dq``, ``dk``, ``dv`` that both calls returned, with the same shape."""
    for name in ("dq", "dk", "dv"):
        a, b = first.grads.get(name), second.grads.get(name)
        if a is not None and b is not None and a.shape == b.shape:
            yield name, a, b
