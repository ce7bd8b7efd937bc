"""Validation and preparation of attention inputs, shared by every attention variant.

Each check raises an error that names the argument, its shape or value, and what was expected. Nothing here
writes into the caller's arrays: conversions to the compute dtype make new arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .. import masks as _masks
from .._arrays import compute_dtype, device_of, namespace, shape_of, to_numpy
from ..errors import DTypeError, MaskError, NonFiniteError, ShapeError

__all__ = [
    "Causal",
    "MaskedRows",
    "Prepared",
    "check_finite",
    "check_policy",
    "prepare",
    "resolve_causal",
    "resolve_scale",
]

Causal = bool | Literal["top_left", "bottom_right"]
MaskedRows = Literal["raise", "zero", "nan"]
_POLICIES = ("raise", "zero", "nan")


@dataclass(frozen=True)
class Prepared:
    """Validated inputs in the compute dtype.

    Shapes: q ``[..., n_q, d_k]``, k ``[..., n_k, d_k]``, v ``[..., n_k, d_v]``; ``mask`` and ``bias``
    broadcastable to ``[*batch, n_q, n_k]`` (``None`` when absent); ``causal`` is None or an alignment.
    """

    xp: Any
    q: Any
    k: Any
    v: Any
    mask: Any | None
    bias: Any | None
    causal: str | None
    scale: float
    temperature: float
    masked_rows: str
    out_dtype: Any
    batch: tuple[int, ...]
    n_q: int
    n_k: int
    d_k: int
    d_v: int

    @property
    def scores_shape(self) -> tuple[int, ...]:
        return (*self.batch, self.n_q, self.n_k)

    def allowed(self) -> Any:
        """The boolean mask actually applied (``mask`` AND causal), broadcast to ``[*batch, n_q, n_k]``."""
        xp = self.xp
        full = self.scores_shape
        parts = []
        if self.mask is not None:
            parts.append(self.mask)
        if self.causal is not None:
            c = _masks.causal(self.n_q, self.n_k, align=self.causal)
            parts.append(c if xp is np else xp.asarray(c, device=device_of(self.q)))
        if not parts:
            return xp.ones(full, dtype=xp.bool) if xp is np else xp.ones(full, dtype=xp.bool, device=device_of(self.q))
        allowed = parts[0]
        for p in parts[1:]:
            allowed = xp.logical_and(allowed, p)
        return xp.broadcast_to(allowed, full)


def _as_array(x: Any) -> Any:
    """Lists and scalars become NumPy arrays; arrays are returned as they are (never copied, never written)."""
    if isinstance(x, (list, tuple, int, float)):
        return np.asarray(x)
    return x


def check_finite(xp: Any, x: Any, name: str) -> None:
    """Raise :class:`NonFiniteError` naming the first NaN/inf entry of ``x`` and how many there are."""
    finite = xp.isfinite(x)
    if bool(xp.all(finite)):
        return
    bad = np.argwhere(~to_numpy(finite))
    where = tuple(int(i) for i in bad[0])
    value = to_numpy(x)[where]
    raise NonFiniteError(
        f"{name}: holds {value} at index {where} ({len(bad)} non-finite entr{'y' if len(bad) == 1 else 'ies'} "
        f"in shape {shape_of(x)}); attention inputs must be finite"
    )


def check_policy(masked_rows: Any) -> str:
    if masked_rows not in _POLICIES:
        raise MaskError(f"masked_rows: expected one of 'raise', 'zero', 'nan', got {masked_rows!r}")
    return masked_rows


def resolve_causal(causal: Any, n_q: int, n_k: int) -> str | None:
    """``False`` -> None; ``True`` -> "top_left" when n_q == n_k, else an error with both alignments drawn."""
    if causal is False or causal is None:
        return None
    if causal is True:
        if n_q != n_k:
            raise MaskError(_masks.causal_alignment_message(n_q, n_k, "causal=True"))
        return "top_left"
    if causal in ("top_left", "bottom_right"):
        return causal
    raise MaskError(f"causal: expected False, True, 'top_left' or 'bottom_right', got {causal!r}")


def resolve_scale(scale: Any, d_k: int) -> float:
    """``scale`` as a float; ``None`` gives 1/sqrt(d_k)."""
    if scale is None:
        return 1.0 / math.sqrt(d_k)
    try:
        s = float(scale)
    except (TypeError, ValueError):
        raise ShapeError(f"scale: expected a number, got {scale!r}") from None
    if not math.isfinite(s):
        raise NonFiniteError(f"scale: expected a finite number, got {scale!r}")
    return s


def _check_temperature(temperature: Any) -> float:
    try:
        t = float(temperature)
    except (TypeError, ValueError):
        raise ShapeError(f"temperature: expected a positive number, got {temperature!r}") from None
    if not (math.isfinite(t) and t > 0):
        raise ShapeError(f"temperature: expected a finite number > 0, got {temperature!r}")
    return t


def _broadcast_into(name: str, shape: tuple[int, ...], full: tuple[int, ...], q, k, v) -> None:
    """``shape`` must broadcast to ``full`` without growing it (a mask must not invent batch dims)."""
    try:
        grown = np.broadcast_shapes(shape, full)
    except ValueError:
        grown = None
    if grown != full:
        raise ShapeError(
            f"{name}: shape {shape} does not broadcast to the scores' shape {full} [..., n_q, n_k] "
            f"(q {q}, k {k}, v {v})"
        )


def prepare(
    q: Any,
    k: Any,
    v: Any,
    mask: Any = None,
    *,
    bias: Any = None,
    causal: Causal = False,
    scale: float | None = None,
    temperature: float = 1.0,
    masked_rows: MaskedRows = "raise",
) -> Prepared:
    """Validate the arguments of :func:`attnlab.scaled_dot_product_attention` and convert to the compute dtype."""
    q, k, v, mask, bias = map(_as_array, (q, k, v, mask, bias))
    xp = namespace(q, k, v, mask, bias)
    qs, ks, vs = shape_of(q), shape_of(k), shape_of(v)
    shapes = f"(q {qs}, k {ks}, v {vs})"
    for name, s, legend in (("q", qs, "[..., n_q, d_k]"), ("k", ks, "[..., n_k, d_k]"), ("v", vs, "[..., n_k, d_v]")):
        if len(s) < 2:
            raise ShapeError(f"{name}: expected at least 2 dims {legend}, got shape {s} {shapes}")
        if 0 in s:
            raise ShapeError(f"{name}: shape {s} has a zero-length axis; every axis of {legend} must be >= 1")
    if ks[-1] != qs[-1]:
        raise ShapeError(f"k: last dim d_k={ks[-1]} does not match q's d_k={qs[-1]} {shapes}")
    if vs[-2] != ks[-2]:
        raise ShapeError(f"v: n_k={vs[-2]} (dim -2) does not match k's n_k={ks[-2]} {shapes}")
    try:
        batch = tuple(np.broadcast_shapes(qs[:-2], ks[:-2], vs[:-2]))
    except ValueError:
        raise ShapeError(f"q, k, v: leading (batch, head) dims do not broadcast {shapes}") from None
    n_q, n_k, d_k, d_v = qs[-2], ks[-2], qs[-1], vs[-1]
    full = (*batch, n_q, n_k)

    cdt, out_dtype = compute_dtype(xp, xp.result_type(q.dtype, k.dtype, v.dtype), "q, k, v")
    for name, x in (("q", q), ("k", k), ("v", v)):
        compute_dtype(xp, x.dtype, name)
        check_finite(xp, x, name)
    device = device_of(q)

    def to_xp(x: Any) -> Any:
        if xp is np or not isinstance(x, np.ndarray):
            return x
        return xp.asarray(x, device=device)

    if mask is not None:
        mask = to_xp(mask)
        if not xp.isdtype(mask.dtype, "bool"):
            raise DTypeError(
                f"mask: dtype {mask.dtype} is not a boolean mask (True = may attend); convert it first: "
                f"additive float masks with attnlab.masks.from_additive (from_torch_sdpa, from_hf), 0/1 masks with "
                f"masks.from_keep, True = blocked masks with masks.from_blocked"
            )
        _broadcast_into("mask", shape_of(mask), full, qs, ks, vs)
    if bias is not None:
        bias = to_xp(bias)
        if xp.isdtype(bias.dtype, "bool"):
            raise DTypeError("bias: got a bool array; a boolean mask goes in mask= (True = may attend)")
        _broadcast_into("bias", shape_of(bias), full, qs, ks, vs)
        try:
            check_finite(xp, bias, "bias")
        except NonFiniteError as err:
            raise NonFiniteError(
                f"{err} (to block keys use mask=, or masks.from_additive for additive masks)"
            ) from None
        bias = xp.astype(bias, cdt)

    return Prepared(
        xp=xp,
        q=xp.astype(q, cdt),
        k=xp.astype(k, cdt),
        v=xp.astype(v, cdt),
        mask=mask,
        bias=bias,
        causal=resolve_causal(causal, n_q, n_k),
        scale=resolve_scale(scale, d_k),
        temperature=_check_temperature(temperature),
        masked_rows=check_policy(masked_rows),
        out_dtype=out_dtype,
        batch=batch,
        n_q=n_q,
        n_k=n_k,
        d_k=d_k,
        d_v=d_v,
    )
