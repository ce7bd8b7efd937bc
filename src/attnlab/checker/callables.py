"""Meeting any callable as it is: what to call, which parameters it takes, and which array library it works on.

:func:`prepare` turns what the user passed (a function, a lambda, a ``functools.partial``, a bound method, a
``jax.jit`` function, an instance with ``__call__``, a class, a ``torch.nn.Module``) into the callable the checker
calls, with the signature to read; attention *layers* that take hidden states instead of q, k, v go through
:mod:`attnlab.checker.modules`. :func:`detect_framework` says which library a callable works on and why, from what
it is (a torch module, a jit function), what its parameters are annotated with, the values bound to it (partial
arguments, closure cells, an instance's attributes), the names its code and its helpers use, and what its module
imports.

>>> import functools, numpy as np
>>> detect_framework(functools.partial(np.matmul)).framework
'numpy'
"""

from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass
from typing import Any

from ..errors import OptionError
from .spec import UsageError

__all__ = ["Detected", "Prepared", "code_functions", "detect_framework", "prepare", "signature_of"]

_LIBS = {"torch": "torch", "jax": "jax", "jaxlib": "jax", "flax": "jax", "equinox": "jax"}


@dataclass(frozen=True)
class Detected:
    """The framework a callable works on, and the evidence (``"torch: a torch.nn.Module (Attend)"``)."""

    framework: str
    reason: str


@dataclass(frozen=True)
class Prepared:
    """What the checker calls: ``fn``, what the user passed (``kind``) and, for a layer, its module mode."""

    fn: Any
    kind: str
    module: Any = None  #: a :class:`attnlab.checker.modules.ModuleMode`, or None


def _root(name: str | None) -> str:
    return (name or "").split(".")[0]


def _lib_of_value(value: Any) -> str | None:
    """``torch``/``jax`` when ``value`` is (or belongs to) one of those libraries."""
    if inspect.ismodule(value):
        return _LIBS.get(_root(value.__name__))
    kind = type(value)
    for cls in getattr(kind, "__mro__", (kind,)):
        lib = _LIBS.get(_root(getattr(cls, "__module__", "")))
        if lib is not None and cls is not object:
            return lib
    mod = getattr(value, "__module__", None)
    if isinstance(mod, str):
        return _LIBS.get(_root(mod))
    return None


