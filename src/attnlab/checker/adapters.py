"""Meeting attention implementations as they are: framework, signature, mask convention, layout, return value.

The checker builds every test case as float64 NumPy arrays in attnlab's canonical form (heads before the sequence
axis, ``q [..., h, n_q, d_k]``, boolean masks with True = may attend) and an :class:`Adapter` translates each case
into the call the user's function expects, and its return value back. Conversions happen here and only here, in
two strategies the adapter combines:

* a :class:`Framework` per array library (:class:`NumpyFramework`, :class:`TorchFramework`,
  :class:`JaxFramework`): arrays to and from the library, on its device, dtype names, what the library cannot
  hold, whether a returned value is the library's own array on the inputs' device;
* an :class:`~attnlab.checker.interfaces.Interface` per mask interface (full, per-batch, key padding, valid lengths,
  KV cache, varlen): which arrays one call takes and how its output becomes canonical again.

>>> spec = Spec(mask_convention="block")
>>> spec.mask_convention
'block'
>>> NumpyFramework(None).floats(np.ones(2), "float16").dtype
dtype('float16')
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import MissingExtraError, missing_extra
from .callables import detect_framework as _detect
from .callables import prepare, signature_of
from .interfaces import Form, interface
from .spec import CAPABILITIES, DTYPES, MASK_FORMS, MASKED_ROWS, Spec, UsageError

__all__ = [
    "CAPABILITIES",
    "DTYPES",
    "FRAMEWORK_STRATEGIES",
    "MASKED_ROWS",
    "MASK_FORMS",
    "Adapter",
    "Framework",
    "JaxFramework",
    "NumpyFramework",
    "Spec",
    "TorchFramework",
    "UsageError",
    "bfloat16_round",
    "compiles",
    "detect_framework",
    "framework_strategy",
    "round_to",
]

_MASK_NAMES = (
    "mask",
    "attn_mask",
    "attention_mask",
    "key_padding_mask",
    "valid_lens",
    "valid_lengths",
    "cache_seqlens",
    "cu_seqlens_q",
    "block_mask",
    "score_mod",
)
#: A mask parameter with one of these names takes that mask form (when ``mask_form`` is left "full").
_FORM_NAMES = {
    "key_padding_mask": "key_padding",
    "valid_lens": "valid_lens",
    "valid_lengths": "valid_lens",
    "cache_seqlens": "kv_cache",
    "cu_seqlens_q": "varlen",
    "block_mask": "flex",
    "score_mod": "flex",
}
_CAUSAL_NAMES = ("is_causal", "causal")
_SCALE_NAMES = ("scale", "softmax_scale", "sm_scale")


# ----------------------------------------------------------------------------------------------------------------
# precision


def bfloat16_round(x: Any) -> np.ndarray:
    """``x`` rounded to the nearest bfloat16 (ties to even), returned as float32."""
    a = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    b = a.view(np.uint32).astype(np.uint64)
    rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32).reshape(a.shape)


def round_to(x: Any, dtype: str) -> np.ndarray:
    """``x`` rounded to ``dtype`` and returned in a NumPy dtype that holds it exactly (bfloat16 -> float32)."""
    if dtype == "bfloat16":
        return bfloat16_round(x)
    return np.asarray(x).astype(dtype)


# ----------------------------------------------------------------------------------------------------------------
# detection


def _module_root(obj: Any) -> str:
    mod = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", "") or ""
    return mod.split(".")[0]


def detect_framework(fn: Any) -> str:
    """Guess the array library ``fn`` works on (see :func:`attnlab.checker.callables.detect_framework`, which also
    says why)."""
    return _detect(fn).framework


def _is_torch_sdpa(fn: Any) -> bool:
    return getattr(fn, "__name__", "") == "scaled_dot_product_attention" and _module_root(fn) == "torch"


def _params(fn: Any) -> dict[str, inspect.Parameter] | None:
    return signature_of(fn)


#: The layout of library functions whose inputs are not heads-first, by ``(module, qualname)`` of the function (its
#: documentation says so): ``layout="auto"`` uses it. jax.nn.dot_product_attention: query ``[B, T, N, H]``.
LIBRARY_LAYOUTS: dict[tuple[str, str], tuple[str, str]] = {
    ("jax._src.nn.functions", "dot_product_attention"): ("bnhd", "jax.nn.dot_product_attention takes [B, T, N, H]"),
}


def library_layout(fn: Any) -> tuple[str, str] | None:
    """``(layout, why)`` for a library function listed in :data:`LIBRARY_LAYOUTS` (also inside a
    ``functools.partial`` or a wrapper), else None."""
    import functools

    for _ in range(8):  # partial of partial of a wrapped function: a few levels at most
        if isinstance(fn, functools.partial):
            fn = fn.func
            continue
        key = (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None))
        if key in LIBRARY_LAYOUTS:
            return LIBRARY_LAYOUTS[key]
        inner = getattr(fn, "__wrapped__", None)
        if inner is None:
            return None
        fn = inner
    return None


@dataclass(frozen=True)
class Resolved:
    """The spec after detection: concrete framework and argument names (None = not accepted)."""

    framework: str
    mask_arg: str | None
    causal_arg: str | None
    scale_arg: str | None
    gqa_arg: str | None
    mask_positional: bool
    detected: str = ""
    kind: str = ""
    mode: str = ""
    spec: Any = None
    device: str = ""  #: where the inputs are created (``"cpu"``, ``"cuda:0"``); ``""`` for NumPy
    compiles: bool = False  #: its first call of each shape compiles (JAX, ``torch.compile``, flex attention)

    def describe(self) -> str:
        parts = [a for a in (self.mask_arg, self.causal_arg, self.scale_arg, self.gqa_arg) if a]
        return f"fn(q, k, v{''.join(', ' + p + '=' for p in parts)})"


def resolve(fn: Any, spec: Spec) -> Resolved:
    """Work out the framework and the argument names ``fn`` takes, from ``spec`` and its signature."""
    if spec.framework != "auto":
        framework, detected = spec.framework, "declared (framework=...)"
    else:
        d = _detect(fn)
        framework, detected = d.framework, d.reason
    params = _params(fn)
    mask_arg = causal_arg = scale_arg = gqa_arg = None
    positional = False
    sig = spec.signature
    if sig == "auto" and params is None and _is_torch_sdpa(fn):
        sig = "sdpa"
    if sig == "sdpa":
        mask_arg, causal_arg, scale_arg = "attn_mask", "is_causal", "scale"
        if _is_torch_sdpa(fn) or (params and "enable_gqa" in params):
            gqa_arg = "enable_gqa"
    elif sig == "jax":
        mask_arg, causal_arg, scale_arg = "mask", "is_causal", "scale"
    elif sig == "plain":
        mask_arg = "mask"
        if params is not None and "mask" not in params:
            pos = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            if len(pos) >= 4:
                mask_arg, positional = pos[3].name, pos[3].kind == inspect.Parameter.POSITIONAL_ONLY
    elif sig == "auto" and params is not None:
        names = list(params)
        mask_arg = next((n for n in _MASK_NAMES if n in params), None)
        causal_arg = next((n for n in _CAUSAL_NAMES if n in params), None)
        scale_arg = next((n for n in _SCALE_NAMES if n in params), None)
        gqa_arg = "enable_gqa" if "enable_gqa" in params else None
        if mask_arg is None:
            pos = [
                params[n]
                for n in names
                if params[n].kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            ]
            if len(pos) >= 4 and pos[3].name not in (causal_arg, scale_arg, gqa_arg):
                mask_arg, positional = pos[3].name, pos[3].kind == inspect.Parameter.POSITIONAL_ONLY
    mask_arg = spec.mask_arg or mask_arg
    causal_arg = spec.causal_arg or causal_arg
    scale_arg = spec.scale_arg or scale_arg
    if spec.causal_only:
        causal_arg = None
    return Resolved(framework, mask_arg, causal_arg, scale_arg, gqa_arg, positional, detected)


# ----------------------------------------------------------------------------------------------------------------
# one strategy per framework


class Framework:
    """One array library: arrays to and from it (on ``device``), dtype names, what it cannot hold, and whether a
    returned value is its own array on the inputs' device. ``device`` is the resolved device's name (``""`` for a
    library without devices). The defaults are NumPy's; :class:`TorchFramework` and :class:`JaxFramework` override
    them."""

    name = ""
    array_type = "numpy.ndarray"
    device = ""

    def __init__(self, device: str | None):
        if device is not None:
            raise UsageError(
                f"device: {device!r} applies to torch and JAX functions; a {self.name} function runs on the CPU "
                "(leave device unset, or declare framework='torch' / 'jax' if it is one)"
            )

    def floats(self, x: np.ndarray, dtype: str) -> Any:
        """A fresh float array of the library holding ``x`` in ``dtype`` (never a view of the checker's data)."""
        return np.array(x, dtype=dtype)

    def exact(self, x: np.ndarray) -> Any:
        """A fresh array of the library with ``x``'s values and its bool/int dtype (masks, lengths, cu_seqlens)."""
        return np.array(x)

    def host(self, x: Any) -> np.ndarray:
        """``x`` as a NumPy array on the CPU (float32 for bfloat16), for comparisons."""
        a = np.asarray(x)
        if a.dtype.kind == "V" or "bfloat16" in str(a.dtype):
            a = a.astype(np.float32)
        return a

    def dtype_name(self, x: Any) -> str:
        """The dtype of the library's array ``x`` by its NumPy name (``torch.float32`` -> ``'float32'``)."""
        return framework_dtype_name(x)

    def owns(self, x: Any) -> bool:
        """Whether ``x`` is an array of this library."""
        return isinstance(x, np.ndarray)

    def where(self, x: Any) -> str | None:
        """The device ``x`` is on when it is not the inputs' one, else None."""
        return None

    def foreign(self, x: Any, what: str) -> str | None:
        """Why ``x`` is not an array of the function's own library on the inputs' device, or None when it is."""
        if not self.owns(x):
            kind = type(x)
            return (
                f"the {what} is a {kind.__module__}.{kind.__qualname__}; a {self.name} function must return a "
                f"{self.array_type}"
            )
        elsewhere = self.where(x)
        if elsewhere is not None:
            return (
                f"the {what} is on device {elsewhere} but the inputs were on {self.device}; return it on the inputs' "
                "device (no .to(...) / .cpu() / device_put on the result)"
            )
        return None

    def structural(self) -> dict[str, str]:
        """Dtypes (capabilities) the library cannot hold here, with the reason."""
        return {}


class NumpyFramework(Framework):
    """NumPy: :class:`Framework`'s defaults, and no bfloat16."""

    name = "numpy"

    def structural(self) -> dict[str, str]:
        return {"bfloat16": "NumPy has no bfloat16"}


def _import_extra(extra: str, *names: str) -> list[Any]:
    """The modules ``names`` (``"jax"``, ``"jax.numpy"``), or :func:`missing_extra`'s error for ``extra``."""
    try:
        return [importlib.import_module(n) for n in names]
    except ImportError:
        raise missing_extra(extra, extra) from None


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


class TorchFramework(Framework):
    """PyTorch tensors on ``device`` (default: torch's default device)."""

    name = "torch"
    array_type = "torch.Tensor"

    def __init__(self, device: str | None):
        (self.torch,) = _import_extra("torch", "torch")
        self.place = self._resolve(device)
        self.device = str(self.place)

    def available(self) -> list[str]:
        """The devices this torch can create tensors on."""
        torch = self.torch
        out = ["cpu"]
        if torch.cuda.is_available():
            out += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            out.append("mps")
        xpu = getattr(torch, "xpu", None)
        if xpu is not None and xpu.is_available():
            out += [f"xpu:{i}" for i in range(xpu.device_count())]
        return out

    def _resolve(self, device: str | None) -> Any:
        torch = self.torch
        if device is None:
            default = getattr(torch, "get_default_device", None)
            return default() if default is not None else torch.device("cpu")
        avail = ", ".join(self.available())
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError, ValueError) as err:
            why = _first_line(err)
            raise UsageError(f"device: {device!r} is not a torch device ({why}); available: {avail}") from None
        if dev.type == "meta":
            raise UsageError(f"device: 'meta' tensors hold no data, so no output could be compared; available: {avail}")
        try:
            return torch.empty(0, device=dev).device  # "cuda" -> cuda:0; raises when torch has no such device
        except Exception as err:
            raise UsageError(
                f"device: torch {torch.__version__} has no {device!r} device here ({_first_line(err)}); "
                f"available: {avail}"
            ) from None

    def floats(self, x: np.ndarray, dtype: str) -> Any:
        torch = self.torch
        t = torch.from_numpy(np.array(x, dtype=np.float64 if dtype == "float64" else np.float32))
        return t.to(device=self.place, dtype=getattr(torch, dtype)).clone()

    def exact(self, x: np.ndarray) -> Any:
        return self.torch.from_numpy(np.array(x)).to(self.place)

    def host(self, x: Any) -> np.ndarray:
        if isinstance(x, np.ndarray) or not isinstance(x, self.torch.Tensor):
            return super().host(x)
        t = x.detach().cpu()
        if t.dtype == self.torch.bfloat16:
            t = t.float()
        return t.numpy()

    def owns(self, x: Any) -> bool:
        """Whether ``x`` is a ``torch.Tensor``."""
        return isinstance(x, self.torch.Tensor)

    def where(self, x: Any) -> str | None:
        dev = getattr(x, "device", None)
        return None if dev is None or dev == self.place else str(dev)


