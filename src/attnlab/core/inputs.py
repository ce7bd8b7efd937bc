"""Validation and preparation of attention inputs, shared by every attention variant.

Each check raises an error that names the argument, its shape or value, and what was expected. Nothing here
writes into the caller's arrays: conversions to the compute dtype make new arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from .. import masks as _masks
from .._arrays import compute_dtype, compute_dtypes, device_of, namespace, shape_of, to_numpy
from ..errors import DTypeError, MaskError, NonFiniteError, RangeError, ShapeError
from ..validate import check_float

__all__ = [
    "Causal",
    "CoreOptions",
    "MaskedRows",
    "Prepared",
    "as_array",
    "cast_checked",
    "check_finite",
    "check_policy",
    "check_temperature",
    "fits_float32",
    "in_float64",
    "max_abs",
    "prepare",
    "resolve_causal",
    "resolve_scale",
]

#: The values of ``causal=``: ``True`` (n_q == n_k), ``"top_left"`` or ``"bottom_right"``; ``False`` for none.
Causal = bool | Literal["top_left", "bottom_right"]
#: The values of ``masked_rows=``, the policy for a query row with no allowed key.
MaskedRows = Literal["raise", "zero", "nan"]
_POLICIES = ("raise", "zero", "nan")


@dataclass(frozen=True)
class CoreOptions:
    """The options of :func:`attnlab.scaled_dot_product_attention` besides the arrays, as one value (what
    :func:`prepare` validates); fields and defaults as its keywords."""

    causal: Causal = False
    scale: float | None = None
    temperature: float = 1.0
    masked_rows: MaskedRows = "raise"


@dataclass(frozen=True)
class Prepared:
    """Validated inputs in the compute dtype.

    Shapes: q ``[..., n_q, d_k]``, k ``[..., n_k, d_k]``, v ``[..., n_k, d_v]``; ``mask`` and ``bias``
    broadcastable to ``[*batch, n_q, n_k]`` (``None`` when absent); ``causal`` is None or an alignment; ``spec`` the
    mask's structure (:class:`~attnlab.masks.MaskSpec`, sized: causal, window, lengths, segments; ``mask`` is its
    dense part).
    ``bias_source`` is the caller's bias before the conversion (for :func:`in_float64`).
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
    bias_source: Any | None = field(default=None, repr=False)
    spec: _masks.MaskSpec = field(default_factory=_masks.MaskSpec)  # sized; its dense part is ``mask``

    @property
    def scores_shape(self) -> tuple[int, ...]:
        """``(*batch, n_q, n_k)``: the shape of the scores and weights."""
        return (*self.batch, self.n_q, self.n_k)

    def allowed(self) -> Any:
        """The boolean mask actually applied (``mask`` AND the structure: causal, window, lengths, segments),
        broadcast to ``[*batch, n_q, n_k]``."""
        xp = self.xp
        full = self.scores_shape
        parts = []
        if self.mask is not None:
            parts.append(self.mask)
        s = self.spec.structure()  # [S, n_q, n_k] or None; S (1 or B) runs along the first batch axis
        if s is not None:
            s = s[0] if len(full) == 2 else s.reshape((s.shape[0],) + (1,) * (len(full) - 3) + s.shape[1:])
            parts.append(s if xp is np else xp.asarray(s, device=device_of(self.q)))
        if not parts:
            return xp.ones(full, dtype=xp.bool) if xp is np else xp.ones(full, dtype=xp.bool, device=device_of(self.q))
        allowed = parts[0]
        for p in parts[1:]:
            allowed = xp.logical_and(allowed, p)
        return xp.broadcast_to(allowed, full)


def as_array(x: Any, name: str, *, optional: bool = False) -> Any:
    """Lists and scalars become NumPy arrays; arrays are returned as they are (never copied, never written).

    NumPy subclasses other than masked arrays (``np.matrix``) are viewed as plain ``ndarray``; masked arrays and
    non-arrays are refused later, by :func:`~attnlab._arrays.namespace`, with the argument's ``name``. ``None`` is
    refused by name unless ``optional`` (then it stays ``None``).
    """
    if x is None:
        if optional:
            return None
        raise DTypeError(f"{name}: expected an array (NumPy, PyTorch, any array-API library) or nested lists, got None")
    if isinstance(x, (list, tuple, int, float, np.generic)):
        try:
            return np.asarray(x)
        except (ValueError, TypeError):
            raise ShapeError(f"{name}: nested lists of unequal lengths do not form an array") from None
    if type(x) is not np.ndarray and isinstance(x, np.ndarray) and not isinstance(x, np.ma.MaskedArray):
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


