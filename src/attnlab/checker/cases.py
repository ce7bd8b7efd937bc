"""The cases the probes call the function with: their geometry, the grid, random masks of every mask form.

Cases are canonical: float64 NumPy values exactly representable in the case's dtype, heads before the sequence
axis (``q [B, h, n_q, d_k]`` or ``[h, n_q, d_k]``), masks boolean with True = may attend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from .. import masks as _masks

__all__ = [
    "COMBOS",
    "DTYPE_NAMES",
    "GRID",
    "LENGTH_FORMS",
    "PRECISION",
    "Geom",
    "drawn",
    "indent",
    "random_mask",
    "softmax",
]

#: The dtypes the checker tries, by name, from the most precise.
DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16")

#: Mask forms that describe sequences (a fully masked row is a sequence with no valid key).
LENGTH_FORMS = ("key_padding", "valid_lens", "kv_cache", "varlen")

#: Bits of precision of each dtype (to tell a lower-precision computation from a higher one).
PRECISION = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}


@dataclass(frozen=True)
class Geom:
    """The shape of one case: batch ``b`` (None = 3-D inputs ``[h, n, d]``), ``h`` query heads, ``h_kv`` K/V
    heads (None = ``h``), lengths and head dims."""

    b: int | None
    h: int
    n_q: int
    n_k: int
    d_k: int
    d_v: int
    h_kv: int | None = None

    def lead(self, heads: int) -> tuple[int, ...]:
        """The leading axes for ``heads`` heads: ``(heads,)`` for 3-D inputs, else ``(b, heads)``."""
        return (heads,) if self.b is None else (self.b, heads)


#: The grid of the preflight and the reference probe: (label, geometry, required capabilities, extra).
GRID: list[tuple[str, Geom, tuple[str, ...], dict[str, Any]]] = [
    ("base", Geom(2, 2, 5, 5, 8, 8), (), {}),
    ("base-2", Geom(1, 3, 4, 4, 6, 6), (), {}),
    ("mask", Geom(2, 3, 9, 9, 4, 4), ("mask",), {"mask": True}),
    ("mask-2", Geom(1, 2, 6, 6, 8, 8), ("mask",), {"mask": True}),
    ("causal", Geom(2, 2, 6, 6, 8, 8), ("causal",), {"causal": True}),
    ("causal-2", Geom(1, 1, 7, 7, 4, 4), ("causal",), {"causal": True}),
    ("scale", Geom(1, 2, 5, 5, 8, 8), ("scale",), {"scale": 0.37}),
    ("scale-2", Geom(2, 1, 3, 3, 4, 4), ("scale",), {"scale": 1.7}),
    ("cross", Geom(1, 2, 7, 11, 16, 16), ("cross",), {}),
    ("cross-2", Geom(2, 1, 5, 3, 4, 4), ("cross",), {}),
    ("d_v", Geom(1, 2, 5, 5, 8, 6), ("dv",), {}),
    ("d_v-2", Geom(2, 1, 3, 3, 4, 7), ("dv",), {}),
    ("rank-3", Geom(None, 3, 6, 6, 4, 4), ("rank",), {}),
    ("rank-3b", Geom(None, 1, 5, 5, 3, 3), ("rank",), {}),
    ("gqa", Geom(2, 4, 6, 6, 8, 8, h_kv=2), ("gqa",), {}),
    ("gqa-2", Geom(1, 6, 5, 5, 4, 4, h_kv=3), ("gqa",), {}),
    ("causal+cross", Geom(1, 2, 4, 9, 8, 8), ("causal-cross", "causal", "cross"), {"causal": True}),
    ("causal+cross-2", Geom(2, 1, 3, 7, 4, 4), ("causal-cross", "causal", "cross"), {"causal": True}),
]
#: Combinations the reference probe adds once every capability they need is known to work.
COMBOS: list[tuple[str, Geom, tuple[str, ...], dict[str, Any]]] = [
    ("causal+mask", Geom(1, 2, 13, 13, 5, 7), ("causal", "mask", "dv"), {"causal": True, "mask": True}),
    ("mask+cross", Geom(2, 2, 5, 8, 8, 8), ("mask", "cross"), {"mask": True}),
    ("mask+cross-2", Geom(2, 3, 7, 4, 4, 4), ("mask", "cross"), {"mask": True}),
    (
        "causal+mask+cross",
        Geom(2, 2, 3, 9, 4, 4),
        ("causal", "mask", "cross", "causal-cross"),
        {"causal": True, "mask": True},
    ),
    ("long", Geom(1, 2, 113, 203, 64, 64), ("cross",), {"mask": False}),
    ("long-causal", Geom(1, 1, 97, 97, 32, 32), ("causal",), {"causal": True}),
    ("single", Geom(2, 1, 1, 1, 3, 3), (), {}),
    ("odd", Geom(1, 3, 11, 11, 5, 5), (), {}),
]


def softmax(logits: np.ndarray, axis: int | tuple[int, ...] = -1) -> np.ndarray:
    """Softmax along ``axis`` (one axis, or several taken as one flattened axis) where ``-inf`` entries get 0 and
    empty slices give 0 (never NaN)."""
    m = np.max(logits, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(logits - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


def random_mask(rng: np.random.Generator, g: Geom, form: str = "full") -> np.ndarray:
    """A random mask ``[..., h, n_q, n_k]`` that mask ``form`` can express: different per batch element
    and per head (full form), per batch element (``batch``), per batch element's keys (``key_padding``), or a
    valid length per batch element (``valid_lens``). Key 0 is always allowed; the last key blocked somewhere."""
    full = (*g.lead(g.h), g.n_q, g.n_k)
    form = form if g.b is not None else "full"
    b = g.b if g.b is not None else 1  # the batch size of every form but "full"
    if form == "full":
        m = rng.random(full) < 0.6
    elif form == "batch":
        m = rng.random((b, 1, g.n_q, g.n_k)) < 0.6
    elif form == "key_padding":
        m = rng.random((b, 1, 1, g.n_k)) < 0.6
    elif form == "varlen":  # per sequence: L_q queries and L_k >= L_q keys (prefixes)
        lk = rng.integers(max(1, min(g.n_q, g.n_k) // 2), g.n_k + 1, b)
        lq = np.minimum(rng.integers(1, g.n_q + 1, b), lk)
        lq[0] = min(g.n_q, lk[0])
        spec = _masks.MaskSpec(key_lengths=lk, query_lengths=lq).sized(g.n_q, g.n_k, b)
        m = spec.to_array((b, 1, g.n_q, g.n_k)).copy()  # [B, 1, n_q, n_k]
        if b > 1:
            m[-1, ..., : lq[-1], : lk[-1]] = True
        return np.broadcast_to(m, full).copy()
    elif form == "kv_cache":  # cache lengths: at least n_q (the new queries are in the cache), below n_k
        lengths = rng.integers(min(g.n_q, g.n_k), g.n_k + 1, g.b)
        lengths[-1] = max(min(g.n_q, g.n_k), g.n_k - 1)
        m = _masks.key_padding(lengths, g.n_k)  # [B, 1, 1, n_k]
    else:
        lengths = rng.integers(1, g.n_k + 1, g.b)
        lengths[-1] = max(1, g.n_k - 1) if g.n_k > 1 else 1
        m = _masks.key_padding(lengths, g.n_k)  # [B, 1, 1, n_k]
    m = np.broadcast_to(m, full).copy()
    m[..., 0] = True
    if g.n_k > 1 and form not in ("valid_lens", "kv_cache"):
        m[..., g.n_k - 1] = False
    return m


def drawn(n_q: int, n_k: int, align: str) -> str:
    """The first rows and keys of a causal mask with alignment ``align``, drawn."""
    return _masks.to_string(_masks.causal(min(n_q, 4), min(n_k, 5), align=cast(_masks.Align, align)))


def indent(text: str) -> str:
    """``text`` indented by four spaces."""
    return "\n".join("    " + line for line in text.splitlines())
