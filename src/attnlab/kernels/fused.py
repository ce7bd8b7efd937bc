"""Fused passes over a float32 score block, compiled with numba when it is installed (``attnlab[fast]``).

NumPy runs one element-wise operation per pass: in the tiled kernel, "exponentiate the block, zero the masked
entries, sum the rows" is three or four passes over a 1 MiB block, ~17 % of the block's two matrix products at
d = 64 (docs/performance.md). Here each is one pass, with the row sums accumulated while the values are in
registers:

* :func:`exp2_block` — ``s <- 2 ** (a · s + c · bias - off[:, None])``, masked entries 0, optionally
  ``rowsum <- s.sum(1)``;
* :func:`ds_block` — the backward's ``dp <- p * (dp - delta[:, None])``.

The exponential is our own: ``2 ** x = 2 ** n · 2 ** f`` with ``n = rint(x)``, ``f in [-1/2, 1/2]``, ``2 ** f`` a
degree-6 polynomial (a least-squares fit in float64, relative error 2.6e-9 before float32 rounding) and ``2 ** n``
added to the exponent bits. Measured against float64 ``exp2`` on 4 million points of ``[-126, 128)``: at most
0.95 float32 ulp (NumPy's own float32 ``exp2``: 2.74; ``python benchmarks/bench_blocks.py --only accuracy``;
``tests/test_fused.py`` asserts < 1). Results below the smallest
normal float32 (``x < -126``) are flushed to 0 (``exp2`` would give a subnormal below 1.2e-38: the kernels
divide by row sums >= 1, or by sums of terms >= 2**-87, where such a term cannot change a float32 result);
``x >= 128`` gives ``inf`` and NaN stays NaN.

:func:`exp2_block` and :func:`ds_block` are the argument-checked entry points (for users, benchmarks and tests) to
the compiled passes the tiled kernel calls unchecked, block by block, through :func:`kernels` (``exp2_rows``, which
checks every input's range, ``exp2_rows_bounded`` for scores the kernel has bounded, ``ds_rows``): the checks would
cost a few microseconds per block. They run exactly those passes.

float32 only (float64 keeps NumPy's ``exp2``/``exp``). The passes release the GIL, so the kernel's worker
threads run them in parallel. numba is imported on first use (:func:`kernels`), not by ``import attnlab``;
without it, :data:`AVAILABLE` is False and the tiled kernels use NumPy passes.
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

import numpy as np

from ..errors import AttnlabWarning, DTypeError, OptionError, ShapeError, missing_extra

__all__ = ["AVAILABLE", "ds_block", "exp2_block", "kernels", "usable", "version"]

#: numba is installed: the tiled kernels use the fused passes for float32.
AVAILABLE = importlib.util.find_spec("numba") is not None


def version() -> str | None:
    """numba's version, or None without numba."""
    if not AVAILABLE:
        return None
    import importlib.metadata  # ~8 ms: not at ``import attnlab`` time

    return importlib.metadata.version("numba")


_jit: Any = None  # the compiled module, once imported


def kernels() -> Any:
    """The compiled passes (:mod:`attnlab.kernels._fused_jit`; the first call imports numba and loads or compiles
    them). Raises :class:`~attnlab.errors.MissingExtraError` without numba."""
    global _jit
    if not AVAILABLE:
        raise missing_extra("numba", "fast")
    if _jit is None:
        from . import _fused_jit

        _jit = _fused_jit
    return _jit


_loaded: dict[Any, bool] = {}  # per loader (kernels): did it load? (absent: not tried yet)


def usable() -> bool:
    """True when the fused passes can run here: numba is installed and loads (the first call imports it and loads
    or compiles the passes). A numba that is installed but does not load (say, built for another NumPy) is reported
    once with an :class:`~attnlab.errors.AttnlabWarning`, and the kernels use NumPy passes instead. The answer is
    remembered for the loader that gave it (:func:`kernels`; a test that replaces it is answered afresh)."""
    if not AVAILABLE:
        return False
    loader = kernels
    if loader not in _loaded:
        try:
            loader()
            _loaded[loader] = True
        except Exception as err:  # ImportError, or numba's own error on a NumPy it does not support
            _loaded[loader] = False
            warnings.warn(
                f"numba is installed but does not load ({type(err).__name__}: {err}); the tiled kernels use NumPy's "
                f"exponential instead, ~1.2x slower. Reinstall it to match NumPy: pip install -U 'attnlab[fast]'",
                AttnlabWarning,
                stacklevel=3,
            )
    return _loaded[loader]


