"""Assertions for your own test suite: is my attention correct, and is this output close enough?

:func:`assert_attention_close` implements the tolerance rule of FlashAttention's and PyTorch's tests: the error of
``actual`` against a float64 ``expected`` must be at most ``factor`` times the error of a same-precision
``reference`` (a naive implementation in the same dtype), plus a per-dtype floor times the output's magnitude.

>>> import numpy as np
>>> from attnlab import scaled_dot_product_attention as sdpa
>>> q = k = v = np.eye(3, dtype=np.float32)
>>> expected = sdpa(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
>>> assert_attention_close(sdpa(q, k, v), expected)
>>> try:
...     assert_attention_close(sdpa(q, k, v) + 0.01, expected)
... except AssertionError as err:
...     print(str(err).split(" (float32")[0])
output: max |actual - expected| = 0.01 at (0, 1) exceeds the tolerance 1e-05

Every helper sets ``__tracebackhide__`` (as pytest's own helpers do), so a failing assertion in pytest shows the
line of your test and the message, not attnlab's source.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._arrays import to_numpy
from .checker.tolerance import FLOORS
from .errors import AttnlabError, DTypeError, OptionError
from .validate import check_choice, check_float

__all__ = [
    "assert_attention_close",
    "assert_attention_correct",
    "assert_attention_grads_correct",
    "assert_grads_close",
]


def _dtype_name(x: Any) -> str:
    return str(getattr(x, "dtype", "float64")).replace("torch.", "")


def _bound_options(factor: Any, floor: Any, dtype: Any) -> tuple[float, float | None]:
    """``factor`` and ``floor`` as finite numbers >= 0 (NaN or inf would pass anything), ``dtype`` a known floor."""
    __tracebackhide__ = True
    try:  # re-raised here so that pytest shows this message, not the validator's source
        fac = check_float("factor", factor, minimum=0)
        fl = None if floor is None else check_float("floor", floor, minimum=0)
        if dtype is not None:
            check_choice("dtype", dtype, tuple(FLOORS))
    except OptionError as err:
        raise OptionError(str(err)) from None
    return fac, fl


def _real(name: str, x: Any) -> np.ndarray:
    """``x`` as float64 NumPy; a complex array is refused (its imaginary part would be dropped silently)."""
    __tracebackhide__ = True
    arr = np.asarray(to_numpy(x))
    if arr.dtype.kind == "c":
        raise DTypeError(
            f"{name}: complex dtype {arr.dtype} (shape {arr.shape}); attention outputs are real: compare "
            "x.real and x.imag separately if you mean to"
        )
    return np.asarray(arr, dtype=np.float64)


def assert_attention_close(
    actual: Any,
    expected: Any,
    *,
    reference: Any | None = None,
    dtype: str | None = None,
    factor: float = 2.0,
    floor: float | None = None,
    name: str = "output",
) -> None:
    """Assert ``max|actual - expected| <= factor · max|reference - expected| + floor · max(1, max|expected|)``.

    Args:
        actual: the output under test ``[..., n_q, d_v]`` (any array library).
        expected: the float64 golden output, same shape.
        reference: a naive implementation's output in ``actual``'s precision (e.g. PyTorch's math backend, or
            :func:`attnlab.checker.tolerance.naive_output`). Without it the bound is the floor alone.
        dtype: the precision of ``actual`` (default: its dtype), choosing the floor.
        factor: the multiple of the reference's error allowed (2 for outputs, 3 for gradients).
        floor: the absolute floor (default per dtype: float64 1e-10, float32 1e-5, float16 1e-3, bfloat16 1e-2).
        name: what the message calls ``actual``.

    Raises:
        AssertionError: naming the largest error, where it is, and the bound it broke; also when shapes differ
            or ``actual`` holds NaN/inf where ``expected`` is finite.
        OptionError: ``factor`` or ``floor`` is negative, NaN or infinite (a bound that passes anything), or
            ``dtype`` is not one of float64, float32, float16, bfloat16.
        DTypeError: ``actual``, ``expected`` or ``reference`` is complex.
    """
    __tracebackhide__ = True
    factor, floor = _bound_options(factor, floor, dtype)
    dt = dtype or _dtype_name(actual)
    a = _real(name, actual)
    e = _real("expected", expected)
    if a.shape != e.shape:
        raise AssertionError(f"{name}: shape {a.shape} does not match expected {e.shape}")
    fl = FLOORS.get(dt, 1e-5) if floor is None else floor
    mag = max(1.0, float(np.max(np.abs(e[np.isfinite(e)]))) if np.isfinite(e).any() else 1.0)
    base = 0.0
    if reference is not None:
        r = _real("reference", reference)
        if r.shape != e.shape:
            raise AssertionError(f"reference: shape {r.shape} does not match expected {e.shape}")
        err_r = np.abs(r - e)
        base = float(np.max(err_r[np.isfinite(err_r)])) if np.isfinite(err_r).any() else 0.0
    tol = factor * base + fl * mag
    bad = np.isfinite(e) & ~np.isfinite(a)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"{name}: {int(bad.sum())} non-finite value(s) where expected is finite, first at {where}")
    with np.errstate(invalid="ignore"):
        diff = np.where(np.isfinite(e), np.abs(a - e), 0.0)
    if diff.size == 0:
        return
    idx = np.unravel_index(int(np.argmax(diff)), diff.shape)
    worst = float(diff[idx])
    if worst > tol:
        raise AssertionError(
            f"{name}: max |actual - expected| = {worst:.3g} at {tuple(int(i) for i in idx)} exceeds the tolerance "
            f"{tol:.3g} ({dt}: {factor:g} x reference error {base:.2g} + floor {fl:g} x {mag:.3g})"
        )


def assert_attention_correct(fn: Callable[..., Any], **options: Any) -> Any:
    """Run :func:`attnlab.checker.check` on ``fn`` and raise ``AssertionError`` with the report unless the verdict
    is clean: a bug found, or an incomplete battery (a core probe that could not run, e.g. left out with
    ``probes=``) both fail, since neither shows the function correct.

    ``fn`` may also be a target string ``"path/to/file.py:func"`` (checked in a worker process).
    ``options`` are :func:`~attnlab.checker.check`'s keyword arguments (framework, signature, mask_convention, ...).
    Returns the :class:`~attnlab.checker.Report` when ``fn`` is clean, so tests can look at its notes.
    """
    __tracebackhide__ = True
    from .checker import check

    try:
        report = check(fn, **options)
    except AttnlabError as err:  # a usage error: its message, without the checker's frames
        raise err.with_traceback(None) from None
    if not report.ok:
        raise AssertionError(f"{report.summary}\n{report.to_text()}")
    return report


#: The gradients' names, in the order a backward returns them.
GRAD_NAMES = ("dq", "dk", "dv", "dbias")


def assert_grads_close(
    actual: Any,
    expected: Any,
    *,
    reference: Any | None = None,
    dtype: str | None = None,
    factor: float = 3.0,
    floor: float | None = None,
) -> None:
    """FlashAttention's rule for gradients: each of ``actual`` (``(dq, dk, dv)`` or ``(dq, dk, dv, dbias)``, or one
    array) is within ``factor`` (3) times the error of a same-precision naive backward (``reference``, same
    structure) plus the per-dtype floor of the float64 ``expected``.

    ``reference`` may come from :func:`attnlab.checker.grad_hypotheses.attention_grads` with ``dtype=``; without it
    the bound is the floor alone. ``dtype`` chooses the floor (default: each gradient's dtype).

    >>> import numpy as np
    >>> g = (np.ones(3), np.zeros(3), np.ones(3))
    >>> assert_grads_close(g, g)
    >>> try:
    ...     assert_grads_close((g[0], g[1] + 1e-3, g[2]), g)
    ... except AssertionError as err:
    ...     print(str(err).split(" (float64")[0])
    dk: max |actual - expected| = 0.001 at (0,) exceeds the tolerance 1e-10

    Raises:
        AssertionError: naming the first gradient that breaks its bound, the error, where, and the bound; also when
            the number of gradients or a shape differs.
        OptionError, DTypeError: as :func:`assert_attention_close`.
    """
    __tracebackhide__ = True
    many = isinstance(actual, (tuple, list))
    acts = tuple(actual) if many else (actual,)
    exps = tuple(expected) if isinstance(expected, (tuple, list)) else (expected,)
    refs: tuple[Any, ...] = (None,) * len(exps) if reference is None else (tuple(reference) if many else (reference,))
    if len(acts) != len(exps):
        raise AssertionError(f"gradients: got {len(acts)} arrays, expected {len(exps)}")
    if len(refs) != len(exps):
        raise AssertionError(f"reference: got {len(refs)} arrays, expected {len(exps)}")
    for i, (a, e, r) in enumerate(zip(acts, exps, refs, strict=True)):
        if a is None and e is None:
            continue
        name = GRAD_NAMES[i] if many and i < len(GRAD_NAMES) else "gradient"
        assert_attention_close(a, e, reference=r, dtype=dtype, factor=factor, floor=floor, name=name)


def assert_attention_grads_correct(fn_or_bwd: Callable[..., Any] | str, **options: Any) -> Any:
    """Run the gradient oracle and raise ``AssertionError`` with the report unless the verdict is clean.

    ``fn_or_bwd`` is a forward (PyTorch or JAX: its own gradients are checked, forward battery first), a
    hand-written backward ``bwd(q, k, v, d_out, ...)`` or ``bwd(q, k, v, out, lse, d_out, ...)`` (detected from
    its parameter names; checked alone, or with ``forward=fwd``), or a target string. ``options`` are those of
    :func:`attnlab.checker.check` / :func:`attnlab.checker.check_backward` (``backward=bwd`` checks ``fn``
    as the forward of ``bwd``). Returns the :class:`~attnlab.checker.Report` when clean.
    """
    __tracebackhide__ = True
    from .checker import check, check_backward
    from .checker.gradient_oracle import detect_kind

    try:
        if "backward" in options:
            report = check(fn_or_bwd, **options)
        else:
            fn = fn_or_bwd
            if isinstance(fn, str):
                from .checker.gradient_oracle import load_callable

                fn = load_callable(fn)
            autograd = detect_kind(fn) == "autograd" and "forward" not in options
            if autograd and options.get("kind") in (None, "autograd"):
                options.pop("kind", None)
                report = check(fn_or_bwd, backward=True, **options)
            else:
                report = check_backward(fn_or_bwd, **options)
    except AttnlabError as err:  # a usage error: its message, without the checker's frames
        raise err.with_traceback(None) from None
    if not report.ok:
        raise AssertionError(f"{report.summary}\n{report.to_text()}")
    return report
