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
    here, apart from attnlab.checker.shrink, so that a minimality test does not reuse the shrinker's own moves."""
    from dataclasses import replace

    import numpy as np

    def drop(x: Any, axis: int, i: Any) -> Any:
        return None if x is None else np.delete(x, i, axis=axis)

    out = []
    if case.q.ndim == 4:
        for b in range(case.q.shape[0] if case.q.shape[0] > 1 else 0):
            out.append(
                replace(
                    case, q=drop(case.q, 0, b), k=drop(case.k, 0, b), v=drop(case.v, 0, b), mask=drop(case.mask, 0, b)
                )
            )
    ax = case.q.ndim - 3
    h, h_kv = case.q.shape[ax], case.k.shape[ax]
    g = h // h_kv
    for j in range(h_kv if h_kv > 1 else 0):
        group = [j * g + r for r in range(g)] if gqa != "tile" else [j + r * h_kv for r in range(g)]
        out.append(
            replace(
                case,
                q=drop(case.q, ax, group),
                k=drop(case.k, ax, j),
                v=drop(case.v, ax, j),
                mask=drop(case.mask, ax, group),
            )
        )
    for i in range(case.q.shape[-2] if case.q.shape[-2] > 1 else 0):
        out.append(replace(case, q=drop(case.q, -2, i), mask=drop(case.mask, -2, i)))
    for j in range(case.k.shape[-2] if case.k.shape[-2] > 1 else 0):
        out.append(replace(case, k=drop(case.k, -2, j), v=drop(case.v, -2, j), mask=drop(case.mask, -1, j)))
    return out
