"""Meeting attention implementations as they are: framework, signature, mask convention, layout, return value.

The checker builds every test case as float64 NumPy arrays in attnlab's canonical form (heads before the sequence
axis, ``q [..., h, n_q, d_k]``, boolean masks with True = may attend) and an :class:`Adapter` translates each case
into the call the user's function expects, and its return value back. Conversions happen here and only here.

>>> spec = Spec(mask_convention="block")
>>> spec.mask_convention
'block'
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import masks as _masks
from ..errors import AttnlabError, MissingExtraError, missing_extra
from .callables import detect_framework as _detect
from .callables import prepare, signature_of
from .interfaces import Varlen, interface

__all__ = [
    "CAPABILITIES",
    "DTYPES",
    "Adapter",
    "Spec",
    "UsageError",
    "bfloat16_round",
    "detect_framework",
    "round_to",
]

FRAMEWORKS = ("auto", "numpy", "torch", "jax")
SIGNATURES = ("auto", "plain", "sdpa", "jax", "qkv")
CONVENTIONS = ("allow", "block", "additive", "keep")
LAYOUTS = ("bhnd", "bnhd")
RETURNS = ("auto", "output", "output+weights")
ALIGNS = (None, "top_left", "bottom_right")
DTYPES = ("float64", "float32", "float16", "bfloat16")
GQA_MAPPINGS = ("interleave", "tile")
#: The mask interfaces: ``full`` ``[B, h, n_q, n_k]``; ``batch`` ``[B, 1, n_q, n_k]`` (broadcast over heads, as
#: Hugging Face's 4-D masks); ``key_padding`` ``[B, n_k]`` (in ``mask_convention``: ``allow`` True = real key,
#: ``block`` True = padding, as ``nn.MultiheadAttention``'s ``key_padding_mask``); ``valid_lens`` ``[B]`` int
#: valid key lengths (d2l's ``masked_softmax``); ``kv_cache`` ``[B]`` int cache lengths of a decode kernel (the
#: n_q new queries are the last positions of each sequence; causal is bottom-right per sequence, as
#: ``flash_attn_with_kvcache``'s ``cache_seqlens``); ``varlen``: packed variable-length batches, ``q [total_q, h, d]``
#: with ``cu_seqlens_q/k`` and ``max_seqlen_q/k`` (flash-attn's varlen functions; causal bottom-right per sequence).
MASK_FORMS = ("full", "batch", "key_padding", "valid_lens", "kv_cache", "varlen")
_ADDITIVE_FILL = {"float64": "float32", "float32": "float32", "float16": "float16"}
#: Fully-masked-row policies a function may promise: ``any`` documented one (an error, zeros, the uniform average;
#: NaN is a bug), or exactly one of them (``nan`` makes NaN the promise, as ``nn.MultiheadAttention``'s).
MASKED_ROWS = ("any", "raise", "zeros", "uniform", "nan")

#: Capabilities a probe may need; each can be declared unsupported (``unsupported=`` / ``--unsupported``).
CAPABILITIES = (
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "mask",
    "causal",
    "scale",
    "cross",
    "dv",
    "rank",
    "gqa",
    "causal-cross",
)

_MASK_NAMES = (
    "mask",
    "attn_mask",
    "attention_mask",
    "key_padding_mask",
    "valid_lens",
    "valid_lengths",
    "cache_seqlens",
    "cu_seqlens_q",
)
#: A mask parameter with one of these names takes that mask form (when ``mask_form`` is left "full").
_FORM_NAMES = {
    "key_padding_mask": "key_padding",
    "valid_lens": "valid_lens",
    "valid_lengths": "valid_lens",
    "cache_seqlens": "kv_cache",
    "cu_seqlens_q": "varlen",
}
_CAUSAL_NAMES = ("is_causal", "causal")
_SCALE_NAMES = ("scale", "softmax_scale", "sm_scale")


class UsageError(AttnlabError, ValueError):
    """The checker was told something inconsistent about the function (an option value, a missing library)."""


def _choice(name: str, value: Any, allowed: tuple) -> Any:
    if value not in allowed:
        raise UsageError(f"{name}: expected one of {', '.join(repr(a) for a in allowed)}, got {value!r}")
    return value


@dataclass(frozen=True)
class Spec:
    """What the function under test is and supports. Every field has a safe default ("auto" detects).

    Attributes:
        framework: ``"numpy"``, ``"torch"``, ``"jax"`` or ``"auto"`` (from the function's module and globals).
        signature: ``"plain"`` ``fn(q, k, v, mask=None)``; ``"sdpa"`` ``fn(q, k, v, attn_mask=, is_causal=,
            scale=)``; ``"jax"`` ``fn(q, k, v, mask=, is_causal=, scale=)``; ``"qkv"`` ``fn(q, k, v)`` only;
            ``"auto"`` reads the parameter names.
        mask_convention: ``"allow"`` (bool, True = may attend), ``"block"`` (bool, True = blocked),
            ``"additive"`` (float, 0 or ``finfo(dtype).min``), ``"keep"`` (int 1 = keep, 0 = masked).
        layout: ``"bhnd"`` (``[B, h, n, d]``, heads first; any leading dims) or ``"bnhd"`` (``[B, n, h, d]``).
        returns: ``"output"``, ``"output+weights"`` (a pair ``(out, weights)``) or ``"auto"`` (a pair is a pair).
        causal_only: the function always applies a causal mask (it takes no causal flag).
        causal_align: the causal alignment you rely on when ``n_q != n_k``: ``"top_left"``, ``"bottom_right"``,
            or None (either is accepted; the report says which one the function uses).
        causal_value: what the causal argument receives: ``"bool"`` (True) or ``"align"`` (the alignment string,
            ``"top_left"`` / ``"bottom_right"``, as attnlab's own functions take).
        gqa: K and V may have fewer heads than Q (grouped-query attention).
        gqa_mapping: which K/V head query head i uses: ``"interleave"`` ``i // (h / h_kv)`` (repeat_interleave,
            Hugging Face's repeat_kv, PyTorch's enable_gqa) or ``"tile"`` ``i % h_kv``.
        compute_dtype: ``"auto"`` (a float64 function that computes in float32, e.g. a softmax upcast and cast
            back, is compared under float32's rule with a ``lower-precision`` note), ``"input"`` (every dtype under
            its own rule), or a dtype the function documents computing in (its rule applies to more precise inputs).
        causal_when_no_mask: the function applies a causal mask (top-left) whenever it is given no mask (as
            Hugging Face's sdpa path does); cases without a mask are then checked as causal.
        mask_form: the mask interface (see :data:`MASK_FORMS`); the probes draw masks the form can express.
        ranks: the input ranks the function takes: ``(3, 4)`` (default: 3-D ``[h, n, d]`` is tried, and a clean
            refusal is "not tested") or ``(4,)`` (never called with 3-D inputs).
        masked_rows: the fully-masked-row policy the function promises (see :data:`MASKED_ROWS`); another
            behaviour is a ``masked-row-policy`` finding.
        dtypes: the dtypes to try (unsupported ones are reported as such, not as bugs).
        unsupported: capabilities declared unsupported (see :data:`CAPABILITIES`).
        mask_arg, causal_arg, scale_arg: parameter names, when ``signature="auto"`` guesses wrong.
    """

    framework: str = "auto"
    signature: str = "auto"
    mask_convention: str = "allow"
    layout: str = "bhnd"
    returns: str = "auto"
    causal_only: bool = False
    causal_align: str | None = None
    causal_value: str = "bool"
    gqa: bool = False
    dtypes: tuple[str, ...] = DTYPES
    unsupported: frozenset[str] = field(default_factory=frozenset)
    mask_arg: str | None = None
    causal_arg: str | None = None
    scale_arg: str | None = None
    gqa_mapping: str = "interleave"
    compute_dtype: str = "auto"
    masked_rows: str = "any"
    causal_when_no_mask: bool = False
    ranks: tuple[int, ...] = (3, 4)
    mask_form: str = "full"

    def __post_init__(self) -> None:
        _choice("framework", self.framework, FRAMEWORKS)
        _choice("signature", self.signature, SIGNATURES)
        _choice("mask_convention", self.mask_convention, CONVENTIONS)
        _choice("layout", self.layout, LAYOUTS)
        _choice("returns", self.returns, RETURNS)
        _choice("causal_align", self.causal_align, ALIGNS)
        _choice("causal_value", self.causal_value, ("bool", "align"))
        _choice("gqa_mapping", self.gqa_mapping, GQA_MAPPINGS)
        _choice("compute_dtype", self.compute_dtype, ("auto", "input", *DTYPES))
        _choice("masked_rows", self.masked_rows, MASKED_ROWS)
        _choice("mask_form", self.mask_form, MASK_FORMS)
        if self.mask_form in ("valid_lens", "kv_cache", "varlen") and self.mask_convention not in ("allow",):
            raise UsageError("mask_convention: valid lengths have no convention; leave it 'allow'")
        object.__setattr__(self, "ranks", tuple(sorted(set(self.ranks))))
        for r in self.ranks:
            _choice("ranks", r, (3, 4))
        if 4 not in self.ranks:
            raise UsageError(f"ranks: the checker calls with 4-D inputs [B, h, n, d]; got ranks={self.ranks!r}")
        object.__setattr__(self, "dtypes", tuple(self.dtypes))
        for d in self.dtypes:
            _choice("dtypes", d, DTYPES)
        object.__setattr__(self, "unsupported", frozenset(self.unsupported))
        for c in self.unsupported:
            _choice("unsupported", c, CAPABILITIES)

    def as_dict(self) -> dict[str, Any]:
        return {
            "framework": self.framework,
            "signature": self.signature,
            "mask_convention": self.mask_convention,
            "layout": self.layout,
            "returns": self.returns,
            "causal_only": self.causal_only,
            "causal_align": self.causal_align,
            "causal_value": self.causal_value,
            "gqa": self.gqa,
            "dtypes": list(self.dtypes),
            "unsupported": sorted(self.unsupported),
            "mask_arg": self.mask_arg,
            "causal_arg": self.causal_arg,
            "scale_arg": self.scale_arg,
            "gqa_mapping": self.gqa_mapping,
            "compute_dtype": self.compute_dtype,
            "masked_rows": self.masked_rows,
            "causal_when_no_mask": self.causal_when_no_mask,
            "ranks": list(self.ranks),
            "mask_form": self.mask_form,
        }


# ----------------------------------------------------------------------------------------------------------------
# precision


def bfloat16_round(x: Any) -> np.ndarray:
    """``x`` rounded to the nearest bfloat16 (ties to even), returned as float32."""
    a = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    b = a.view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32).reshape(a.shape)


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
    """Guess the array library ``fn`` works on (see :func:`attnlab.check.callables.detect_framework`, which also
    says why)."""
    return _detect(fn).framework


def _is_torch_sdpa(fn: Any) -> bool:
    return getattr(fn, "__name__", "") == "scaled_dot_product_attention" and _module_root(fn) == "torch"


def _params(fn: Any) -> dict[str, inspect.Parameter] | None:
    return signature_of(fn)


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
# the adapter


def _import(framework: str) -> Any:
    try:
        if framework == "torch":
            import torch

            return torch
        if framework == "jax":
            import jax
            import jax.numpy as jnp

            return jax, jnp
    except ImportError:
        raise missing_extra(framework, framework) from None
    return np


def framework_dtype_name(x: Any) -> str:
    """``'float32'`` for a float32 array of any library."""
    return str(getattr(x, "dtype", type(x).__name__)).replace("torch.", "")


@dataclass
class Returned:
    """One return value, translated back: canonical NumPy arrays, or why that was impossible."""

    out: np.ndarray | None = None
    weights: np.ndarray | None = None
    out_dtype: str | None = None
    problem: str | None = None
    wrong_type: str | None = None


class Adapter:
    """Translate canonical float64 cases into the calls ``fn`` expects, and its results back."""

    def __init__(self, fn: Any, spec: Spec):
        self.original = fn
        try:
            prepared = prepare(fn)
        except ValueError as err:
            raise UsageError(str(err)) from None
        mode = prepared.module
        if mode is None and spec.signature == "auto":
            from .modules import function_mode

            params = signature_of(prepared.fn)
            if params and "module" in params and _detect(prepared.fn).framework == "torch":
                mode = function_mode(prepared.fn, params)
                if mode is not None:
                    prepared = replace(prepared, fn=mode.fn)
        self.mode = mode
        self.fn = prepared.fn
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
        if spec.mask_form == "full" and r.mask_arg in _FORM_NAMES and mode is None:
            spec = replace(spec, mask_form=_FORM_NAMES[r.mask_arg])
        self.spec = spec
        if mode is not None:
            r = replace(r, detected=_detect(fn).reason)
        self.resolved = replace(r, kind=prepared.kind, mode="" if mode is None else mode.family, spec=spec)
        self.framework = self.resolved.framework
        self.interface = interface(spec.mask_form)
        if self.framework not in ("numpy", "torch", "jax"):
            raise UsageError(f"framework: could not use {self.framework!r}")
        try:
            self._lib = _import(self.framework)
        except MissingExtraError as err:
            raise UsageError(str(err)) from None

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
        if spec.mask_form != "full":
            out["rank"] = f"mask_form={spec.mask_form!r} has a batch axis: inputs are 4-D"
            if self.resolved.causal_arg is None and not spec.causal_only:
                out["causal"] = f"no causal flag, and a {spec.mask_form} mask cannot express causal"
        if 3 not in spec.ranks:
            out["rank"] = f"declared ranks={spec.ranks!r}"
        if self.framework == "numpy":
            out["bfloat16"] = "NumPy has no bfloat16"
        if self.framework == "jax":
            jax, _ = self._lib
            if not jax.config.jax_enable_x64:
                out["float64"] = "JAX runs with jax_enable_x64 off, so float64 arrays become float32"
        for d in DTYPES:
            if d not in spec.dtypes:
                out.setdefault(d, "not in the dtypes to try")
        if self.mode is not None:
            for c, why in self.mode.unsupported.items():
                out[c] = f"module mode: {why}"
        for c in spec.unsupported:
            out[c] = "declared unsupported"
        return out

    # -- conversions ------------------------------------------------------------------------------------------
    def to_framework(self, x: np.ndarray, dtype: str) -> Any:
        """A fresh array of ``fn``'s library holding ``x`` in ``dtype`` (never a view of the checker's data)."""
        if self.framework == "numpy":
            return np.array(x, dtype=dtype)
        if self.framework == "torch":
            torch = self._lib
            t = torch.from_numpy(np.array(x, dtype=np.float64 if dtype == "float64" else np.float32))
            return t.to(getattr(torch, dtype)).clone()
        _, jnp = self._lib
        return jnp.asarray(np.asarray(x, dtype=np.float32 if dtype != "float64" else np.float64), dtype=dtype)

    def mask_to_framework(self, allowed: np.ndarray, dtype: str) -> Any:
        """attnlab's mask (True = may attend) in the declared convention, as an array of ``fn``'s library."""
        conv = self.spec.mask_convention
        allowed = self.interface.reduce(np.asarray(allowed))
        if self.interface.lengths:
            return self.to_int(allowed)
        if conv == "allow":
            m = np.array(allowed, dtype=bool)
        elif conv == "block":
            m = np.asarray(_masks.to_blocked(allowed))
        elif conv == "keep":
            m = np.asarray(allowed).astype(np.int64)
        else:
            # float64 gets float32's minimum: it survives a computation upcast or cast down to float32 (as
            # reference oracles and Hugging Face's eager softmax do), where float64's would become -inf
            fill = -3.3895313892515355e38 if dtype == "bfloat16" else float(np.finfo(_ADDITIVE_FILL[dtype]).min)
            m = np.where(allowed, 0.0, fill)
            if self.framework == "numpy":
                return m.astype(dtype)
            return self.to_framework(m, dtype)
        if self.framework == "numpy":
            return m
        if self.framework == "torch":
            return self._lib.from_numpy(m.copy())
        _, jnp = self._lib
        return jnp.asarray(m)

    def to_layout(self, x: np.ndarray) -> np.ndarray:
        return np.swapaxes(x, -2, -3) if self.spec.layout == "bnhd" else x

    def from_layout(self, x: np.ndarray) -> np.ndarray:
        return np.swapaxes(x, -2, -3) if self.spec.layout == "bnhd" else x

    def host(self, x: Any) -> np.ndarray:
        """``x`` as a NumPy array (float32 for bfloat16), for comparisons."""
        if isinstance(x, np.ndarray):
            return x
        if self.framework == "torch" and _module_root(x) == "torch":
            t = x.detach().cpu()
            if t.dtype == self._lib.bfloat16:
                t = t.float()
            return t.numpy()
        a = np.asarray(x)
        if a.dtype.kind == "V" or "bfloat16" in str(a.dtype):
            a = a.astype(np.float32)
        return a

    def is_array(self, x: Any) -> bool:
        if isinstance(x, np.ndarray):
            return True
        return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, (str, bytes))

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
        """The positional and keyword arguments of one call."""
        if self.interface.packed:
            return self._varlen_call(q, k, v, dtype=dtype, mask=mask, causal=causal, scale=scale)
        args = tuple(self.to_framework(self.to_layout(x), dtype) for x in (q, k, v))
        kwargs: dict[str, Any] = {}
        r = self.resolved
        if mask is not None:
            m = self.mask_to_framework(mask, dtype)
            if r.mask_positional:
                args = (*args, m)
            else:
                kwargs[r.mask_arg] = m
        if causal and r.causal_arg is not None:
            kwargs[r.causal_arg] = causal
        if scale is not None:
            kwargs[r.scale_arg] = scale
        if gqa and r.gqa_arg is not None:
            kwargs[r.gqa_arg] = True
        return args, kwargs

    def _varlen_call(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, dtype: str, mask: Any, causal: Any, scale: Any
    ) -> tuple[tuple, dict]:
        """A packed variable-length call (flash-attn's varlen functions): ``q [total_q, h, d]``, ``k, v [total_k,
        h_kv, d]``, ``cu_seqlens_q/k`` int32 ``[B + 1]``, ``max_seqlen_q/k``. Sequence b's lengths are the rows
        and the keys its (prefix) mask allows; the output is unpacked in :meth:`interpret` (missing rows 0)."""
        lq, lk = Varlen.lengths_of(q, k, mask)
        self.varlen_rows = (lq, q.shape[-2], q.shape[1])

        def pack(x: np.ndarray, lengths: np.ndarray) -> Any:
            return self.to_framework(Varlen.pack(x, lengths), dtype)

        def cu(lengths: np.ndarray) -> Any:
            return self.to_int(Varlen.cu_seqlens(lengths))

        kwargs: dict[str, Any] = {
            "cu_seqlens_q": cu(lq),
            "cu_seqlens_k": cu(lk),
            "max_seqlen_q": int(lq.max(initial=0)),
            "max_seqlen_k": int(lk.max(initial=0)),
        }
        r = self.resolved
        if causal and r.causal_arg is not None:
            kwargs[r.causal_arg] = causal
        if scale is not None:
            kwargs[r.scale_arg] = scale
        return (pack(q, lq), pack(k, lk), pack(v, lk)), kwargs

    def to_int(self, x: np.ndarray) -> Any:
        """An integer array of ``fn``'s library."""
        if self.framework == "torch":
            return self._lib.from_numpy(np.array(x))
        if self.framework == "jax":
            return self._lib[1].asarray(x)
        return np.array(x)

    def _unpack(self, out: np.ndarray) -> np.ndarray:
        """``[total_q, h, d_v]`` back to ``[B, h, n_q, d_v]`` (rows of no sequence are 0)."""
        return Varlen.unpack(out, *self.varlen_rows)

    def interpret(self, value: Any) -> Returned:
        """Translate a return value: an array, or a pair ``(out, weights)``; anything else is a problem."""
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
            if self.spec.returns == "auto" and self.is_array(value) and not self.is_array(weights):
                weights = None  # (out, something else): x-transformers' Attend returns (out, Intermediates)
        elif self.spec.returns == "output+weights":
            return Returned(
                problem=f"returned a {type(value).__name__}; declared returns='output+weights' "
                "expects a pair (out, weights)"
            )
        if not self.is_array(value):
            return Returned(problem=f"returned {_describe(value)}, not an array")
        if weights is not None and not self.is_array(weights):
            return Returned(problem=f"returned weights that are {_describe(weights)}, not an array")
        try:
            out = np.array(self.host(value))
            if self.interface.packed:
                if out.ndim != 3 or out.shape[0] != int(sum(self.varlen_rows[0])):
                    return Returned(problem=f"returned shape {out.shape}; expected [total_q, h, d_v] (packed)")
                out = self._unpack(out)
            else:
                out = self.from_layout(out)
            w = None if weights is None else np.array(self.host(weights))  # [B, h, n_q, n_k] in every layout
        except Exception as err:  # garbage that looks like an array
            return Returned(problem=f"returned something that could not be read as an array ({err})")
        if out.dtype.kind not in "fc":
            return Returned(problem=f"returned an array of dtype {out.dtype}, not floating point")
        wrong = self.foreign(value, "output") or (None if weights is None else self.foreign(weights, "weights"))
        return Returned(out=out, weights=w, out_dtype=framework_dtype_name(value), wrong_type=wrong)

    def foreign(self, x: Any, what: str) -> str | None:
        """Why ``x`` is not an array of the function's own library, or None when it is."""
        kind = type(x)
        name = f"{kind.__module__}.{kind.__qualname__}"
        if self.framework == "numpy":
            ok, want = isinstance(x, np.ndarray), "numpy.ndarray"
        elif self.framework == "torch":
            ok, want = isinstance(x, self._lib.Tensor), "torch.Tensor"
        else:
            jax, _ = self._lib
            ok, want = isinstance(x, jax.Array), "jax.Array"
        return None if ok else f"the {what} is a {name}; a {self.framework} function must return a {want}"

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
        after = self.snapshot(args, kwargs)
        changed = []
        for (name, a), (_, b) in zip(before, after, strict=True):
            if a.shape != b.shape or not np.array_equal(a, b, equal_nan=True):
                changed.append(name)
        return changed

    def with_spec(self, **changes: Any) -> Adapter:
        return Adapter(self.original, replace(self.spec, **changes))


def _describe(x: Any) -> str:
    if x is None:
        return "None"
    text = repr(x)
    return f"a {type(x).__name__} ({text[:40]}{'...' if len(text) > 40 else ''})"
