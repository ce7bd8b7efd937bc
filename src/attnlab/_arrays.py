"""Meeting arrays as they come: NumPy, PyTorch, JAX or any array-API library, plus plain nested lists.

The core is written once against the array API standard. NumPy (>= 2) implements it in its main namespace, so a
NumPy-only install needs nothing else; other libraries go through ``array-api-compat`` (installed with the
``torch`` extra), imported only when such an array is actually passed in.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import DTypeError, missing_extra

__all__ = ["compute_dtype", "device_of", "index_tuples", "namespace", "shape_of", "to_numpy"]


def _is_plain(x: Any) -> bool:
    return isinstance(x, (np.ndarray, np.generic, list, tuple, int, float, bool))


def namespace(*arrays: Any) -> Any:
    """The array namespace shared by ``arrays`` (``None`` entries ignored); NumPy for NumPy arrays and lists."""
    present = [a for a in arrays if a is not None]
    foreign = [a for a in present if not _is_plain(a)]
    if not foreign:
        return np
    try:
        import array_api_compat
    except ImportError:  # pragma: no cover - exercised only without the extra
        kind = type(foreign[0]).__module__.split(".")[0]
        raise missing_extra(f"array-api-compat (needed for {kind} arrays)", "torch") from None
    try:
        return array_api_compat.array_namespace(*foreign)
    except TypeError as err:
        kinds = sorted({f"{type(a).__module__}.{type(a).__name__}" for a in present})
        raise DTypeError(f"arrays of different libraries cannot be mixed: got {', '.join(kinds)}") from err


def device_of(x: Any) -> Any:
    """The device of ``x`` (``None`` for NumPy), for creating companion arrays next to it."""
    if isinstance(x, np.ndarray):
        return None
    import array_api_compat

    return array_api_compat.device(x)


def shape_of(x: Any) -> tuple[int, ...]:
    """``x.shape`` as a tuple of Python ints."""
    return tuple(int(s) for s in x.shape)


def _is_bfloat16(dtype: Any) -> bool:
    return "bfloat16" in str(dtype)


def compute_dtype(xp: Any, dtype: Any, name: str) -> tuple[Any, Any]:
    """The dtype to compute in and the dtype to return, for an input of ``dtype`` called ``name``.

    float64 computes in float64; float32, float16 and bfloat16 compute in float32 and return their own dtype;
    integers and booleans are promoted to float64 (the articles' examples are integers). Complex is refused.
    """
    if _is_bfloat16(dtype):
        return xp.float32, dtype
    if xp.isdtype(dtype, ("bool", "integral")):
        return xp.float64, xp.float64
    if not xp.isdtype(dtype, "real floating"):
        raise DTypeError(f"{name}: dtype {dtype} is not supported; expected a real floating or integer dtype")
    if dtype == xp.float64:
        return xp.float64, xp.float64
    return xp.float32, dtype


def to_numpy(x: Any) -> np.ndarray:
    """A NumPy copy (or view) of ``x`` for inspection on the host; bfloat16 comes back as float32."""
    if isinstance(x, np.ndarray):
        return x
    if _is_plain(x):
        return np.asarray(x)
    module = type(x).__module__.split(".")[0]
    if module == "torch":
        t = x.detach().cpu()
        if _is_bfloat16(t.dtype):
            t = t.float()
        return t.numpy()
    try:
        return np.asarray(x)
    except (TypeError, ValueError, RuntimeError):
        return np.from_dlpack(x)


def index_tuples(where: Any, limit: int | None = None) -> tuple[tuple[int, ...], ...]:
    """The index of every True entry of ``where`` (any array library), as tuples of Python ints, in C order."""
    found = np.argwhere(to_numpy(where))
    return tuple(tuple(int(i) for i in r) for r in found[:limit])