class JaxFramework(Framework):
    """JAX arrays, committed to ``device`` (``"cpu"``, ``"gpu"``, ``"cuda:1"``, ``"tpu"``...) when one is given."""

    name = "jax"
    array_type = "jax.Array"

    def __init__(self, device: str | None):
        self.jax, self.jnp = _import_extra("jax", "jax", "jax.numpy")
        self.place = self._resolve(device)
        self.device = str(self.place if self.place is not None else self.jax.devices()[0])

    def _resolve(self, device: str | None) -> Any:
        if device is None:
            return None
        jax = self.jax
        avail = ", ".join(str(d) for d in jax.devices())
        platform, _, index = device.partition(":")
        if index and not index.isdigit():
            raise UsageError(
                f"device: {device!r} is not a JAX device (expected PLATFORM or PLATFORM:INDEX); available: {avail}"
            )
        try:
            devices = jax.devices(platform)
        except RuntimeError as err:
            why = _first_line(err)
            raise UsageError(f"device: JAX has no {device!r} device here ({why}); available: {avail}") from None
        i = int(index or 0)
        if i >= len(devices):
            raise UsageError(f"device: JAX has {len(devices)} {platform} device(s), no {device!r}; available: {avail}")
        return devices[i]

    def _put(self, a: Any) -> Any:
        return a if self.place is None else self.jax.device_put(a, self.place)

    def floats(self, x: np.ndarray, dtype: str) -> Any:
        a = np.asarray(x, dtype=np.float32 if dtype != "float64" else np.float64)
        return self._put(self.jnp.asarray(a, dtype=dtype))

    def exact(self, x: np.ndarray) -> Any:
        return self._put(self.jnp.asarray(x))

    def owns(self, x: Any) -> bool:
        """Whether ``x`` is a ``jax.Array``."""
        return isinstance(x, self.jax.Array)

    def where(self, x: Any) -> str | None:
        try:
            devices = x.devices()
        except Exception:  # a tracer or an array without placement
            return None
        ours = self.place if self.place is not None else self.jax.devices()[0]
        return None if ours in devices else ", ".join(sorted(str(d) for d in devices))

    def structural(self) -> dict[str, str]:
        if not self.jax.config.jax_enable_x64:
            return {"float64": "JAX runs with jax_enable_x64 off, so float64 arrays become float32"}
        return {}