def _check(name: str, x: Any, shape: tuple[int, ...] | None, dtype: Any = np.float32) -> None:
    if not isinstance(x, np.ndarray) or x.dtype != dtype:
        got = f"{type(x).__name__} {getattr(x, 'dtype', '')}".strip()
        raise DTypeError(f"{name}: expected a NumPy {np.dtype(dtype)} array, got {got}")
    if shape is not None and x.shape != shape:
        raise ShapeError(f"{name}: shape {x.shape}, expected {shape}")


def _check_block(name: str, x: Any) -> None:
    _check(name, x, None)
    if x.ndim != 2 or not x.flags.c_contiguous or not x.flags.writeable:
        raise ShapeError(
            f"{name}: expected a writeable C-contiguous [bq, bk] block, got shape {x.shape} "
            f"(C-contiguous: {x.flags.c_contiguous}, writeable: {x.flags.writeable})"
        )


def exp2_block(
    s: np.ndarray,
    off: np.ndarray | None = None,
    bad: np.ndarray | None = None,
    rowsum: np.ndarray | None = None,
    *,
    bias: np.ndarray | None = None,
    bias_scale: float = 1.0,
    scale: float = 1.0,
    bounded: bool = False,
) -> None:
    """In place: ``s[i, j] <- 2 ** (scale · s[i, j] + bias_scale · bias[i, j] - off[i])``, 0 where ``bad[i, j]``;
    ``rowsum[i] <- sum_j s[i, j]``.

    Args:
        s: the score block ``[bq, bk]``, float32, C-contiguous; overwritten with the (masked) powers.
        off: per-row offsets ``[bq]`` float32, or None for 0 (``+inf`` gives a row of zeros).
        bad: ``[bq, bk]`` bool, True = blocked (set to 0), or None.
        rowsum: ``[bq]`` float32, overwritten with the row sums of the result, or None.
        bias: ``[bq, bk]`` float32 added (times ``bias_scale``, in float32) before the exponential, or None; any
            strides (a broadcast view is read as it is).
        scale: multiplies ``s`` (in float32, rounded as a product alone) before the bias and the offset.
        bounded: the caller guarantees ``-126 <= scale · s + bias_scale · bias <= 128`` (``off`` must be None):
            skips the range checks for ``-inf``, overflow and NaN, ~30 % faster. The tiled forward proves the bound
            from the norms of q and k; outside it the result is wrong, not an error.

    >>> import numpy as np
    >>> s = np.array([[0.0, 1.0, -1.0], [3.0, -np.inf, 0.5]], dtype=np.float32)
    >>> sums = np.empty(2, dtype=np.float32)
    >>> exp2_block(s, rowsum=sums)
    >>> s.tolist(), sums.tolist()
    ([[1.0, 2.0, 0.5], [8.0, 0.0, 1.4142135381698608]], [3.5, 9.414213180541992])
    """
    jit = kernels()
    _check_block("s", s)
    bq, bk = s.shape
    if off is not None:
        _check("off", off, (bq,))
    if bad is not None:
        _check("bad", bad, (bq, bk), np.bool_)
    if rowsum is not None:
        _check("rowsum", rowsum, (bq,))
    if bias is not None:
        _check("bias", bias, (bq, bk))
    c, a = np.float32(bias_scale), np.float32(scale)
    if not np.isfinite(c):
        raise OptionError(f"bias_scale: expected a finite number, got {bias_scale!r}")
    if not np.isfinite(a):
        raise OptionError(f"scale: expected a finite number, got {scale!r}")
    if bounded:
        if off is not None:
            raise OptionError("off: must be None with bounded=True (the bound is on s itself)")
        jit.exp2_rows_bounded(s, a, bias, c, bad, rowsum)
    else:
        jit.exp2_rows(s, a, bias, c, np.zeros(bq, dtype=np.float32) if off is None else off, np.float32(1), bad, rowsum)


def ds_block(dp: np.ndarray, delta: np.ndarray, p: np.ndarray) -> None:
    """In place: ``dp[i, j] <- p[i, j] * (dp[i, j] - delta[i])`` (the backward's ``dS``), float32 ``[bq, bk]``.

    >>> import numpy as np
    >>> dp = np.array([[1.0, 2.0]], dtype=np.float32)
    >>> ds_block(dp, np.array([0.5], dtype=np.float32), np.array([[0.25, 0.75]], dtype=np.float32))
    >>> dp.tolist()
    [[0.125, 1.125]]
    """
    jit = kernels()
    _check_block("dp", dp)
    _check("delta", delta, dp.shape[:1])
    _check("p", p, dp.shape)
    jit.ds_rows(dp, delta, p)