def _module_imports(modname: str | None) -> set[str]:
    """The libraries (torch, jax) module ``modname`` has imported at its top level."""
    mod = sys.modules.get(modname or "")
    found: set[str] = set()
    if mod is None:
        return found
    for value in list(vars(mod).values()):
        if inspect.ismodule(value) or inspect.isfunction(value) or inspect.isclass(value):
            lib = _LIBS.get(_root(value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", "")))
            if lib:
                found.add(lib)
    return found


def is_torch_module(obj: Any) -> bool:
    """Whether ``obj`` is a ``torch.nn.Module`` instance (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def _unwrap(fn: Any) -> Any:
    while True:
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif inspect.ismethod(fn):
            fn = fn.__func__
        elif getattr(fn, "__wrapped__", None) is not None and not inspect.isclass(fn):
            fn = fn.__wrapped__
        else:
            return fn


def code_functions(fn: Any) -> list[Any]:
    """The Python functions whose code runs when ``fn`` is called (for names and globals)."""
    target = _unwrap(fn)
    if inspect.isfunction(target):
        return [target]
    out = []
    kind = target if inspect.isclass(target) else type(target)
    for attr in ("forward", "__call__"):
        f = _unwrap(getattr(kind, attr, None))
        if inspect.isfunction(f) and _root(getattr(f, "__module__", "")) not in _LIBS:
            out.append(f)
    return out


def signature_of(fn: Any) -> dict[str, inspect.Parameter] | None:
    """The parameters ``fn`` is called with (an ``nn.Module``'s are its ``forward``'s), or None."""
    target = fn.forward if is_torch_module(fn) else fn
    try:
        return dict(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return None


def _code_names(code_fn: Any, depth: int = 3, seen: set | None = None) -> dict[str, Any]:
    """The global names ``code_fn`` uses (with its module's own helpers ``depth`` levels deep) and their values."""
    seen = set() if seen is None else seen
    code = getattr(code_fn, "__code__", None)
    if code is None or id(code) in seen:
        return {}
    seen.add(id(code))
    glb = getattr(code_fn, "__globals__", {}) or {}
    codes, names = [code], set()
    while codes:
        c = codes.pop()
        names.update(c.co_names)
        codes.extend(x for x in c.co_consts if inspect.iscode(x))
    used = {n: glb[n] for n in names if n in glb}
    for name, cell in zip(code.co_freevars, getattr(code_fn, "__closure__", None) or (), strict=False):
        try:
            used.setdefault(name, cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    if depth > 0:
        for value in list(used.values()):
            if inspect.isfunction(value) and value.__globals__ is glb:
                used.update(_code_names(value, depth - 1, seen))
            elif isinstance(value, functools.partial) or inspect.ismethod(value):
                for f in code_functions(value):
                    used.update(_code_names(f, depth - 1, seen))
    return used


def _annotation_lib(params: dict[str, inspect.Parameter] | None) -> tuple[str, str] | None:
    for p in (params or {}).values():
        text = p.annotation if isinstance(p.annotation, str) else repr(p.annotation)
        for word, lib in (("torch", "torch"), ("jax", "jax"), ("jnp.", "jax")):
            if word in text:
                return lib, f"parameter {p.name} is annotated {text.replace('<class ', '').strip('>')}"
    return None


def detect_framework(fn: Any) -> Detected:
    """The array library ``fn`` works on (``numpy``, ``torch`` or ``jax``) and the evidence for it."""
    described = type(fn).__name__
    # 1. what it is
    if is_torch_module(fn):
        return Detected("torch", f"a torch.nn.Module ({type(fn).__name__})")
    base = _unwrap(fn)
    if inspect.isclass(base) and any(_root(c.__module__) == "torch" for c in base.__mro__[1:]):
        return Detected("torch", f"a torch.nn.Module class ({base.__name__})")
    lib = _LIBS.get(_root(getattr(base, "__module__", None) or type(base).__module__))
    if lib is None:
        lib = _LIBS.get(_root(type(fn).__module__))
    if lib is not None:
        mod = getattr(base, "__module__", None) or type(base).__module__
        return Detected(lib, f"defined in {mod}" if lib == _LIBS.get(_root(mod)) else f"a {lib} {described}")
    # 2. what it accepts
    ann = _annotation_lib(signature_of(fn))
    if ann is not None:
        return Detected(ann[0], ann[1])
    # 3. values bound to it: partial arguments, an instance's attributes
    bound: list[tuple[str, Any]] = []
    f = fn
    while isinstance(f, functools.partial) or inspect.ismethod(f):
        if isinstance(f, functools.partial):
            bound += [("a partial argument", a) for a in f.args] + [(f"partial {k}=", v) for k, v in f.keywords.items()]
            f = f.func
        else:
            bound.append(("the bound instance", f.__self__))
            f = f.__func__
    if not inspect.isfunction(base) and not inspect.isclass(base):
        bound += [(f"attribute {k}", v) for k, v in list(getattr(base, "__dict__", {}).items())]
    for what, value in bound:
        lib = _lib_of_value(value)
        if lib is not None:
            return Detected(lib, f"{what} is a {type(value).__module__}.{type(value).__name__}")
    # 4. the names its code (and its helpers) use
    used: dict[str, Any] = {}
    for cf in code_functions(fn):
        used.update(_code_names(cf))
    via: list[tuple[str, str]] = []
    own = {getattr(cf, "__module__", None) for cf in code_functions(fn)}
    for name, value in sorted(used.items()):
        lib = _lib_of_value(value)
        if lib is not None:
            return Detected(lib, f"its code uses {name} ({_qual(value)})")
        mod = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
        if isinstance(mod, str) and mod not in own:  # a library reached through another (transformers -> torch)
            for lib in sorted(_module_imports(mod)):
                via.append((lib, f"its code uses {name} from {mod}, which imports {lib}"))
    if via:
        return Detected(*via[0])
    return Detected("numpy", "no torch or JAX in what it is, its parameters, its bound values or what its code uses")


def _qual(value: Any) -> str:
    if inspect.ismodule(value):
        return f"module {value.__name__}"
    return (
        f"{getattr(value, '__module__', type(value).__module__)}.{getattr(value, '__qualname__', type(value).__name__)}"
    )


def describe_kind(fn: Any) -> str:
    """What the user passed, in words: ``a functools.partial of f``, ``an nn.Module (Attend)``..."""
    if isinstance(fn, functools.partial):
        return f"a functools.partial of {getattr(_unwrap(fn), '__qualname__', type(_unwrap(fn)).__name__)}"
    if inspect.ismethod(fn):
        return f"a bound method {fn.__qualname__}"
    if is_torch_module(fn):
        return f"a torch.nn.Module ({type(fn).__name__})"
    if inspect.isclass(fn):
        return f"a class ({fn.__name__})"
    if inspect.isfunction(fn):
        return "a lambda" if fn.__name__ == "<lambda>" else "a function"
    if getattr(fn, "__wrapped__", None) is not None:
        return f"a wrapped function ({type(fn).__name__} of {getattr(_unwrap(fn), '__qualname__', '?')})"
    return f"an instance of {type(fn).__name__} with __call__"


def prepare(fn: Any) -> Prepared:
    """The callable to check for what the user passed.

    A class is instantiated with no arguments (``Attend``, a layer with defaults); a layer taking hidden states
    (``nn.MultiheadAttention``, Hugging Face attention, timm's ``Attention``, nanoGPT's ``CausalSelfAttention``)
    gets a module mode (:func:`attnlab.checker.modules.module_mode`).

    Raises:
        OptionError: a class that cannot be instantiated without arguments (pass an instance).
    """
    kind = describe_kind(fn)
    if inspect.isclass(fn):
        try:
            fn = fn()
        except Exception as err:
            raise OptionError(
                f"fn: the class {fn.__name__} cannot be instantiated without arguments ({type(err).__name__}: "
                f"{err}); pass an instance, e.g. {fn.__name__}(...)"
            ) from None
        kind += ", instantiated with no arguments"
    if is_torch_module(fn):
        from .modules import module_mode, unknown_layer

        mode = module_mode(fn)
        if mode is not None:
            return Prepared(mode.fn, kind, mode)
        why = unknown_layer(fn)
        if why is not None:
            raise UsageError(why)
    return Prepared(fn, kind)
