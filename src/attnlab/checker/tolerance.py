"""The tolerance rule of FlashAttention's and PyTorch's tests, and the references it compares against.

An implementation in precision ``p`` is correct when its error against a float64 golden is at most ``factor``
times the error of a naive implementation computed in the same precision ``p``, plus a small per-dtype floor:

    max|out - golden| <= factor · max|naive_p - golden| + floor(p) · max(1, max|golden|)

with ``factor = 2`` for outputs (FlashAttention uses 3 for gradients). The golden is attnlab's own
:func:`~attnlab.attention_trace` in float64, on the inputs already rounded to ``p``.

>>> import numpy as np
>>> q = k = v = np.eye(2)
>>> golden = golden_output(q, k, v)
>>> bound("float32", golden, naive_output(q, k, v, dtype="float32")) < 1e-4
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from .. import masks as _masks
from ..core import attention_trace
from .adapters import round_to

__all__ = ["FLOORS", "Comparison", "bound", "compare", "golden_output", "naive_output"]

#: Absolute floors per dtype (times the output's magnitude), as in FlashAttention's tests.
FLOORS = {"float64": 1e-10, "float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2}


def expand_kv(q: np.ndarray, x: np.ndarray, mapping: str = "interleave") -> np.ndarray:
    """GQA: K/V heads ``[..., h_kv, n, d]`` expanded to ``q``'s ``h`` heads along axis -3.

    ``mapping="interleave"``: query head i uses K/V head ``i // (h / h_kv)`` (``repeat_interleave``, Hugging
    Face's ``repeat_kv``, PyTorch's ``enable_gqa``); ``"tile"``: K/V head ``i % h_kv`` (``np.tile``/``repeat``).
    """
    if q.ndim < 3 or x.shape[-3] == q.shape[-3]:
        return x
    g = q.shape[-3] // x.shape[-3]
    if mapping == "tile":
        return np.tile(x, (1,) * (x.ndim - 3) + (g, 1, 1))
    return np.repeat(x, g, axis=-3)


_expand_kv = expand_kv


def golden_output(
    q: Any,
    k: Any,
    v: Any,
    allowed: Any = None,
    *,
    scale: float | None = None,
    causal: str | None = None,
    gqa: str = "interleave",
) -> np.ndarray:
    """attnlab's float64 attention ``[..., n_q, d_v]`` (fully masked rows 0). K/V with fewer heads are expanded
    (``gqa``: the head mapping, see :func:`expand_kv`)."""
    q64 = np.asarray(q, dtype=np.float64)
    k64 = expand_kv(q64, np.asarray(k, dtype=np.float64), gqa)
    v64 = expand_kv(q64, np.asarray(v, dtype=np.float64), gqa)
    t = attention_trace(
        q64, k64, v64, allowed, causal=cast(_masks.Align, causal) or False, scale=scale, masked_rows="zero"
    )
    return np.asarray(t.output)


def naive_output(
    q: Any,
    k: Any,
    v: Any,
    allowed: Any = None,
    *,
    dtype: str = "float32",
    scale: float | None = None,
    gqa: str = "interleave",
) -> np.ndarray:
    """A naive implementation where every intermediate is rounded to ``dtype`` (the same-precision baseline).

    Shapes: ``q [..., n_q, d_k]``, ``k [..., n_k, d_k]``, ``v [..., n_k, d_v]``, ``allowed [..., n_q, n_k]``.
    Fully masked rows come out 0.
    """
    work = np.float64 if dtype == "float64" else np.float32

    def r(x: np.ndarray) -> np.ndarray:
        return round_to(np.asarray(x, dtype=work), dtype).astype(work)

    q = np.asarray(q, dtype=work)
    k = expand_kv(q, np.asarray(k, dtype=work), gqa)
    v = expand_kv(q, np.asarray(v, dtype=work), gqa)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = r(r(q @ np.swapaxes(k, -1, -2)) * work(scale))  # [..., n_q, n_k]
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = r(np.exp(s - m))
    den = r(np.sum(e, axis=-1, keepdims=True))
    w = r(np.divide(e, den, out=np.zeros_like(e), where=den > 0))
    return r(w @ v)


def bound(dtype: str, golden: np.ndarray, naive: np.ndarray | None, *, factor: float = 2.0) -> float:
    """The largest acceptable ``max|out - golden|`` under the rule (NaN entries of ``naive`` are ignored)."""
    mag = float(np.max(np.abs(golden))) if golden.size else 1.0
    floor = FLOORS.get(dtype, 1e-5) * max(1.0, mag)
    if naive is None:
        return floor
    err = np.abs(np.asarray(naive, dtype=np.float64) - golden)
    base = float(np.max(err[np.isfinite(err)])) if np.isfinite(err).any() else 0.0
    return factor * base + floor


@dataclass(frozen=True)
class Comparison:
    """``max|actual - expected|`` over the compared rows, where it occurs, and the bound it was held to."""

    max_error: float
    where: tuple[int, ...]
    bound: float
    nonfinite: int

    @property
    def ok(self) -> bool:
        """True when every compared entry is finite and the largest error is within the bound."""
        return self.nonfinite == 0 and self.max_error <= self.bound


def compare(actual: np.ndarray, expected: np.ndarray, tol: float, rows: np.ndarray | None = None) -> Comparison:
    """Compare ``actual`` with ``expected`` (both ``[..., n_q, d_v]``) on the query rows where ``rows`` is True."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        return Comparison(math.inf, (), tol, 0)
    sel = np.ones(a.shape, bool) if rows is None else np.broadcast_to(np.asarray(rows)[..., None], a.shape)
    bad = sel & ~np.isfinite(a)
    with np.errstate(invalid="ignore"):
        diff = np.where(sel & np.isfinite(a), np.abs(a - e), 0.0)
    if not diff.size:
        return Comparison(0.0, (), tol, 0)
    idx = np.unravel_index(int(np.argmax(diff)), diff.shape)
    return Comparison(float(diff[idx]), tuple(int(i) for i in idx), tol, int(bad.sum()))
