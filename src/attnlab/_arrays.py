"""Meeting arrays as they come: NumPy, PyTorch, JAX or any array-API library, plus plain nested lists.

The core is written once against the array API standard. NumPy (>= 2) implements it in its main namespace, so a
NumPy-only install needs nothing else; other libraries go through ``array-api-compat`` (installed with the
``torch`` extra), imported only when such an array is actually passed in.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import DTypeError, missing_extra

__all__ = ["compute_dtype", "compute_dtypes", "device_of", "index_tuples", "namespace", "shape_of", "to_numpy"]


def _is_plain(x: Any) -> bool:
    return isinstance(x, (np.ndarray, np.generic, list, tuple, int, float, bool))


def _kind(x: Any) -> str:
    """``numpy.ndarray``, ``torch.Tensor``, ``list`` ...: how an argument is named in errors."""
    t = type(x)
    module = t.__module__.split(".")[0]
    return t.__name__ if module == "builtins" else f"{module}.{t.__name__}"


def _library(x: Any) -> str | None:
    """The library an array comes from (``numpy``, ``torch``, ...); ``None`` for lists and Python/NumPy scalars."""
    if isinstance(x, np.ndarray):
        return "numpy"
    if _is_plain(x):
        return None
    return type(x).__module__.split(".")[0]


def namespace(*arrays: Any, **named: Any) -> Any:
    """The array namespace shared by ``arrays`` (``None`` entries ignored); NumPy for NumPy arrays and lists.

    Keyword arguments are arrays too, named in errors by their keyword (``namespace(q=q, k=k, v=v)``); positional
    ones are named ``argument 0``, ``argument 1`` ... Every array must come from one library: a NumPy array next
    to a PyTorch tensor is a :class:`~attnlab.errors.DTypeError` that says which argument is which (lists and
    Python or NumPy scalars go with anything). Also refused, by name: objects that are not arrays, NumPy masked
    arrays (what their mask means is ambiguous), PyTorch ``meta`` tensors (they hold no values) and arrays on
    different devices.
    """
    items = [(f"argument {i}", a) for i, a in enumerate(arrays)] + list(named.items())
    present = [(n, a) for n, a in items if a is not None]
    for name, a in present:
        if isinstance(a, np.ma.MaskedArray):
            raise DTypeError(
                f"{name}: a numpy.ma.MaskedArray is refused (whether its masked entries should be blocked keys, "
                f"zeros or errors is ambiguous); pass np.asarray({name}) or {name}.filled(value), and say what may "
                f"be attended with a boolean mask= (True = may attend)"
            )
    foreign = [(n, a) for n, a in present if not _is_plain(a)]
    if not foreign:
        return np
    try:
        import array_api_compat
    except ImportError:  # pragma: no cover - exercised only without the extra
        raise missing_extra(f"array-api-compat (needed for {_library(foreign[0][1])} arrays)", "torch") from None
    for name, a in foreign:
        if not array_api_compat.is_array_api_obj(a):
            raise DTypeError(
                f"{name}: expected an array (NumPy, PyTorch, any array-API library) or nested lists, got {_kind(a)}"
            )
    libraries = {n: _library(a) for n, a in present if _library(a) is not None}
    if len(set(libraries.values())) > 1:
        groups: dict[str, list[str]] = {}
        for n, a in present:
            if _library(a) is not None:
                groups.setdefault(_kind(a), []).append(n)
        shown = "; ".join(f"{', '.join(ns)} {'is a' if len(ns) == 1 else 'are'} {kind}" for kind, ns in groups.items())
        raise DTypeError(
            f"arrays of different libraries cannot be mixed in one call: {shown}; convert them to one library "
            f"first (torch.as_tensor(x), x.numpy(), np.asarray(x))"
        )
    try:
        xp = array_api_compat.array_namespace(*(a for _, a in foreign))
    except TypeError as err:
        shown = ", ".join(f"{n} is a {_kind(a)}" for n, a in foreign)
        raise DTypeError(f"arrays of different kinds cannot be mixed in one call: {shown}") from err
    devices = []
    for name, a in foreign:
        dev = array_api_compat.device(a)
        if getattr(dev, "type", str(dev)) == "meta":
            raise DTypeError(
                f"{name}: a tensor on device 'meta' holds no values to compute with (shape {shape_of(a)}); "
                f"create or move it on a real device (.to('cpu'))"
            )
        devices.append((name, dev))
    if len({str(d) for _, d in devices}) > 1:
        shown = ", ".join(f"{n} on {d}" for n, d in devices)
        raise DTypeError(f"arrays on different devices cannot be mixed in one call: {shown}; move them to one device")
    return xp


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
    integers and booleans are promoted to float64 (the articles' examples are integers); long double
    (``np.longdouble``) is computed in float64 and returned as float64, so the result's dtype says its precision.
    Complex, datetime, string, object and other dtypes are refused, naming ``name`` and the dtype.
    """
    if _is_bfloat16(dtype):
        return xp.float32, dtype
    try:
        integral = xp.isdtype(dtype, ("bool", "integral"))
        real = xp.isdtype(dtype, "real floating")
    except (TypeError, ValueError):
        integral = real = False
    if integral:
        return xp.float64, xp.float64
    if not real:
        raise DTypeError(f"{name}: dtype {dtype} is not supported; expected a real floating or integer dtype")
    if dtype == xp.float64:
        return xp.float64, xp.float64
    if xp is np and np.dtype(dtype).itemsize > 8:  # long double: no BLAS, and not what the kernels take
        return xp.float64, xp.float64
    return xp.float32, dtype


def compute_dtypes(xp: Any, **arrays: Any) -> tuple[Any, Any]:
    """:func:`compute_dtype` of the arrays' common dtype, after checking each one's dtype by its name.

    ``compute_dtypes(xp, q=q, k=k, v=v)``; ``None`` entries are skipped.
    """
    dtypes = []
    for name, x in arrays.items():
        if x is not None:
            compute_dtype(xp, x.dtype, name)
            dtypes.append(x.dtype)
    names = ", ".join(n for n, x in arrays.items() if x is not None)
    try:
        common = xp.result_type(*dtypes)
    except (TypeError, ValueError) as err:
        shown = ", ".join(f"{n} {x.dtype}" for n, x in arrays.items() if x is not None)
        raise DTypeError(f"{names}: dtypes {shown} have no common dtype") from err
    return compute_dtype(xp, common, names)


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