def max_abs(xp: Any, x: Any) -> float:
    """The largest magnitude in ``x`` as a Python float, for messages."""
    return float(to_numpy(xp.max(xp.abs(x))))


def cast_checked(xp: Any, x: Any, dtype: Any, name: str) -> Any:
    """``x`` converted to ``dtype``, or a :class:`~attnlab.errors.RangeError` if a finite value of ``x`` does not fit.

    For results computed in float32 and returned in float16 or bfloat16 (whose range is smaller).
    """
    with np.errstate(over="ignore", invalid="ignore"):  # what does not fit is found below, and explained
        y = xp.astype(x, dtype, copy=False)
    if y.dtype == x.dtype:
        return y
    fits = xp.logical_or(xp.isfinite(y), xp.logical_not(xp.isfinite(x)))
    if bool(xp.all(fits)):
        return y
    where = tuple(int(i) for i in np.argwhere(~to_numpy(fits))[0])
    shown = str(dtype).replace("torch.", "")
    raise RangeError(
        f"{name}: {float(to_numpy(x)[where]):.7g} at index {where} does not fit in {shown} (largest finite "
        f"{float(xp.finfo(dtype).max):.7g}), the inputs' dtype it is returned in; pass float32 inputs (then "
        f"the result is float32) or scale the inputs down"
    )


def check_policy(masked_rows: Any) -> str:
    """``masked_rows`` itself when it is ``"raise"``, ``"zero"`` or ``"nan"``; otherwise a
    :class:`~attnlab.errors.MaskError` naming the choices."""
    if masked_rows not in _POLICIES:
        raise MaskError(f"masked_rows: expected one of 'raise', 'zero', 'nan', got {masked_rows!r}")
    return str(masked_rows)


def resolve_causal(causal: Any, n_q: int, n_k: int) -> str | None:
    """``False`` -> None; ``True`` -> "top_left" when n_q == n_k, else an error with both alignments drawn (the
    :class:`~attnlab.masks.MaskSpec` rule)."""
    return _masks.MaskSpec(causal=causal).sized(n_q, n_k).align


def _number(value: Any) -> Any:
    """0-d arrays (``np.float32(2)`` already passes; ``torch.tensor(0.5)``, ``np.array(0.5)``) as Python floats."""
    if hasattr(value, "shape") and shape_of(value) == () and not isinstance(value, (bool, np.bool_)):
        try:
            return float(value)
        except (TypeError, ValueError):
            return value
    return value


def resolve_scale(scale: Any, d_k: int) -> float:
    """``scale`` as a finite float (an :class:`~attnlab.errors.OptionError` otherwise); ``None`` gives 1/sqrt(d_k)."""
    if scale is None:
        return 1.0 / math.sqrt(d_k)
    return check_float("scale", _number(scale))


def check_temperature(temperature: Any) -> float:
    """``temperature`` as a finite float > 0 (an :class:`~attnlab.errors.OptionError` otherwise)."""
    return check_float("temperature", _number(temperature), positive=True)


def fits_float32(xp: Any, scale: float, temperature: float, bias: Any | None) -> bool:
    """Whether float32 can hold ``scale``, ``temperature`` and the bias as normal numbers (else compute in float64).

    A scale or temperature outside float32's normal range (``1.18e-38 .. 3.4e38``) would be rounded to 0, a
    subnormal or infinity when applied to float32 scores, and a float64 bias beyond float32's largest value
    would become infinite.
    """
    f = np.finfo(np.float32)
    tiny, big = float(f.smallest_normal), float(f.max)
    if scale != 0 and not tiny <= abs(scale) <= big:
        return False
    if not tiny <= temperature <= big:
        return False
    if bias is not None and xp.isdtype(bias.dtype, "real floating") and bias.dtype != xp.float32:
        if max_abs(xp, bias) > big:
            return False
    return True


def _broadcast_into(name: str, shape: tuple[int, ...], full: tuple[int, ...], q: Any, k: Any, v: Any) -> None:
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