#: The framework strategies by name.
FRAMEWORK_STRATEGIES: dict[str, type[Framework]] = {
    "numpy": NumpyFramework,
    "torch": TorchFramework,
    "jax": JaxFramework,
}


def framework_strategy(name: str, device: str | None = None) -> Framework:
    """The strategy of framework ``name`` with its inputs on ``device`` (a :class:`UsageError` when the library
    is missing or has no such device)."""
    if name not in FRAMEWORK_STRATEGIES:
        raise UsageError(f"framework: could not use {name!r}")
    try:
        return FRAMEWORK_STRATEGIES[name](device)
    except MissingExtraError as err:
        raise UsageError(str(err)) from None


def framework_dtype_name(x: Any) -> str:
    """``'float32'`` for a float32 array of any library."""
    return str(getattr(x, "dtype", type(x).__name__)).replace("torch.", "")


# ----------------------------------------------------------------------------------------------------------------
# the adapter


@dataclass
class Returned:
    """One return value, translated back: canonical NumPy arrays, or why that was impossible."""

    out: np.ndarray | None = None
    weights: np.ndarray | None = None
    out_dtype: str | None = None
    problem: str | None = None
    wrong_type: str | None = None


#: What module mode's wrapper ``fn(q, k, v, mask=None)`` fixes itself, and the values of those options it honours
#: (the default, or the value the wrapper uses anyway); any other value is refused, not ignored.
_MODULE_MODE_FIXES = {
    "framework": ("auto", "torch"),
    "signature": ("auto",),
    "mask_convention": ("allow",),
    "layout": ("auto", "bhnd"),
    "returns": ("auto", "output"),
    "mask_form": ("full", "batch"),
    "mask_arg": (None,),
    "causal_arg": (None,),
    "scale_arg": (None,),
}


