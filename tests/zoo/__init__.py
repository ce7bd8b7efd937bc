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