def _companion(xp: Any, q: Any, name: str, x: Any) -> Any:
    """A mask or bias next to ``q``: a NumPy array is moved to ``q``'s library; any other library must be ``q``'s."""
    namespace(**{name: x})  # refuses masked arrays, meta tensors and non-arrays by name
    if isinstance(x, np.ndarray):
        return x if xp is np else xp.asarray(x, device=device_of(q))
    namespace(q=q, **{name: x})  # refuses a tensor mask next to NumPy q, naming both
    return x


def in_float64(p: Prepared) -> Prepared:
    """``p`` recomputed in float64: q, k, v upcast (exactly), the bias converted again from the caller's array.

    Used when float32 logits overflow: float64 holds every float32, float16 and bfloat16 value exactly.
    """
    xp = p.xp
    bias = None if p.bias is None else xp.astype(p.bias_source, xp.float64)
    return replace(
        p, q=xp.astype(p.q, xp.float64), k=xp.astype(p.k, xp.float64), v=xp.astype(p.v, xp.float64), bias=bias
    )


def prepare(q: Any, k: Any, v: Any, mask: Any = None, bias: Any = None, options: CoreOptions | None = None) -> Prepared:
    """Validate the arguments of :func:`attnlab.scaled_dot_product_attention` and convert to the compute dtype.

    The compute dtype is float64 for float64, integer and long-double inputs, float32 for float32, float16 and
    bfloat16 inputs, except that float32 inputs are computed in float64 when float32 cannot hold the scale,
    the temperature or the bias (:func:`fits_float32`). ``mask`` may be a boolean array or a
    :class:`~attnlab.masks.MaskSpec` (with ``options.causal`` left False; its ``dense`` part is the boolean array).
    ``options`` (default :class:`CoreOptions`'s defaults) holds the keyword options.
    """
    o = CoreOptions() if options is None else options
    spec = _masks.MaskSpec.build(mask, causal=o.causal)
    q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    mask, bias = as_array(spec.dense, "mask", optional=True), as_array(bias, "bias", optional=True)
    xp = namespace(q=q, k=k, v=v)
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

    cdt, out_dtype = compute_dtypes(xp, q=q, k=k, v=v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_finite(xp, x, name)
    scale_f = resolve_scale(o.scale, d_k)
    temperature_f = check_temperature(o.temperature)
    spec = replace(spec, dense=None).sized(n_q, n_k, batch[0] if batch else 1)
    policy = check_policy(o.masked_rows)

    if mask is not None:
        mask = _companion(xp, q, "mask", mask)
        if not xp.isdtype(mask.dtype, "bool"):
            raise DTypeError(
                f"mask: dtype {mask.dtype} is not a boolean mask (True = may attend); convert it first: "
                f"additive float masks with attnlab.masks.from_additive (from_torch_sdpa, from_hf), 0/1 masks with "
                f"masks.from_keep, True = blocked masks with masks.from_blocked"
            )
        _broadcast_into("mask", shape_of(mask), full, qs, ks, vs)
    if bias is not None:
        bias = _companion(xp, q, "bias", bias)
        if xp.isdtype(bias.dtype, "bool"):
            raise DTypeError("bias: got a bool array; a boolean mask goes in mask= (True = may attend)")
        compute_dtype(xp, bias.dtype, "bias")
        _broadcast_into("bias", shape_of(bias), full, qs, ks, vs)
        try:
            check_finite(xp, bias, "bias")
        except NonFiniteError as err:
            raise NonFiniteError(
                f"{err} (to block keys use mask=, or masks.from_additive for additive masks)"
            ) from None
    if cdt == xp.float32 and not fits_float32(xp, scale_f, temperature_f, bias):
        cdt = xp.float64

    return Prepared(
        xp=xp,
        q=xp.astype(q, cdt),
        k=xp.astype(k, cdt),
        v=xp.astype(v, cdt),
        mask=mask,
        bias=None if bias is None else xp.astype(bias, cdt),
        causal=spec.align,
        scale=scale_f,
        temperature=temperature_f,
        masked_rows=policy,
        out_dtype=out_dtype,
        batch=batch,
        n_q=n_q,
        n_k=n_k,
        d_k=d_k,
        d_v=d_v,
        bias_source=bias,
        spec=spec,
    )
