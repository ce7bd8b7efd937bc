"""How a sequence of length n is split across P ranks along the sequence axis (context parallelism).

Two layouts, both pure bookkeeping (no communication, no torch needed):

* ``"contiguous"``: rank r holds positions ``[r·n/P, (r+1)·n/P)``. Simple; under a causal mask the last rank
  does most of the work (its queries see every key) and the first almost none.
* ``"zigzag"``: the sequence is cut into 2P chunks and rank r holds chunks ``r`` and ``2P-1-r``: one early and
  one late chunk each, so every rank does the same amount of causal work (each off-diagonal ring step is exactly
  half a block for every rank).

When n is not divisible by the number of chunks, the first ``n mod chunks`` chunks are one position longer.

>>> lay = RingLayout(10, 2, "zigzag")
>>> lay.chunks(0), lay.chunks(1)
(((0, 3), (8, 10)), ((3, 6), (6, 8)))
>>> lay.positions(1).tolist()
[3, 4, 5, 6, 7]
>>> print(lay.to_string())
rank 0: 0 0 0 ⬚ ⬚ ⬚ ⬚ ⬚ 0 0
rank 1: ⬚ ⬚ ⬚ 1 1 1 1 1 ⬚ ⬚
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .._arrays import namespace, shape_of
from ..errors import ShapeError
from ..validate import check_choice, check_int

__all__ = ["LAYOUTS", "Layout", "RingLayout"]

#: The values of ``layout=``: how the sequence is split across the ranks (:class:`RingLayout`).
Layout = Literal["contiguous", "zigzag"]
#: Every :data:`Layout`; ``contiguous`` is the default.
LAYOUTS: tuple[str, ...] = ("contiguous", "zigzag")


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` consecutive ranges covering ``[0, n)``, the first ``n mod parts`` one longer."""
    base, extra = divmod(n, parts)
    out, start = [], 0
    for c in range(parts):
        stop = start + base + (1 if c < extra else 0)
        out.append((start, stop))
        start = stop
    return out


@dataclass(frozen=True)
class RingLayout:
    """The split of a sequence of ``n`` positions over ``world_size`` ranks.

    Args:
        n: global sequence length (>= world_size for "contiguous", >= 2·world_size for "zigzag").
        world_size: number of ranks P.
        kind: ``"contiguous"`` or ``"zigzag"``.

    Shapes: :meth:`shard` takes ``x [..., n, d]`` and returns rank r's ``[..., n_r, d]``; :meth:`unshard` is its
    inverse over all ranks' shards.
    """

    n: int
    world_size: int
    kind: Layout = "contiguous"

    def __post_init__(self) -> None:
        for name, val in (("n", self.n), ("world_size", self.world_size)):
            check_int(name, val, minimum=1)
        check_choice("layout", self.kind, LAYOUTS)
        need = self.world_size * (2 if self.kind == "zigzag" else 1)
        if self.n < need:
            raise ShapeError(
                f"n: a {self.kind!r} layout over P={self.world_size} ranks cuts the sequence into {need} chunks, "
                f"so it needs n >= {need}; got n={self.n}"
                + (" (use layout='contiguous' for very short sequences)" if self.kind == "zigzag" else "")
            )

    def _check_rank(self, rank: int) -> int:
        return check_int("rank", rank, minimum=0, maximum=self.world_size - 1)

    def chunks(self, rank: int) -> tuple[tuple[int, int], ...]:
        """The global ``(start, stop)`` ranges rank ``rank`` holds, in the order they are stored locally."""
        r = self._check_rank(rank)
        if self.kind == "contiguous":
            return (_split(self.n, self.world_size)[r],)
        parts = _split(self.n, 2 * self.world_size)
        return (parts[r], parts[2 * self.world_size - 1 - r])

    def size(self, rank: int) -> int:
        """How many positions rank ``rank`` holds."""
        return sum(b - a for a, b in self.chunks(rank))

    def sizes(self) -> tuple[int, ...]:
        """Every rank's shard length, rank 0 first."""
        return tuple(self.size(r) for r in range(self.world_size))

    def positions(self, rank: int) -> np.ndarray:
        """The global positions ``[n_r]`` of rank ``rank``'s local rows, in local order."""
        return np.concatenate([np.arange(a, b) for a, b in self.chunks(rank)])

    def shard(self, x: Any, rank: int) -> Any:
        """Rank ``rank``'s rows of ``x [..., n, d]`` along axis -2 (a new array; ``x`` is not modified)."""
        s = shape_of(x)
        if len(s) < 2 or s[-2] != self.n:
            raise ShapeError(f"x: expected [..., n={self.n}, d] to shard along axis -2, got shape {s}")
        xp = namespace(x)
        parts = [x[..., a:b, :] for a, b in self.chunks(rank)]
        return parts[0] if len(parts) == 1 and xp is np else xp.concat(parts, axis=-2)

    def unshard(self, shards: Any) -> Any:
        """The full ``[..., n, d]`` from every rank's shard (rank 0 first), in global order."""
        shards = list(shards)
        if len(shards) != self.world_size:
            raise ShapeError(f"shards: expected {self.world_size} shards (one per rank), got {len(shards)}")
        pieces: list[tuple[int, Any]] = []
        for r, x in enumerate(shards):
            s = shape_of(x)
            if len(s) < 2 or s[-2] != self.size(r):
                raise ShapeError(f"shards[{r}]: expected [..., n_r={self.size(r)}, d] for rank {r}, got shape {s}")
            off = 0
            for a, b in self.chunks(r):
                pieces.append((a, x[..., off : off + b - a, :]))
                off += b - a
        pieces.sort(key=lambda t: t[0])
        xp = namespace(*[p for _, p in pieces])
        return xp.concat([p for _, p in pieces], axis=-2)

    def to_string(self) -> str:
        """One line per rank: the rank number at the positions it holds, ``⬚`` elsewhere (n <= 64 only)."""
        if self.n > 64:
            raise ShapeError(f"n: to_string draws layouts of n <= 64 positions, got n={self.n}")
        lines = []
        for r in range(self.world_size):
            held = set(self.positions(r).tolist())
            lines.append(f"rank {r}: " + " ".join(str(r) if i in held else "⬚" for i in range(self.n)))
        return "\n".join(lines)
