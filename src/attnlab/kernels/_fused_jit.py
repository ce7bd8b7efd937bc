"""The compiled passes behind :mod:`attnlab.kernels.fused`; importing this module imports numba.

Compiled once per argument types and cached on disk by numba (``__pycache__`` beside this file, or numba's user
cache directory where that is read-only). Callers check arguments (:mod:`attnlab.kernels.fused` does).
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

# 2 ** f on [-1/2, 1/2], lowest degree first: a least-squares fit of exp2 on 2,000 Chebyshev nodes in float64
# (relative error 2.6e-9 before float32 rounding)
COEFFICIENTS = (
    0.9999999999595485,
    0.6931472067106206,
    0.24022651213595303,
    0.0555032721420935,
    0.009618025602938276,
    0.0013400432165303034,
    0.00015469731978695714,
)

_FM = {"contract", "reassoc"}  # FMA and a vectorised row sum; no finite-math assumptions (inf, NaN kept)
# 2 · 2 ** f: the factor 2 lets the exponent step be n - 1, so that n = 128 (x in [127.5, 128)) stays finite
_c0, _c1, _c2, _c3, _c4, _c5, _c6 = (np.float32(2.0 * c) for c in COEFFICIENTS)
_LO, _HI = np.float32(-126.0), np.float32(128.0)
_ZERO, _ONE, _INF = np.float32(0.0), np.float32(1.0), np.float32(np.inf)


def _compiled(fn: Any) -> Any:
    """numba-compiled, GIL released, cached on disk; compiled in memory where no cache directory is writable (numba
    refuses ``cache=True`` there)."""
    try:
        return numba.njit(nogil=True, fastmath=_FM, cache=True)(fn)
    except RuntimeError:
        return numba.njit(nogil=True, fastmath=_FM)(fn)


@numba.njit(inline="always", fastmath=_FM)
def _pow2(x: Any) -> Any:  # pragma: no cover - compiled
    """``2 ** x`` for ``-126 <= x <= 128`` (the caller guarantees it)."""
    n = np.rint(x)
    f = x - n
    p = _c6
    p = p * f + _c5
    p = p * f + _c4
    p = p * f + _c3
    p = p * f + _c2
    p = p * f + _c1
    p = p * f + _c0
    return np.int32(np.float32(p).view(np.int32) + ((np.int32(n) - np.int32(1)) << 23)).view(np.float32)


@numba.njit(inline="always", fastmath=_FM)
def _exp2(x: Any) -> Any:  # pragma: no cover - compiled
    """``2 ** x`` for any float32: 0 below -126, inf from 128 on, NaN for NaN."""
    y = _pow2(min(max(x, _LO), _HI))
    y = _ZERO if x < _LO else y
    y = _INF if x >= _HI else y
    return x if x != x else y


@_compiled
def exp2_rows(s: Any, a: Any, bias: Any, c: Any, off: Any, p: Any, bad: Any, rowsum: Any) -> None:  # pragma: no cover
    """``s <- 2 ** (p · (a · s + c · bias - off[:, None]))``, 0 where ``bad``; ``rowsum <- s.sum(1)``. ``off`` is a
    float32 array ``[bq]`` (``+inf`` gives a row of zeros); ``bias``, ``bad`` and ``rowsum`` may be None; ``a``,
    ``c`` and ``p`` are float32. Every input is range-checked (``-inf``, overflow, NaN). For scores the caller has
    bounded, :func:`exp2_rows_bounded`.

    ``z = fl(a · s) + c · bias`` is rounded as the naive ``fl(fl(Q Kᵀ) · scale) + bias`` is (``+ 0`` keeps the
    compiler from fusing the product into the subtraction), the offset is subtracted (exactly, where the weights
    matter) and only the difference is multiplied by ``p`` (``log2(e)`` for logits in nats):
    ``p · a · s - p · off`` would round numbers as large as the logits. ``a`` is the part of the logits' factor
    that is not a power of two (the tiled kernel folds only a power of two into Q: exact)."""
    _rows(s, a, bias, c, off, p, bad, rowsum)


@_compiled
def exp2_rows_bounded(s: Any, a: Any, bias: Any, c: Any, bad: Any, rowsum: Any) -> None:  # pragma: no cover
    """``s <- 2 ** (a · s + c · bias)``, 0 where ``bad``; ``rowsum <- s.sum(1)``: no offset, and the caller
    guarantees ``-126 <= a · s + c · bias <= 128`` (the tiled forward proves it from the norms of q and k), so the
    range checks for ``-inf``, overflow and NaN are left out (~30 % faster; outside the bound the result is wrong,
    not an error). ``bias``, ``bad`` and ``rowsum`` may be None; ``a`` and ``c`` are float32."""
    _rows(s, a, bias, c, None, _ONE, bad, rowsum)


@_compiled
def _rows(s: Any, a: Any, bias: Any, c: Any, off: Any, p: Any, bad: Any, rowsum: Any) -> None:  # pragma: no cover
    """The loop of both: ``off`` None (typed ``none``: numba compiles the bounded case on its own, without the
    other's branch) or an array."""
    bq, bk = s.shape
    for i in range(bq):
        acc = _ZERO
        for j in range(bk):
            # fl(a · s), rounded as the product alone: "+ 0" keeps it out of the next fused multiply-add (contracted,
            # fma(a, s, 0) rounds once), which then adds the bias exactly: fma(c, bias, z)
            z = a * s[i, j] + _ZERO
            if bias is not None:
                z = z + c * bias[i, j]
            if off is None:
                y = _pow2(z)
            else:
                y = _exp2(p * (z - off[i]))
            if bad is not None:
                y = _ZERO if bad[i, j] else y
            s[i, j] = y
            acc += y
        if rowsum is not None:
            rowsum[i] = acc


@_compiled
def ds_rows(dp: Any, delta: Any, p: Any) -> None:  # pragma: no cover - compiled
    """``dp <- p * (dp - delta[:, None])``."""
    bq, bk = dp.shape
    for i in range(bq):
        d = delta[i]
        for j in range(bk):
            dp[i, j] = p[i, j] * (dp[i, j] - d)