def _refuse_in_module_mode(spec: Spec, kind: str) -> None:
    """A :class:`~attnlab.errors.UsageError` naming the first option module mode cannot honour (it builds the call
    to the layer itself: its own projections, its mask in the layer's convention)."""
    for name, honoured in _MODULE_MODE_FIXES.items():
        value = getattr(spec, name)
        if value not in honoured:
            flag = "--" + name.replace("_", "-")
            keeps = " or ".join(repr(x) for x in honoured)
            raise UsageError(
                f"{name}={value!r} ({flag}): {kind} is checked in module mode, which calls the layer on hidden "
                f"states and builds its arguments itself, so {flag} cannot be honoured (module mode takes {keeps}); "
                f"leave it out, or check the attention function the layer calls (q, k, v) with it"
            )


def compiles(fn: Any, framework: str) -> bool:
    """Whether the first call of each shape of ``fn`` compiles: a JAX function (``jax.jit``, and every jax.numpy
    op on first use), a ``torch.compile`` d function or module, or flex attention (compiled per block mask)."""
    if framework == "jax":
        return True
    names = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}.{type(fn).__name__}".lower()
    return hasattr(fn, "_torchdynamo_orig_callable") or "optimizedmodule" in names or "flex" in names


class Adapter:
    """Translate canonical float64 cases into the calls ``fn`` expects, and its results back: a
    :class:`Framework` strategy for the arrays and an :class:`~attnlab.checker.interfaces.Interface` for the mask."""

    def __init__(self, fn: Any, spec: Spec):
        self.original = fn
        try:
            prepared = prepare(fn)
        except ValueError as err:
            raise UsageError(str(err)) from None
        mode = prepared.module
        own = prepared.fn  # the function itself, before a module mode wraps it
        if mode is None and spec.signature == "auto":
            from .modules import function_mode

            params = signature_of(prepared.fn)
            if params and "module" in params and _detect(prepared.fn).framework == "torch":
                mode = function_mode(prepared.fn, params)
                if mode is not None:
                    prepared = replace(prepared, fn=mode.fn)
        self.mode = mode
        self.fn = prepared.fn
        if mode is not None:
            _refuse_in_module_mode(spec, prepared.kind)
        if mode is not None:  # the wrapper takes fn(q, k, v, mask=None) in attnlab's conventions
            spec = replace(
                spec,
                framework="torch",
                signature="auto",
                mask_convention="allow",
                layout="bhnd",
                returns="output",
                causal_only=spec.causal_only or mode.causal_only,
                gqa=spec.gqa or mode.gqa,
                mask_arg=None,
                causal_arg=None,
                scale_arg=None,
            )
        r = resolve(self.fn, spec)
        if spec.layout == "auto":  # the library's documented layout, else heads first
            known = library_layout(self.fn)
            spec = replace(spec, layout=known[0] if known else "bhnd")
            if known:
                r = replace(r, detected=f"{r.detected}; layout {known[0]}: {known[1]}")
        if spec.mask_form == "full" and r.mask_arg in _FORM_NAMES and mode is None:
            spec = replace(spec, mask_form=_FORM_NAMES[r.mask_arg])
        self.spec = spec
        if spec.mask_form == "flex" and r.framework != "torch":
            raise UsageError(
                f"mask_form='flex' passes the mask as a torch BlockMask or score_mod; a {r.framework} function "
                "takes neither (declare framework='torch' if it is a torch function, or another mask_form)"
            )
        self.fw = framework_strategy(r.framework, spec.device)
        if mode is not None and self.fw.device != "cpu":
            raise UsageError(
                f"device: module mode builds its identity projections on the CPU, so {prepared.kind} cannot be "
                f"checked on {self.fw.device}; check the attention function it calls (q, k, v) there instead"
            )
        if mode is not None:
            r = replace(r, detected=_detect(fn).reason)
        self.resolved = replace(
            r,
            kind=prepared.kind,
            mode="" if mode is None else mode.family,
            spec=spec,
            device=self.fw.device,
            compiles=compiles(own, r.framework),
        )
        self.framework = self.resolved.framework
        self.interface = interface(spec.mask_form, r.mask_arg)
        self._unpack: Any = None

    # -- what the function can take at all (before trying) --------------------------------------------------
    def structural_unsupported(self) -> dict[str, str]:
        """Capabilities the function cannot be given at all, with the reason."""
        r, spec = self.resolved, self.spec
        out: dict[str, str] = {}
        if r.mask_arg is None:
            out["mask"] = "the function takes no mask argument"
        if r.causal_arg is None and not spec.causal_only and r.mask_arg is None:
            out["causal"] = "the function takes no causal flag and no mask"
        if r.scale_arg is None:
            out["scale"] = "the function takes no scale argument"
        if not spec.gqa:
            out["gqa"] = "not declared (gqa=True / --gqa)"
        if spec.layout == "bnhd":
            out["rank"] = "layout [B, n, h, d] is 4-D only"
        out.update(self.interface.structural(has_causal_flag=r.causal_arg is not None, causal_only=spec.causal_only))
        if 3 not in spec.ranks:
            out["rank"] = f"declared ranks={spec.ranks!r}"
        out.update(self.fw.structural())
        for d in DTYPES:
            if d not in spec.dtypes:
                out.setdefault(d, "not in the dtypes to try")
        if self.mode is not None:
            for c, why in self.mode.unsupported.items():
                out[c] = f"module mode: {why}"
        for c in spec.unsupported:
            out[c] = "declared unsupported"
        return out

    # -- one call ---------------------------------------------------------------------------------------------
    def host(self, x: Any) -> np.ndarray:
        """``x`` as a NumPy array on the CPU (float32 for bfloat16), for comparisons."""
        return self.fw.host(x)

    def is_array(self, x: Any) -> bool:
        """Whether ``x`` is an array of any library (a NumPy array, or anything with ``shape`` and ``dtype``)."""
        if isinstance(x, np.ndarray):
            return True
        return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, (str, bytes))

    def build_request(self, req: Any) -> tuple[tuple, dict]:
        """The positional and keyword arguments of the call for a :class:`~attnlab.checker.runner.CallRequest`."""
        return self.build_call(
            req.q, req.k, req.v, dtype=req.dtype, mask=req.mask, causal=req.causal, scale=req.scale, gqa=req.gqa
        )

    def build_call(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        *,
        dtype: str,
        mask: np.ndarray | None,
        causal: bool | str,
        scale: float | None,
        gqa: bool,
    ) -> tuple[tuple, dict]:
        """The positional and keyword arguments of one call (arrays of ``fn``'s library, on its device)."""
        form = Form(dtype, self.spec.layout, self.spec.mask_convention, self.fw)
        inputs = self.interface.inputs(q, k, v, mask, form)
        self._unpack = inputs.unpack
        args, kwargs = inputs.tensors, dict(inputs.extra)
        r = self.resolved
        if inputs.mask is not None:
            if r.mask_positional:
                args = (*args, inputs.mask)
            else:
                assert r.mask_arg is not None  # a mask is passed only to a function that takes one
                kwargs[r.mask_arg] = inputs.mask
        if causal and r.causal_arg is not None:
            kwargs[r.causal_arg] = causal
        if scale is not None:
            assert r.scale_arg is not None  # a scale is passed only to a function that takes one
            kwargs[r.scale_arg] = scale
        if gqa and r.gqa_arg is not None and not self.interface.packed:
            kwargs[r.gqa_arg] = True
        return args, kwargs

    def interpret(self, value: Any) -> Returned:
        """Translate a return value: an array, a pair ``(out, weights)`` or ``(out, lse)``; anything else is a
        problem."""
        weights = None
        if (
            not self.is_array(value)
            and not isinstance(value, (tuple, list))
            and self.is_array(getattr(value, "output", None))
        ):  # a result object (attnlab's AttentionTrace, FlashResult): .output and maybe .weights
            w = getattr(value, "weights", None)
            value = (value.output, w) if self.is_array(w) else value.output
        if isinstance(value, (tuple, list)) and self.spec.returns != "output":
            if len(value) != 2:
                return Returned(
                    problem=f"returned a {type(value).__name__} of {len(value)} items; expected an "
                    "array, or a pair (out, weights)"
                )
            value, weights = value
            if self.spec.returns == "output+lse":
                weights = None  # (out, lse [B, h, n_q]): a FlashAttention-style forward; the lse is not compared
            elif self.spec.returns == "auto" and self.is_array(value) and not self.is_array(weights):
                weights = None  # (out, something else): x-transformers' Attend returns (out, Intermediates)
            elif (
                self.spec.returns == "auto"
                and self.is_array(value)
                and len(getattr(weights, "shape", ())) == len(getattr(value, "shape", ())) - 1
            ):
                weights = None  # (out, lse): one axis fewer than out is a log-sum-exp per query, never weights
        elif self.spec.returns == "output+weights":
            return Returned(
                problem=f"returned a {type(value).__name__}; declared returns='output+weights' "
                "expects a pair (out, weights)"
            )
        if not self.is_array(value):
            return Returned(problem=f"returned {_describe(value)}, not an array")
        if weights is not None and not self.is_array(weights):
            return Returned(problem=f"returned weights that are {_describe(weights)}, not an array")
        wrong = self.fw.foreign(value, "output") or (None if weights is None else self.fw.foreign(weights, "weights"))
        try:
            out = np.array(self.host(value))
            unpack = self._unpack or (lambda x: x)
            out = unpack(out)
            if isinstance(out, str):
                return Returned(problem=out)
            w = None if weights is None else np.array(self.host(weights))  # [B, h, n_q, n_k] in every layout
        except Exception as err:  # garbage that looks like an array, or one on a device that holds no data
            because = f"{wrong}; " if wrong else ""
            return Returned(problem=f"returned something that could not be read as an array ({because}{err})")
        if out.dtype.kind not in "fc":
            return Returned(problem=f"returned an array of dtype {out.dtype}, not floating point")
        return Returned(out=out, weights=w, out_dtype=self.fw.dtype_name(value), wrong_type=wrong)

    def snapshot(self, args: tuple, kwargs: dict) -> list[tuple[str, np.ndarray]]:
        """Copies of every array argument, to detect writes into the caller's inputs."""
        names = ["q", "k", "v", "mask"]
        out = []
        for i, a in enumerate(args):
            out.append((names[i] if i < len(names) else f"arg{i}", np.array(self.host(a), copy=True)))
        for key, a in kwargs.items():
            if self.is_array(a):
                out.append((key, np.array(self.host(a), copy=True)))
        return out

    def mutated(self, args: tuple, kwargs: dict, before: list[tuple[str, np.ndarray]]) -> list[str]:
        """The names of the arguments whose values differ from the :meth:`snapshot` ``before`` the call."""
        after = self.snapshot(args, kwargs)
        changed = []
        for (name, a), (_, b) in zip(before, after, strict=True):
            if a.shape != b.shape or not np.array_equal(a, b, equal_nan=True):
                changed.append(name)
        return changed


def _describe(x: Any) -> str:
    if x is None:
        return "None"
    text = repr(x)
    return f"a {type(x).__name__} ({text[:40]}{'...' if len(text) > 40 else ''})"
