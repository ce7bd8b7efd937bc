"""The gradient oracle: run anyone's attention backward pass through the battery and name the bug (issue 14).

Three kinds of function are checked (``kind``):

* ``"autograd"``: a forward ``fn(q, k, v, ...)`` whose gradients come from its framework: PyTorch autograd
  through the user's code (plain ops, a custom ``torch.autograd.Function``, a module), or ``jax.vjp``;
* ``"plain"``: a hand-written ``bwd(q, k, v, d_out, mask=None, scale=None) -> (dq, dk, dv)``;
* ``"flash"``: FlashAttention-2's ``bwd(q, k, v, out, lse, d_out, ...) -> (dq, dk, dv)``, with its forward
  ``fwd(q, k, v, ...) -> (out, lse)`` or, without one, the golden ``out`` and ``lse`` (``lse [B, h, n_q]`` in the
  declared units, ``lse_units="nats"`` or ``"log2"``).

Optional keywords are passed when the function has them: ``mask=`` (True = may attend), ``scale=``, ``causal=``,
``dropout_mask=`` (bool ``[B, h, n_q, n_k]``, True = kept) with ``dropout_p=``, and ``bias=`` (then ``d_bias`` is
the fourth output). The gradients are compared with attnlab's analytic backward
(:func:`attnlab.core.gradients.attention_backward` on an :func:`attnlab.attention_trace` in float64) under
FlashAttention's rule for gradients: ``max|g - golden| <= 3 · max|naive_p - golden| + floor(p) · max(1, |golden|)``
with ``naive_p`` the same steps rounded to the input precision ``p``. A mismatch is diagnosed by recomputing the
golden gradient under each named mistake of :mod:`attnlab.checker.grad_hypotheses`.

The gradient probes (``GRAD_PROBES``), after the forward's preflight finds the dtypes and capabilities:

==========================  ========================================================================  ==========
probe                       experiment                                                                needs
==========================  ========================================================================  ==========
``grad-reference``          dq, dk, dv (d_bias) on the grid (n_q != n_k, d_v != d_k, sizes that do     --
                            not divide a block, B > 1, h > 1, masks per batch element and head,
                            causal, GQA, cross) in every dtype; mismatches are diagnosed
``grad-masked-keys``        a key masked for every query, with huge K and V: its dK and dV must be     mask
                            exactly 0, and changing it must not move any other gradient
``grad-masked-rows``        a query row with no allowed key: finite gradients, those of the forward's  mask
                            policy (zeros, or the uniform average)
``grad-batch``              change one batch element / head (inputs and d_out): the gradients of the   --
                            others must not move
``grad-dropout``            an explicit keep mask and p: the gradients of the forward with that mask   dropout
==========================  ========================================================================  ==========

Every call is also checked for ``crash``, ``timeout``, ``mutates-input`` (q, k, v, d_out, out, lse, masks),
``dtype`` (each gradient in its input's dtype) and ``output-type``.

>>> import numpy as np
>>> from attnlab.core.gradients import attention_backward
>>> from attnlab import attention_trace
>>> def bwd(q, k, v, d_out, mask=None, scale=None):
...     t = attention_trace(q, k, v, mask, scale=scale, masked_rows="zero")
...     g = attention_backward(t, d_out)
...     return g.dq, g.dk, g.dv
>>> check_backward(bwd, dtypes=("float64",)).codes
()
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any, TypedDict, cast

import numpy as np

from .. import masks as _masks
from ..core import attention_trace
from ..core.dropout import Dropout
from ..core.gradients import attention_backward
from .adapters import DTYPES, Adapter, Returned, Spec, UsageError, framework_dtype_name, round_to
from .callables import signature_of
from .cases import LENGTH_FORMS, Geom
from .grad_hypotheses import Variant, attention_grads, fitted_lse, hypotheses, reduce_kv
from .probes import FIXES, Battery, ProbeSkip
from .report import Finding, ProbeResult, Report, Unsupported
from .runner import CallRequest, Case, InProcessBackend, Outcome, Runner, loaded_frameworks
from .tolerance import bound, compare, expand_kv, golden_output, naive_output

__all__ = [
    "BACKWARD_CODES",
    "GRAD_FIXES",
    "GRAD_PROBES",
    "KINDS",
    "GradAdapter",
    "GradBattery",
    "GradCase",
    "GradRequest",
    "GradReturned",
    "check_backward",
    "detect_kind",
    "golden_grads",
    "grad_bound",
    "with_backward",
]

#: How the gradients are obtained: ``auto`` (from the signature), ``autograd`` (PyTorch's, through the forward),
#: ``plain`` (a backward taking ``q, k, v, d_out``) or ``flash`` (FlashAttention-2's signature, with ``out`` and
#: ``lse``).
KINDS = ("auto", "autograd", "plain", "flash")
#: ``kind="backward"`` (internal): plain or flash, decided from the signature where the function is imported.
_ADAPTER_KINDS = (*KINDS, "backward")
LSE_UNITS = ("nats", "log2")
#: Every gradient probe (``probes=`` selects some).
GRAD_PROBES = ("grad-reference", "grad-masked-keys", "grad-masked-rows", "grad-batch", "grad-dropout")
#: The gradient probes that must run (for what the function supports) before a report may say OK.
CORE_GRAD_PROBES = ("grad-reference", "grad-masked-keys", "grad-masked-rows")

#: The backward finding codes, with their meaning in a few words (docs/checker.md, "Backward", explains each).
BACKWARD_CODES: dict[str, str] = {
    "grad-mismatch": "gradients differ from the float64 golden and no named mistake explains it",
    "grad-jacobian": "the softmax-Jacobian term is missing (dS = P ∘ dP without - delta)",
    "grad-delta": "delta is computed from the wrong quantity (rowsum(dP) or rowsum(P) instead of rowsum(dO ∘ O))",
    "grad-scale": "1/sqrt(d_k) is missing from dQ/dK, or applied twice",
    "grad-transposed": "dV, dK or dQ is computed with a transposed factor (P instead of Pᵀ, dS instead of dSᵀ)",
    "grad-masked-leak": "masked keys' K/V receive gradient from rows that cannot see them",
    "grad-masked-row": "NaN/inf gradients on fully masked rows, or gradients not following the forward's policy",
    "grad-gqa-sum": "GQA dK/dV are not summed over the query heads of a group",
    "grad-lse": "the backward's P is recomputed from a wrong lse (no max, wrong units, wrong axis)",
    "grad-accumulate": "per-block accumulators (dK/dV/dQ) are overwritten instead of accumulated",
    "grad-causal": "the backward's causal mask is off by one, or has the other alignment, unlike the forward's",
    "grad-dropout": "the backward's dropout mask or 1/(1-p) differs from the forward's",
    "grad-batch-leak": "gradients mix batch elements or heads",
}

#: How to fix each backward bug (and the forward codes the gradient battery reuses).
GRAD_FIXES: dict[str, str] = {
    "grad-jacobian": "apply the softmax Jacobian: dS = P ∘ (dP - delta) with delta = rowsum(dO ∘ O) (= rowsum(dP ∘ P))",
    "grad-delta": "compute delta = rowsum(dO ∘ O) per query row (FlashAttention-2's D), not rowsum(dP) or rowsum(P)",
    "grad-scale": "multiply dQ = dS K and dK = dSᵀ Q by the forward's scale (1/sqrt(d_k)) exactly once",
    "grad-transposed": "dV = Pᵀ dO, dP = dO Vᵀ, dQ = dS K, dK = dSᵀ Q: check which factor is transposed",
    "grad-masked-leak": "recompute P in the backward with the forward's mask (masked entries exactly 0), so dS is 0 "
    "there and masked keys get no gradient",
    "grad-masked-row": "give fully masked rows the gradient of the forward's policy: zero (lse = -inf rows skipped, "
    "never exp(-inf - -inf)), or that of the uniform average",
    "grad-gqa-sum": "sum dK and dV over the query heads that share a K/V head (i // (h / h_kv)), never take one "
    "head's or the mean",
    "grad-lse": "recompute P = exp(s - lse) with lse = m + log(l) (the row max added back) in the forward's units "
    "(exp2 for a log2 lse), per query row",
    "grad-accumulate": "accumulate per-block contributions (dK_j += dSᵀ_ij Q_i, dV_j += Pᵀ_ij dO_i, "
    "dQ_i += dS_ij K_j); zero the accumulators once, before the loop",
    "grad-causal": "use exactly the forward's causal mask in the backward (key j allowed for query i when j <= i, "
    "+ n_k - n_q bottom-right)",
    "grad-dropout": "reuse the forward's keep mask in the backward and scale by 1/(1-p) once: dV = (P ∘ keep/(1-p))ᵀ "
    "dO and dP = (dO Vᵀ) ∘ keep/(1-p)",
    "grad-batch-leak": "keep batch and head axes separate in the backward (no reshape across them, no sums over "
    "them except GQA's group sum)",
    "grad-mismatch": "compare one failing case step by step with attnlab.core.gradients.attention_backward (dV, dP, "
    "delta, dS, dQ, dK)",
}
for _code in ("crash", "timeout", "dtype", "mutates-input", "output-type", "reference-mismatch"):
    GRAD_FIXES.setdefault(_code, FIXES[_code])
GRAD_FIXES["dtype"] = "return each gradient in its input's dtype (dq like q, dk like k, ...): cast back after computing"

_ORDER = [*BACKWARD_CODES, "reference-mismatch", "crash", "timeout", "dtype", "mutates-input", "output-type"]
_GENERIC = ("grad-mismatch",)
_MASK_NAMES = ("mask", "attn_mask", "attention_mask")
_CAUSAL_NAMES = ("causal", "is_causal")
_SCALE_NAMES = ("scale", "softmax_scale", "sm_scale")
_KEEP_NAMES = ("dropout_mask", "keep_mask")
_P_NAMES = ("dropout_p",)
_BIAS_NAMES = ("bias", "attn_bias")
_FLASH_NAMES = ("lse", "logsumexp", "softmax_lse", "out", "o", "output")
_GRADS = ("dq", "dk", "dv", "dbias")
#: Capabilities only the gradient battery has (declared with unsupported=..., reported as not tested).
GRAD_CAPABILITIES = ("dropout", "bias")


#: Mismatching cases diagnosed (the hypotheses are recomputed for each), at most.
DIAGNOSED_CASES = 16


# ----------------------------------------------------------------------------------------------------------------
# cases, requests and return values


@dataclass(frozen=True)
class GradCase(Case):
    """A forward case plus the upstream gradient ``d_out [..., h, n_q, d_v]`` and, optionally, a dropout keep mask
    ``keep [..., h, n_q, n_k]`` (True = kept) with ``dropout_p``, and a bias ``[..., h, n_q, n_k]``."""

    # always given (GradBattery.grad_case); the default is there only because Case's fields have defaults
    d_out: np.ndarray = None  # type: ignore[assignment]  # a None default for a field that holds an array
    keep: np.ndarray | None = None
    dropout_p: float = 0.0
    bias: np.ndarray | None = None


@dataclass(frozen=True)
class GradRequest(CallRequest):
    """A :class:`~attnlab.checker.runner.CallRequest` with what a backward also takes: ``d_out``, dropout, bias, and
    (flash backwards without a forward) the golden ``out`` and ``lse`` in the declared units."""

    d_out: np.ndarray | None = None
    keep: np.ndarray | None = None
    dropout_p: float = 0.0
    bias: np.ndarray | None = None
    out: np.ndarray | None = None
    lse: np.ndarray | None = None


@dataclass
class GradReturned(Returned):
    """The gradients ``{"dq", "dk", "dv"[, "dbias"]}`` (canonical NumPy), their dtypes, and the forward's output
    when the call ran one (autograd, or a flash backward with its forward)."""

    grads: dict[str, np.ndarray] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Value:
    """What the call wrapper returns: the function's gradients and, when it ran, its forward output."""

    grads: Any
    out: Any = None


def detect_kind(fn: Any) -> str:
    """``"flash"`` when ``fn`` takes the forward's ``lse`` or ``out`` (FlashAttention-2's backward signature: by
    name, or six positional parameters), ``"plain"`` when it takes an upstream gradient after q, k, v (``d_out``,
    ``do``, ``grad_output``, ``dy``, ...), else ``"autograd"`` (a forward)."""
    params = signature_of(fn) or {}
    pos = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [p.name.lower() for p in pos]
    if any(n in _FLASH_NAMES for n in names[3:6]):
        return "flash"
    known = set(_MASK_NAMES + _CAUSAL_NAMES + _SCALE_NAMES + _KEEP_NAMES + _P_NAMES + _BIAS_NAMES)
    if len(names) >= 6 and not known & set(names[3:6]) and _is_gradient_name(names[5]):
        return "flash"
    if len(names) >= 4 and _is_gradient_name(names[3]):
        return "plain"
    return "autograd"


def _is_gradient_name(name: str) -> bool:
    n = name.lower().replace("_", "")
    return n in ("dout", "do", "gout", "go", "dy", "g", "dz") or n.startswith(("grad", "dout", "dldo", "dlo"))


def _first(params: dict[str, Any], names: tuple[str, ...], override: str | None = None) -> str | None:
    if override:
        return override
    return next((n for n in names if n in params), None)


class GradAdapter(Adapter):
    """Translate gradient cases into calls of a backward (or of a forward, through autograd), and back.

    Conversions (dtypes, layouts, mask conventions, library types) are :class:`~attnlab.checker.adapters.Adapter`'s.
    """

    def __init__(
        self,
        fn: Any,
        spec: Spec,
        *,
        kind: str = "auto",
        forward: Any = None,
        lse_units: str = "nats",
        extra_unsupported: Iterable[str] = (),
    ):
        if kind not in _ADAPTER_KINDS:
            raise UsageError(f"kind: expected one of {', '.join(map(repr, KINDS))}, got {kind!r}")
        if lse_units not in LSE_UNITS:
            raise UsageError(f"lse_units: expected 'nats' or 'log2', got {lse_units!r}")
        super().__init__(fn, spec)
        if kind == "backward":  # a hand-written backward: FlashAttention-2's signature, or else the plain one
            kind = "flash" if detect_kind(self.fn) == "flash" else "plain"
            if kind == "plain":
                forward = None  # a plain backward needs no forward (one offered is not used)
        self.kind = detect_kind(self.fn) if kind == "auto" else kind
        if self.kind == "autograd" and self.framework == "numpy" and spec.framework == "auto":
            # a forward whose library was not seen in its code (imported inside a helper): NumPy has no gradient,
            # so take the loaded library that has one
            other = next(iter(loaded_frameworks()), None)
            if other is not None:
                super().__init__(fn, replace(spec, framework=other))
                why = f"{other}: NumPy (detected) has no gradient, and {other} is loaded"
                self.resolved = replace(self.resolved, detected=why)
        self.lse_units = lse_units
        self.user_fn = self.fn
        self.forward = None
        if forward is not None:
            if self.kind != "flash":
                raise UsageError("forward: only a flash backward bwd(q, k, v, out, lse, d_out, ...) takes a forward")
            self.forward = Adapter(forward, spec)
        params = signature_of(self.fn) or {}
        r = self.resolved
        if self.kind == "autograd":
            if self.framework == "numpy":
                raise UsageError(
                    "backward=True: a NumPy function has no gradient to check; pass its hand-written backward as "
                    "backward=bwd (or check_backward(bwd))"
                )
            mask_arg, causal_arg, scale_arg = r.mask_arg, r.causal_arg, r.scale_arg
        else:
            mask_arg = _first(params, _MASK_NAMES, spec.mask_arg)
            causal_arg = None if spec.causal_only else _first(params, _CAUSAL_NAMES, spec.causal_arg)
            scale_arg = _first(params, _SCALE_NAMES, spec.scale_arg)
        positional = r.mask_positional if self.kind == "autograd" else False
        gqa_arg = r.gqa_arg if self.kind == "autograd" else None  # a forward's enable_gqa=
        # ``mode`` carries the kind to the parent when this adapter lives in a worker process
        self.resolved = replace(
            r,
            mode=f"backward {self.kind}" + ("+forward" if forward is not None else ""),
            mask_arg=mask_arg,
            causal_arg=causal_arg,
            scale_arg=scale_arg,
            mask_positional=positional,
            gqa_arg=gqa_arg,
        )
        # dropout and bias go to the backward when it takes them (and, with a forward, when that takes them too)
        fparams = None if self.forward is None else (signature_of(self.forward.fn) or {})

        def both(names: tuple[str, ...]) -> str | None:
            name = _first(params, names)
            return None if name is None or (fparams is not None and name not in fparams) else name

        self.keep_arg = both(_KEEP_NAMES)
        self.p_arg = both(_P_NAMES)
        self.bias_arg = both(_BIAS_NAMES)
        self.pending: dict[str, Any] = {}
        self.bias_given = False
        self.inner_mutated: list[str] = []
        self.extra_unsupported = dict.fromkeys(extra_unsupported, "declared unsupported")
        self.fn = self._call

    def structural_unsupported(self) -> dict[str, str]:
        out = super().structural_unsupported()
        out["rank"] = "the gradient battery calls with 4-D inputs [B, h, n, d]"
        if self.keep_arg is None or self.p_arg is None:
            out["dropout"] = "the function takes no dropout_mask= and dropout_p="
        if self.bias_arg is None:
            out["bias"] = "the function takes no bias="
        out.update(self.extra_unsupported)
        return out

    # -- one call ---------------------------------------------------------------------------------------------
    def build_request(self, req: GradRequest) -> tuple[tuple, dict]:
        """The arguments of the call the wrapper makes; what is not the user's (d_out, out, lse) is pending."""
        args, kwargs = self.build_call(
            req.q, req.k, req.v, dtype=req.dtype, mask=req.mask, causal=req.causal, scale=req.scale, gqa=req.gqa
        )
        if req.keep is not None and self.keep_arg is not None:
            kwargs[self.keep_arg] = self.to_bool(req.keep)
            if self.p_arg is not None:
                kwargs[self.p_arg] = float(req.dropout_p)
        if req.bias is not None and self.bias_arg is not None:
            kwargs[self.bias_arg] = self.to_framework(req.bias, req.dtype)
        self.bias_given = req.bias is not None and self.bias_arg is not None
        assert req.d_out is not None  # every gradient request carries d_out (GradRunner.request)
        d_out = self.to_framework(self.to_layout(req.d_out), req.dtype)
        pending: dict[str, Any] = {"d_out": d_out}
        if self.kind == "flash" and self.forward is None:
            assert req.out is not None and req.lse is not None  # the golden ones (GradRunner: golden_lse)
            pending["out"] = self.to_framework(self.to_layout(req.out), req.dtype)
            pending["lse"] = self.to_framework(req.lse, "float64" if req.dtype == "float64" else "float32")
        self.pending = pending
        return args, kwargs

    def to_bool(self, x: np.ndarray) -> Any:
        """A keep mask as a bool array of the function's library, on its device."""
        return self.fw.exact(np.array(x, dtype=bool))

    def to_framework(self, x: np.ndarray, dtype: str) -> Any:
        """A fresh float array of the function's library (on its device) holding ``x`` in ``dtype``."""
        return self.fw.floats(x, dtype)

    def to_layout(self, x: np.ndarray) -> np.ndarray:
        """A canonical ``[B, h, n, d]`` array in the declared layout (``bnhd`` swaps the middle axes)."""
        return np.swapaxes(x, -2, -3) if self.spec.layout == "bnhd" else x

    from_layout = to_layout  # the swap is its own inverse

    def snapshot(self, args: tuple, kwargs: dict) -> list[tuple[str, np.ndarray]]:
        out = super().snapshot(args, kwargs)
        for name, a in self.pending.items():
            out.append((name, np.array(self.host(a), copy=True)))
        return out

    def mutated(self, args: tuple, kwargs: dict, before: list[tuple[str, np.ndarray]]) -> list[str]:
        """The arguments the call changed, including ``d_out`` and the forward's results the backward was given."""
        return super().mutated(args, kwargs, before) + self.inner_mutated

    def _call(self, *args: Any, **kwargs: Any) -> _Value:
        pend = self.pending
        self.inner_mutated = []
        if self.kind == "autograd":
            return self._autograd(args, kwargs, pend["d_out"])
        if self.kind == "plain":
            return _Value(self.user_fn(*args[:3], pend["d_out"], *args[3:], **kwargs))
        if self.forward is None:
            return _Value(self.user_fn(*args[:3], pend["out"], pend["lse"], pend["d_out"], *args[3:], **kwargs))
        fparams = signature_of(self.forward.fn) or {}
        fkw = {key: val for key, val in kwargs.items() if key in fparams}
        res = self.forward.fn(*args, **fkw)
        if not isinstance(res, (tuple, list)) or len(res) != 2:
            raise TypeError(f"the forward returned {type(res).__name__}; expected a pair (out, lse)")
        out, lse = res
        before = [(name, np.array(self.host(x), copy=True)) for name, x in (("out", out), ("lse", lse))]
        value = _Value(self.user_fn(*args[:3], out, lse, pend["d_out"], *args[3:], **kwargs), out)
        for name, x in before:  # the forward's out and lse, as the backward received them
            after = np.asarray(self.host(out if name == "out" else lse))
            if after.shape != x.shape or not np.array_equal(after, x, equal_nan=True):
                self.inner_mutated.append(name)
        return value

    def _autograd(self, args: tuple, kwargs: dict, d_out: Any) -> _Value:
        leaves_at: list[int | str] = [0, 1, 2]
        if self.bias_arg is not None and self.bias_arg in kwargs:
            leaves_at.append(self.bias_arg)
        if self.framework == "torch":
            fw: Any = self.fw  # a TorchFramework
            torch = fw.torch
            args_list = list(args)
            for i in leaves_at:
                if isinstance(i, int):
                    args_list[i] = args_list[i].detach().requires_grad_(True)
                else:
                    kwargs[i] = kwargs[i].detach().requires_grad_(True)
            leaves = [args_list[i] if isinstance(i, int) else kwargs[i] for i in leaves_at]
            with torch.enable_grad():
                out = _output_of(self.user_fn(*args_list, **kwargs))
                if not isinstance(out, torch.Tensor) or not out.requires_grad:
                    raise TypeError(
                        "the output carries no autograd graph (computed outside torch, detached, or under no_grad): "
                        "backward=True needs gradients through the function"
                    )
                grads = torch.autograd.grad(out, leaves, grad_outputs=d_out, allow_unused=True)
            grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves, strict=True)]
            return _Value(tuple(grads), out.detach())
        fw_jax: Any = self.fw  # a JaxFramework
        jax = fw_jax.jax
        rest = args[3:]
        bias_key = self.bias_arg if self.bias_arg in kwargs else None

        def f(q: Any, k: Any, v: Any, *b: Any) -> Any:
            kw = dict(kwargs)
            if bias_key is not None:
                kw[bias_key] = b[0]
            return _output_of(self.user_fn(q, k, v, *rest, **kw))

        primals = [*args[:3]] + ([kwargs[bias_key]] if bias_key is not None else [])

        def both(d: Any, *xs: Any) -> Any:
            out, vjp = jax.vjp(f, *xs)
            return out, vjp(d.astype(out.dtype))

        try:  # one compilation of the whole forward and backward instead of one per operation
            out, grads = jax.jit(both)(d_out, *primals)
        except jax.errors.JAXTypeError:  # value-dependent Python control flow: op by op
            out, grads = both(d_out, *primals)
        return _Value(tuple(grads), out)

    def interpret(self, value: Any) -> GradReturned:
        if not isinstance(value, _Value):  # pragma: no cover - the wrapper always returns one
            return GradReturned(problem="returned something the gradient battery did not make")
        grads = value.grads
        if isinstance(grads, dict) and {"dq", "dk", "dv"} <= set(grads):  # {"dq": ..., "dk": ..., "dv": ...}
            grads = tuple(grads[n] for n in _GRADS if grads.get(n) is not None)
        if hasattr(grads, "dq") and hasattr(grads, "dk") and hasattr(grads, "dv"):  # attnlab's FlashGrads & co.
            grads = (grads.dq, grads.dk, grads.dv) + (
                (grads.dbias,) if getattr(grads, "dbias", None) is not None else ()
            )
        want = 4 if self.bias_given else 3
        if not isinstance(grads, (tuple, list)) or len(grads) < 3 or len(grads) > 4:
            return GradReturned(
                problem=f"returned {_what(grads)}; expected a tuple (dq, dk, dv)" + (" and d_bias" if want == 4 else "")
            )
        if want == 4 and len(grads) == 3:
            return GradReturned(problem="returned 3 gradients with bias= given; expected (dq, dk, dv, d_bias)")
        names = _GRADS[: len(grads)] if want == 4 else _GRADS[:3]
        got: dict[str, np.ndarray] = {}
        dtypes: dict[str, str] = {}
        wrong = None
        for name, g in zip(names, grads, strict=False):
            if not self.is_array(g):
                return GradReturned(problem=f"returned {name} that is {_what(g)}, not an array")
            try:
                a = np.array(self.host(g), dtype=np.float64)
            except Exception as err:
                return GradReturned(problem=f"returned {name} that could not be read as an array ({err})")
            dtypes[name] = framework_dtype_name(g)
            wrong = wrong or self.fw.foreign(g, name)
            if a.ndim == 0:  # one number where an array shaped like the input belongs: not compared, not indexed
                wrong = wrong or f"the {name} is a 0-d array (one number); a gradient has the shape of its input"
                continue
            got[name] = a if name == "dbias" else self.from_layout(a)
        out = None
        if value.out is not None and self.is_array(value.out):
            out = self.from_layout(np.array(self.host(value.out), dtype=np.float64))
        return GradReturned(out=out, grads=got, dtypes=dtypes, wrong_type=wrong)


def _output_of(value: Any) -> Any:
    """The output of a forward: an array, the first of a pair, or a result object's ``.output``."""
    if isinstance(value, (tuple, list)) and value:
        return value[0]
    out = getattr(value, "output", None)
    return value if out is None else out


def _what(x: Any) -> str:
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)} items"
    return "None" if x is None else f"a {type(x).__name__}"


class GradRunner(Runner):
    """The forward's :class:`~attnlab.checker.runner.Runner`, sending :class:`GradRequest` s."""

    def __init__(self, backend: Any, *, timeout: float, lse_units: str, gqa_map: str, golden_lse: bool):
        super().__init__(backend, timeout=timeout)
        self.lse_units = lse_units
        self.gqa_map = gqa_map
        self.golden_lse = golden_lse

    def request(self, case: Case, causal_flag: bool | str, gqa: bool) -> CallRequest:
        g = cast(GradCase, case)
        out = lse = None
        if self.golden_lse:  # a flash backward without a forward (or one not yet known) gets the golden out and lse
            out, lse = golden_out_lse(g, self.gqa_map)
            if self.lse_units == "log2":
                lse = lse / math.log(2)
        return GradRequest(
            g.q, g.k, g.v, g.dtype, g.mask, causal_flag, g.scale, gqa, g.d_out, g.keep, g.dropout_p, g.bias, out, lse
        )


# ----------------------------------------------------------------------------------------------------------------
# the golden


def _allowed(case: Case) -> Any:
    """The full boolean mask ``[..., h, n_q, n_k]`` (typed ``Any``: NumPy's stubs type its reductions as scalars or
    arrays, and they are indexed)."""
    n_q, n_k = case.q.shape[-2], case.k.shape[-2]
    full = (*case.q.shape[:-2], n_q, n_k)
    a = np.ones(full, bool) if case.mask is None else np.broadcast_to(case.mask, full)
    if case.causal is not None:
        a = a & _masks.causal(n_q, n_k, align=cast(_masks.Align, case.causal))
    return a


def _golden_trace(case: GradCase, mapping: str) -> tuple[Any, np.ndarray]:
    """The float64 trace of ``case`` with K/V expanded to every head (fully masked rows zero), and the expanded V."""
    q = case.q
    k, v = expand_kv(q, case.k, mapping), expand_kv(q, case.v, mapping)
    t = attention_trace(
        q,
        k,
        v,
        case.mask,
        causal=cast(_masks.Align, case.causal) or False,
        scale=case.scale,
        bias=case.bias,
        masked_rows="zero",
    )
    return t, v


def golden_out_lse(case: GradCase, mapping: str = "interleave") -> tuple[np.ndarray, np.ndarray]:
    """The forward's output (rounded to the case's dtype) and lse in nats ``[..., h, n_q]`` (``-inf`` on fully
    masked rows), as a flash backward receives them without a forward of its own."""
    t, v = _golden_trace(case, mapping)
    w = np.asarray(t.weights)
    if case.keep is not None:
        w = w * case.keep / (1.0 - case.dropout_p)
    out = round_to(w @ v, case.dtype).astype(np.float64)
    lg = np.asarray(t.logits)
    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.max(lg, axis=-1, keepdims=True)
        m0 = np.where(np.isfinite(m), m, 0.0)
        lse = (m0 + np.log(np.sum(np.exp(lg - m0), axis=-1, keepdims=True)))[..., 0]
    return out, lse


def golden_grads(case: GradCase, mapping: str = "interleave") -> dict[str, np.ndarray | None]:
    """attnlab's analytic float64 gradients of ``case`` (:func:`attnlab.core.gradients.attention_backward`), K/V
    gradients summed over GQA groups; fully masked rows give zero gradient."""
    h_kv = case.k.shape[-3]
    t, _ = _golden_trace(case, mapping)
    drop = None if case.keep is None else Dropout(case.dropout_p, np.asarray(case.keep, bool))
    g = attention_backward(t, case.d_out, dropout=drop)
    return {
        "dq": np.asarray(g.dq),
        "dk": reduce_kv(np.asarray(g.dk), h_kv, mapping),
        "dv": reduce_kv(np.asarray(g.dv), h_kv, mapping),
        "dbias": None if g.dbias is None else np.asarray(g.dbias),
        "out": np.asarray(t.output) if case.keep is None else None,
    }


def grad_bound(dtype: str, golden: np.ndarray, naive: np.ndarray | None) -> float:
    """FlashAttention's rule for gradients: 3 x a same-precision naive implementation's error, plus the floor."""
    return bound(dtype, golden, naive, factor=3.0)


# ----------------------------------------------------------------------------------------------------------------
# the battery


class _Flags(TypedDict, total=False):
    """The keywords of :meth:`~attnlab.checker.probes.Battery.make` a combination sets."""

    causal: bool
    mask: bool


_COMBOS: list[tuple[str, Geom, tuple[str, ...], _Flags]] = [
    ("causal+mask", Geom(2, 2, 13, 13, 5, 7), ("causal", "mask", "dv"), {"causal": True, "mask": True}),
    ("mask+cross", Geom(2, 2, 5, 8, 8, 8), ("mask", "cross"), {"mask": True}),
    ("mask+cross-2", Geom(2, 3, 7, 4, 4, 4), ("mask", "cross"), {"mask": True}),
    ("causal+cross", Geom(1, 2, 6, 11, 8, 8), ("causal", "cross", "causal-cross"), {"causal": True}),
    ("gqa+causal", Geom(2, 4, 9, 9, 8, 6, h_kv=2), ("gqa", "causal"), {"causal": True}),
    ("gqa+mask", Geom(1, 6, 5, 7, 4, 4, h_kv=3), ("gqa", "mask", "cross"), {"mask": True}),
    ("long", Geom(1, 2, 45, 70, 16, 16), ("cross",), {}),
    ("long-causal", Geom(1, 1, 67, 67, 8, 8), ("causal",), {"causal": True}),
    ("long-mask", Geom(1, 1, 37, 37, 8, 8), ("mask",), {"mask": True}),
    ("odd", Geom(2, 3, 11, 11, 5, 5), (), {}),
]


class GradBattery(Battery):
    """The gradient probes on one function (a subclass of the forward's :class:`~attnlab.checker.probes.Battery`:
    the same preflight, cases, masks, refusal rules and findings bookkeeping)."""

    fixes = GRAD_FIXES

    def __init__(
        self,
        backend: Any,
        spec: Spec,
        *,
        timeout: float,
        seed: int,
        probes: tuple[str, ...],
        lse_units: str,
        kind: str = "plain",
        with_forward: bool = False,
        align: str | None = None,
        forward_checked: bool | str = False,
    ):
        super().__init__(backend, spec, timeout=timeout, seed=seed, probes=probes)
        # causal=True with n_q != n_k: top-left unless declared (or, through autograd, what the forward does)
        self.align = spec.causal_align or align or "top_left"
        self.kind = kind
        self.has_forward = kind == "autograd" or with_forward
        golden_lse = kind in ("flash", "backward") and not with_forward
        self.runner = GradRunner(
            backend, timeout=timeout, lse_units=lse_units, gqa_map=self.gqa_map, golden_lse=golden_lse
        )
        self.forward_wrong: set[str] = set()
        self.forward_checked = bool(forward_checked)
        #: the forward finding that explains gradient codes of a case whose forward output is wrong
        self.forward_code = forward_checked if isinstance(forward_checked, str) else "reference-mismatch"
        self.diagnosed = 0
        self.matched: list[tuple[str, str, Any]] = []  # hypotheses that explained a case, tried first next time
        self.lse_units = lse_units

    # -- findings ---------------------------------------------------------------------------------------------
    def findings_list(self) -> tuple[tuple[Finding, ...], tuple[Finding, ...]]:
        """Bugs in a stable order, and the explained ones: ``grad-mismatch`` seen in a case where a named code is
        seen too, and (``explained_by="reference-mismatch"``) any gradient code in a case whose forward output was
        already wrong."""
        by_case: dict[str, set[str]] = {}
        for o in self.obs:
            by_case.setdefault(o.case, set()).add(o.finding.code)
        kept: dict[str, Finding] = {}
        explained: dict[str, Finding] = {}
        leaky = any(o.finding.code == "grad-batch-leak" for o in self.obs)
        for o in self.obs:
            code, seen = o.finding.code, by_case[o.case] - {o.finding.code}
            why = None
            if code in _GENERIC:
                named = [c for c in _ORDER if c in seen and (c in BACKWARD_CODES or c == "mutates-input")]
                named = [c for c in named if c not in _GENERIC]
                why = named[0] if named else None
            if why is None and code in ("grad-mismatch", "grad-masked-row") and leaky:
                # a gradient that mixes batch elements or heads is wrong in every case with B > 1 or h > 1, and
                # no per-case hypothesis expresses it (as nondeterminism explains the forward's perturbation leaks)
                why = "grad-batch-leak"
            if why is None and o.case in self.forward_wrong and code in BACKWARD_CODES and "forward" not in o.case:
                why = self.forward_code
            if why is None:
                kept.setdefault(code, o.finding)
            elif code not in explained:
                f = o.finding
                explained[code] = Finding(f.code, f.message, f.evidence, f.fix, f.probe, f.severity, why)
        bugs = sorted(kept.values(), key=lambda f: _ORDER.index(f.code))
        also = sorted((f for c, f in explained.items() if c not in kept), key=lambda f: _ORDER.index(f.code))
        return tuple(bugs), tuple(also)

    def unsupported_list(self) -> tuple[Unsupported, ...]:
        """The capabilities the function lacks, the forward's and the gradient ones (``dropout``, ``bias``...)."""
        grad = tuple(Unsupported(c, r) for c, r in self.unsupported.items() if c in GRAD_CAPABILITIES)
        return super().unsupported_list() + grad

    # -- calls ------------------------------------------------------------------------------------------------
    def grad_case(
        self,
        case: Case,
        *,
        keep: np.ndarray | None = None,
        dropout_p: float = 0.0,
        bias: bool | np.ndarray = False,
    ) -> GradCase:
        """``case`` with a random ``d_out`` in its dtype (and a bias when asked and supported)."""
        if isinstance(case, GradCase):
            return case
        shape = (*case.q.shape[:-1], case.v.shape[-1])
        d_out = round_to(self.rng.normal(0, 1, shape), case.dtype).astype(np.float64)
        b = None
        if isinstance(bias, np.ndarray):
            b = bias
        elif bias and "bias" not in self.unsupported:
            full = (*case.q.shape[:-2], case.q.shape[-2], case.k.shape[-2])
            b = round_to(self.rng.normal(0, 1, full), case.dtype).astype(np.float64)
        vals = {f.name: getattr(case, f.name) for f in fields(Case)}
        return GradCase(**vals, d_out=d_out, keep=keep, dropout_p=dropout_p, bias=b)

    def call(self, case: Case) -> Outcome:
        """Call the backward on ``case`` (a random ``d_out`` is drawn for a forward case) and check what every call
        must satisfy; the gradients' dtypes are checked here."""
        g = self.grad_case(case)
        passed, flag = self.as_passed(g, "top_left")
        out = self.runner.call(passed, causal_flag=flag, gqa=g.gqa)
        out.case = g
        self.every_call(g, out)
        ret = out.returned
        if out.ok and isinstance(ret, GradReturned):
            for name, dt in ret.dtypes.items():
                if dt != g.dtype:
                    self.bug(
                        "dtype",
                        f"your function returns {name} in {dt} for {g.dtype} inputs",
                        f"case {g.label}: {g.shapes()}; {name} dtype {dt}",
                    )
                    break
        return out

    def grad_work(self, case: Case, ret: GradReturned) -> str:
        """The precision the gradients are held to: the input's, or a lower one they were returned in (a ``dtype``
        bug, reported as such: the values are compared under that dtype's rule)."""
        work = self.work_dtype(case.dtype)
        rank = {"float64": 3, "float32": 2, "float16": 1, "bfloat16": 0}
        for dt in ret.dtypes.values():
            if dt in rank and rank[dt] < rank[work]:
                work = dt
        return work

    def expected(self, case: Case, *, causal: str | None = "same", work: str | None = None) -> Any:
        """The golden gradients and each one's bound under FlashAttention's gradient rule."""
        c = case.causal if causal == "same" else causal
        g = cast(GradCase, case if c == case.causal else replace(case, causal=c))
        golden = golden_grads(g, self.gqa_map)
        work = work or self.work_dtype(g.dtype)
        naive = self.case_grads(g, dtype=work)  # the right backward, every step rounded to the work dtype
        bounds = {n: grad_bound(work, want, naive[n]) for n in _GRADS if (want := golden.get(n)) is not None}
        return golden, bounds

    def case_grads(self, case: GradCase, variant: Variant | None = None, dtype: str = "float64") -> dict[str, Any]:
        """The gradients of ``case`` under ``variant`` (None: the right backward), every step rounded to ``dtype``."""
        return attention_grads(
            case.q,
            case.k,
            case.v,
            case.d_out,
            case.mask,
            causal=case.causal,
            scale=case.scale,
            bias=case.bias,
            keep=case.keep,
            dropout_p=case.dropout_p,
            mapping=self.gqa_map,
            variant=variant,
            dtype=dtype,
        )

    # -- comparisons ------------------------------------------------------------------------------------------
    def compare_grads(self, out: Outcome, *, diagnose: bool = True) -> bool:
        """Compare one outcome's gradients (and, with a forward, its output) with the golden; diagnose a mismatch."""
        if not out.ok or not isinstance(out.returned, GradReturned):
            return False
        case = cast(GradCase, out.case)
        key = self.case_key or self.key(case)
        ret = out.returned
        if out.mutated:  # seen in this case too: the gradients were computed from the written-over inputs
            self.bug(
                "mutates-input",
                f"your function writes into its input{'s' if len(out.mutated) > 1 else ''} {', '.join(out.mutated)}",
                f"case {case.label}: {case.shapes()}; {', '.join(out.mutated)} differ after the call",
                case=key,
            )
        if self.other_alignment(case, ret):
            return True
        if self.has_forward and ret.out is not None and case.keep is None:
            gout = golden_output(
                case.q, case.k, case.v, case.mask, scale=case.scale, causal=case.causal, gqa=self.gqa_map
            )
            if case.bias is None and ret.out.shape == gout.shape:
                # the forward's rule, with room: this only tells a wrong forward from a wrong backward
                work = self.work_dtype(case.dtype)
                allowed = _allowed(case)
                naive = naive_output(case.q, case.k, case.v, allowed, dtype=work, scale=case.scale, gqa=self.gqa_map)
                tol = 10 * bound(work, gout, naive)
                rows = allowed.any(axis=-1)
                if not compare(ret.out, gout, tol, rows).ok:
                    self.forward_wrong.add(key)
                    if not self.forward_checked:  # nobody else looks at this forward: say it is wrong
                        self.bug(
                            "reference-mismatch",
                            "the forward's output differs from the float64 reference",
                            f"case {case.label}: {case.shapes()}",
                        )
        golden, bounds = self.expected(case, work=self.grad_work(case, ret))
        bad = self._mismatch(ret.grads, golden, bounds, case)
        if not bad:
            return True
        if self.kind != "autograd" or key not in self.forward_wrong:
            if diagnose and self.diagnose_grads(case, ret.grads, bounds, bad, self.matched):
                return False
            if diagnose and self.diagnosed < DIAGNOSED_CASES:
                self.diagnosed += 1
                if self.diagnose_grads(case, ret.grads, bounds, bad):
                    return False
        self.bug("grad-mismatch", "your function's gradients differ from the float64 golden", self._evidence(case, bad))
        return False

    def other_alignment(self, case: GradCase, ret: GradReturned) -> bool:
        """A causal case with n_q != n_k whose gradients (and forward output) are all those of the other alignment,
        when none is declared: a note, as the forward's (the function is causal the other way, consistently)."""
        n_q, n_k = case.q.shape[-2], case.k.shape[-2]
        told = self.causal_mode == "mask" or self.spec.causal_value == "align"  # the alignment was passed in
        if case.causal is None or n_q == n_k or self.spec.causal_align is not None or told:
            return False
        other = "top_left" if case.causal == "bottom_right" else "bottom_right"
        alt = replace(case, causal=other)
        golden, bounds = self.expected(alt, work=self.grad_work(case, ret))
        if self._mismatch(ret.grads, golden, bounds, alt):
            return False
        if self.has_forward and ret.out is not None:
            gout = golden_output(case.q, case.k, case.v, case.mask, scale=case.scale, causal=other, gqa=self.gqa_map)
            if ret.out.shape != gout.shape or not compare(ret.out, gout, bounds["dq"] * 10 + 1e-6).ok:
                return False
        mine, _ = self.expected(case)
        if not self._mismatch(ret.grads, mine, bounds, case):
            return False  # both alignments agree here: nothing to tell
        names = {"top_left": "top-left (PyTorch is_causal)", "bottom_right": "bottom-right (FlashAttention)"}
        self.note(
            "causal-alignment",
            f"the backward's causal mask is aligned {names[other]} (no causal_align declared; causal=True is "
            f"compared as {names[case.causal]} otherwise)",
            f"case {case.label}: n_q={n_q}, n_k={n_k}; the gradients match causal='{other}'",
            "declare causal_align to hold the function to one alignment",
        )
        return True

    def _mismatch(
        self, grads: dict[str, np.ndarray], golden: dict[str, Any], bounds: dict[str, float], case: GradCase
    ) -> dict[str, Any]:
        """The gradients that break their bound: name -> Comparison (shape mismatches have max_error inf)."""
        rows = _allowed(case).any(axis=-1)
        bad: dict[str, Any] = {}
        for name in ("dq", "dk", "dv", "dbias"):
            if golden.get(name) is None or name not in grads:
                continue
            a = grads[name]
            e = golden[name]
            if a.shape != e.shape and a.size == e.size and name == "dbias":
                a = a.reshape(e.shape)
            if name == "dq":
                c = compare(a, e, bounds[name], rows)
            else:
                c = compare(a, e, bounds[name])
            if not c.ok:
                bad[name] = c
        return bad

    def _evidence(self, case: GradCase, bad: dict[str, Any]) -> str:
        ev = f"case {case.label}: {case.shapes()}"
        if case.mask is not None:
            ev += ", with a mask"
        if case.causal is not None:
            ev += f", causal ({case.causal.replace('_', '-')})"
        if case.keep is not None:
            ev += f", dropout p={case.dropout_p:g}"
        parts = []
        for name, c in bad.items():
            if c.max_error == math.inf:
                parts.append(f"{name} has the wrong shape")
            elif c.nonfinite:
                parts.append(f"{name} has {c.nonfinite} non-finite value(s)")
            else:
                parts.append(f"max |{name} - golden| = {c.max_error:.3g} at {c.where} (tolerance {c.bound:.2g})")
        return ev + "; " + "; ".join(parts)

    def diagnose_grads(
        self,
        case: GradCase,
        grads: dict[str, np.ndarray],
        bounds: dict[str, float],
        bad: dict[str, Any],
        only: list[tuple[str, str, Any]] | None = None,
    ) -> bool:
        """Recompute the gradients under each named mistake (``only`` those) and report the first that explains
        every gradient."""
        if any(c.max_error == math.inf for c in bad.values()):
            return False
        n_q, n_k = case.q.shape[-2], case.k.shape[-2]
        allowed = _allowed(case)
        cands = (
            only
            if only is not None
            else hypotheses(
                n_q,
                n_k,
                h=case.q.shape[-3],
                h_kv=case.k.shape[-3],
                masked=not bool(allowed.all()),
                causal=case.causal,
                dropout=case.keep is not None,
                flash=self.kind == "flash",
                explicit_scale=case.scale is not None,
            )
        )
        rows = allowed.any(axis=-1)
        refit = only is None or any(v.lse == "shifted" for _, _, v in only)
        cands = [c for c in cands if c[2].lse != "shifted"]  # a fitted lse belongs to the case it was fitted on
        if refit and grads.get("dq") is not None:  # a wrong lse of any kind: fitted from dq, row by row
            right = self.case_grads(case)
            cands = [*cands, *fitted_lse(right["dq"], grads["dq"], rows)]
        worst = max(c.max_error for c in bad.values() if c.max_error < math.inf) if bad else 0.0
        for code, text, var in cands:
            if var.transposed and n_q != n_k:
                continue
            if var.p_causal is not None and case.causal is None:
                continue
            alt = self.case_grads(case, var)
            ok = True
            err = 0.0
            naive_alt = None
            work = self.work_dtype(case.dtype)
            for name, a in grads.items():
                e = alt.get(name)
                if e is None or name not in bounds:
                    continue
                if a.shape != e.shape:
                    ok = False
                    break
                tol = bounds[name]
                if work != "float64":  # the mistake made in the same precision: its own rounding error
                    if naive_alt is None:
                        naive_alt = self.case_grads(case, var, work)
                    tol = max(tol, grad_bound(work, e, naive_alt[name]))
                c = compare(a, e, tol, rows if name == "dq" else None)
                if not c.ok:
                    ok = False
                    break
                err = max(err, c.max_error)
            if ok and (err * 10 <= worst or any(c.nonfinite for c in bad.values())):
                if (code, text, var) not in self.matched:
                    self.matched.append((code, text, var))
                if code == "grad-lse" and self.kind != "flash" and not self.has_forward:
                    text += " (the backward recomputes its own lse)"
                self.bug(
                    code,
                    text,
                    self._evidence(case, bad) + f"; the gradients match that explanation to {err:.2g}",
                )
                return True
        return False

    # -- preflight and probes ---------------------------------------------------------------------------------
    def p_grad_reference(self) -> None:
        """The ``grad-reference`` probe: gradients on the grid in every dtype, mismatches diagnosed (see the
        module's table)."""
        for lbl, g, req, ex in _COMBOS:
            if all(r in self.caps for r in req):
                self.grid.append(self.call(self.make(g, self.primary, label=lbl, **ex)))
        if "bias" not in self.unsupported:
            g0 = Geom(2, 2, 6, 9, 8, 8)
            base = self.make(g0, self.primary, label="bias", mask=("mask" in self.caps))
            self.grid.append(self.call(self.grad_case(base, bias=True)))
        if "causal-cross" in self.caps and (self.causal_mode == "mask" or self.spec.causal_value == "align"):
            # the function can be told either alignment: both are checked
            for n_q, n_k in ((4, 9), (9, 5)):
                base = self.make(Geom(2, 2, n_q, n_k, 8, 8), self.primary, label=f"causal both alignments {n_q}x{n_k}")
                for align in ("top_left", "bottom_right"):
                    if align == "bottom_right" and n_q > n_k:
                        continue  # rows with no key: the masked-rows probe's business
                    case = replace(base, causal=align, label=f"causal {align.replace('_', '-')} {n_q}x{n_k}")
                    self.grid.append(self.call(case))
        for dtype in self.dtypes[1:]:
            if "causal" in self.caps:
                self.grid.append(
                    self.call(self.make(Geom(2, 2, 6, 6, 8, 8), dtype, label=f"causal {dtype}", causal=True))
                )
            if "mask" in self.caps:
                self.grid.append(self.call(self.make(Geom(2, 3, 9, 9, 4, 4), dtype, label=f"mask {dtype}", mask=True)))
            if "gqa" in self.caps:
                self.grid.append(self.call(self.make(Geom(1, 4, 6, 6, 8, 8, h_kv=2), dtype, label=f"gqa {dtype}")))
        results: list[tuple[Any, bool, str | None]] = []
        for out in self.grid:
            self.case_key = self.key(out.case)
            if out.error is not None:
                self.crash(out)
                continue
            results.append((out.case, self.compare_grads(out), self.case_key))
        # a feature whose cases alone fail, with nothing named: the backward's handling of that feature is wrong
        for code, has, text in (
            ("grad-causal", lambda c: c.causal is not None, "the backward's causal masking"),
            ("grad-gqa-sum", lambda c: c.gqa, "the backward's GQA (K/V heads shared by query groups)"),
        ):
            self.eliminate(results, code, has, text)

    def eliminate(self, results: list[tuple[Any, bool, str | None]], code: str, has: Any, text: str) -> None:
        """Name ``code`` in the cases that have a feature (``has``) and fail with only ``grad-mismatch``, when
        every case without the feature passed: the difference is the feature."""
        seen: dict[str | None, set[str]] = {}
        for o in self.obs:
            seen.setdefault(o.case, set()).add(o.finding.code)
        without = [ok for c, ok, _ in results if not has(c)]
        failing = [(c, key) for c, ok, key in results if has(c) and not ok and seen.get(key) == {"grad-mismatch"}]
        if len(without) < 3 or not all(without) or not failing:
            return
        for c, key in failing:
            self.bug(
                code,
                f"{text} is wrong: every case without it matches the golden, the cases with it do not (no single "
                "named mistake explains them)",
                f"case {c.label}: {c.shapes()}; {len(without)} cases without it match",
                case=key,
            )

    def p_grad_masked_keys(self) -> None:
        """The ``grad-masked-keys`` probe: a key masked for every query gets dK = dV = 0 and moves no other gradient."""
        if "mask" not in self.caps:
            raise ProbeSkip("needs a mask argument")
        g = Geom(2, 2, 6, 8, 8, 8)
        base = self.make(g, self.primary, label="masked keys", mask=True)
        # the last key is blocked for every query (random_mask's promise); give it huge K and V
        k, v = base.k.copy(), base.v.copy()
        k[..., -1, :] = round_to(np.full(k.shape[-1], 30.0), base.dtype)
        v[..., -1, :] = round_to(np.full(v.shape[-1], 1e3), base.dtype)
        assert base.mask is not None  # mask=True
        m = base.mask.copy()
        m[..., -1] = False
        case = self.grad_case(replace(base, k=k, v=v, mask=m))
        self.case_key = self.key(case)
        out = self.call(case)
        if not out.ok:
            self.crash(out)
            return
        ret = cast(GradReturned, out.returned)
        leak = []
        for name in ("dk", "dv"):
            x = ret.grads.get(name)
            if x is not None and x.ndim >= 2 and x.shape[-2] == g.n_k:
                col = x[..., -1, :]
                if not np.all(col == 0):
                    leak.append(f"max |{name}| of the masked key = {float(np.nanmax(np.abs(col))):.3g}")
        if leak:
            self.bug(
                "grad-masked-leak",
                "a key that every query has masked gets gradient in dK/dV (it must be exactly 0)",
                f"case {case.label}: {case.shapes()}, the last key masked for every query, its K = 30 and V = 1e3; "
                + "; ".join(leak),
            )
        ok = self.compare_grads(out)
        # the masked key's K and V changed: no other gradient may move
        k2, v2 = case.k.copy(), case.v.copy()
        k2[..., -1, :] = -k2[..., -1, :]
        v2[..., -1, :] = round_to(np.full(v.shape[-1], -7.0), base.dtype)
        moved = self.call(replace(case, k=k2, v=v2))
        unexplained = set(self.findings) <= {"grad-mismatch"}  # a named bug (a wrong lse, delta) moves them too
        if not ok and moved.ok and unexplained:  # wrong elsewhere: a move is a leak if the same call repeats exactly
            again = self.call(case)
            ok = (
                again.ok
                and isinstance(again.returned, GradReturned)
                and all(_same(ret.grads.get(n), again.returned.grads.get(n)) for n in ("dq", "dk", "dv"))
            )
        if moved.ok and ok and isinstance(moved.returned, GradReturned):
            _, bounds = self.expected(case)
            for name in ("dq", "dk", "dv"):
                a, b = ret.grads.get(name), moved.returned.grads.get(name)
                if a is None or b is None or a.shape != b.shape:
                    continue
                sel = (slice(None),) * (a.ndim - 2) + (slice(0, -1),) if name != "dq" else (Ellipsis,)
                with np.errstate(invalid="ignore"):
                    same_nan = np.isnan(a[sel]) & np.isnan(b[sel])  # NaN in both calls is no move
                    diff = np.where(same_nan, 0.0, np.abs(a[sel] - b[sel]))
                if np.isnan(diff).any() or float(np.nanmax(diff)) > bounds[name]:
                    self.bug(
                        "grad-masked-leak",
                        f"changing a masked key's K and V changes {name} of the others",
                        f"case {case.label}: {case.shapes()}; max change {float(np.nanmax(diff)):.3g} "
                        f"(tolerance {bounds[name]:.2g})",
                    )
                    break

    def p_grad_masked_rows(self) -> None:
        """Rows with no allowed key: finite gradients; their dQ is 0, and their d_out moves dK not at all and dV
        not at all (zeros policy) or by d_out / n_k on every key (uniform policy). Measured as the difference
        between two calls whose d_out differs only on those rows, so that a bug elsewhere does not show here."""
        if "mask" not in self.caps:
            raise ProbeSkip("needs a mask argument")
        g = Geom(2, 2, 5, 6, 8, 8)
        base = self.make(g, self.primary, label="masked rows", mask=True)
        assert base.mask is not None  # mask=True
        m = base.mask.copy()
        if self.mask_form in LENGTH_FORMS:  # lengths or key padding: only a whole sequence can have no key
            m[1] = False
            where = "batch element 1 has no valid key (length 0)"
        else:
            if self.mask_form != "batch":  # a per-batch mask is the same for every head
                m[0, 0, 1, :] = False
            m[1, :, -1, :] = False
            where = "query 1 of batch 0, head 0 and the last query of batch 1 have no allowed key"
            if self.mask_form == "batch":
                where = "the last query of batch 1 has no allowed key"
        case = self.grad_case(replace(base, mask=m))
        self.case_key = self.key(case)
        out = self.call(case)
        policy = self.spec.masked_rows
        if out.error is not None and not out.error.died:
            if policy in ("any", "raise"):
                self.note(
                    "masked-row-raise",
                    "the backward raises on fully masked rows (the forward's raise policy)",
                    f"case {case.label}: {out.error_text.splitlines()[0][:200]}",
                )
                return
            self.crash(out)
            return
        if not out.ok:
            return
        ret = cast(GradReturned, out.returned)
        nonfinite = [n for n, x in ret.grads.items() if not np.all(np.isfinite(x))]
        if nonfinite:
            if policy != "nan":
                self.bug(
                    "grad-masked-row",
                    f"fully masked rows give NaN/inf gradients ({', '.join(nonfinite)})",
                    f"case {case.label}: {case.shapes()}; {where}",
                )
            return
        rows = ~_allowed(case).any(axis=-1)  # [B, h, n_q]
        d2 = np.where(rows[..., None], 0.0, case.d_out)
        again = self.call(replace(case, d_out=d2))
        if not again.ok or not isinstance(again.returned, GradReturned):
            return
        _, bounds = self.expected(case)
        a, b = ret.grads, again.returned.grads
        problems = []
        dq = a.get("dq")
        if dq is not None and dq.shape == case.q.shape:
            worst = float(np.max(np.abs(dq[rows]), initial=0.0))
            if worst > bounds["dq"]:
                problems.append(f"dQ of the masked rows is not 0 (max |dq| = {worst:.3g})")
        add = np.einsum("...q,...qd->...d", rows.astype(float), case.d_out)[..., None, :] / g.n_k
        add = reduce_kv(np.broadcast_to(add, (*add.shape[:-2], g.n_k, add.shape[-1])), case.k.shape[-3], self.gqa_map)
        for name in ("dk", "dv"):
            x, y = a.get(name), b.get(name)
            if x is None or y is None or x.shape != y.shape:
                continue
            diff = x - y
            tol = bounds[name]
            zero = float(np.max(np.abs(diff))) <= tol
            uniform = name == "dv" and diff.shape == add.shape and float(np.max(np.abs(diff - add))) <= tol
            fine = {"zeros": zero, "uniform": uniform or (name == "dk" and zero)}.get(policy, zero or uniform)
            if not fine:
                problems.append(
                    f"the masked rows' d_out moves {name} by up to {float(np.max(np.abs(diff))):.3g} (tolerance "
                    f"{tol:.2g})"
                )
        if problems and self.spec.mask_convention == "additive" and self.policy_additive(case, d2, rows, a, b, bounds):
            return
        if problems and self._rows_leak(case, replace(case, d_out=d2), a, b, bounds):
            self.bug(
                "grad-masked-leak",
                "the backward ignores the mask: the fully masked rows get the gradients of the unmasked scores",
                f"case {case.label}: {case.shapes()}; {where}; " + "; ".join(problems),
            )
            return
        if problems:
            self.bug(
                "grad-masked-row",
                "the gradients of fully masked rows do not follow the forward's policy (zeros or the uniform average)"
                if policy not in ("zeros", "uniform")
                else f"the gradients of fully masked rows do not follow the declared policy masked_rows={policy!r}",
                f"case {case.label}: {case.shapes()}; {where}; " + "; ".join(problems),
            )

    def policy_additive(
        self,
        case: GradCase,
        d2: np.ndarray,
        rows: np.ndarray,
        a: dict[str, np.ndarray],
        b: dict[str, np.ndarray],
        bounds: dict[str, float],
    ) -> bool:
        """An additive ``finfo.min`` mask: a fully masked row is ``softmax(s + c)``, uniform in floating point, and
        autograd of such a forward takes the softmax Jacobian at those uniform weights, so the row's d_out reaches
        dQ, dK and dV. That is the policy of additive masks (a note), not a bug of the backward."""
        assert case.mask is not None  # an additive mask convention: the case has a mask
        m = np.array(np.broadcast_to(case.mask, (*rows.shape, case.k.shape[-2])))
        m[rows] = True
        # those rows' weights are uniform (s + c rounds to c) and the Jacobian is taken there: a bias of -s on them
        sc = 1 / math.sqrt(case.q.shape[-1]) if case.scale is None else case.scale
        logits = case.q @ np.swapaxes(expand_kv(case.q, case.k, self.gqa_map), -1, -2) * sc
        c1 = replace(case, mask=m, bias=np.where(rows[..., None], -logits, 0.0))
        g1, g2 = golden_grads(c1, self.gqa_map), golden_grads(replace(c1, d_out=d2), self.gqa_map)
        for name in ("dq", "dk", "dv"):
            x, y, want1, want2 = a.get(name), b.get(name), g1[name], g2[name]
            assert want1 is not None and want2 is not None  # golden_grads always computes dq, dk and dv
            if x is None or y is None or x.shape != want1.shape:
                continue
            if float(np.max(np.abs((x - y) - (want1 - want2)))) > bounds[name]:
                return False
        self.note(
            "masked-row-additive",
            "fully masked rows pass gradient: an additive finfo.min mask makes them uniform (s + c rounds to c), "
            "and the softmax Jacobian at those uniform weights sends their d_out to dQ, dK and dV",
            f"case {case.label}: {case.shapes()}; their d_out moves dQ, dK and dV as for unmasked rows",
            "give fully masked rows zero gradient (a boolean mask, or zero them explicitly) if masked keys must "
            "not learn from them",
        )
        return True

    def _rows_leak(
        self, c1: GradCase, c2: GradCase, a: dict[str, np.ndarray], b: dict[str, np.ndarray], bounds: dict[str, float]
    ) -> bool:
        """Whether the difference between two calls is that of a backward that recomputes P without the mask."""
        for var in (Variant(p_mask="softmax", delta="self"), Variant(p_mask="none"), Variant(p_mask="softmax")):
            g1, g2 = (
                attention_grads(c.q, c.k, c.v, c.d_out, _allowed(c), scale=c.scale, mapping=self.gqa_map, variant=var)
                for c in (c1, c2)
            )
            fits, shows = True, False
            for name in ("dq", "dk", "dv"):
                x, y = a.get(name), b.get(name)
                if x is None or y is None or x.shape != g1[name].shape:
                    continue
                if float(np.max(np.abs((x - y) - (g1[name] - g2[name])))) > bounds[name]:
                    fits = False
                    break
                shows = shows or float(np.max(np.abs(g1[name] - g2[name]))) > bounds[name]
            if fits and shows:
                return True
        return False

    def p_grad_batch(self) -> None:
        """The ``grad-batch`` probe: changing one batch element or head moves no other one's gradients."""
        g = Geom(2, 2, 5, 7, 4, 4)
        base = self.grad_case(self.make(g, self.primary, label="batch", mask=("mask" in self.caps)))
        self.case_key = self.key(base)
        out = self.call(base)
        if not out.ok:
            self.crash(out)
            return
        self.compare_grads(out)
        ret = cast(GradReturned, out.returned)  # an ok call of the gradient battery returned its gradients
        _, bounds = self.expected(base)
        for axis, what, changed in ((0, "batch element", 1), (0, "batch element", 0), (1, "head", 1), (1, "head", 0)):
            sel = (slice(changed, changed + 1),) if axis == 0 else (slice(None), slice(changed, changed + 1))
            q, k, v, do = (x.copy() for x in (base.q, base.k, base.v, base.d_out))
            for x in (q, k, v, do):
                x[sel] = round_to(self.rng.normal(0, 1, x[sel].shape), base.dtype)
            moved = self.call(replace(base, q=q, k=k, v=v, d_out=do))
            if not moved.ok or not isinstance(moved.returned, GradReturned):
                continue
            other = 1 - changed
            keep0 = (slice(other, other + 1),) if axis == 0 else (slice(None), slice(other, other + 1))
            for name in ("dq", "dk", "dv"):
                a, b = ret.grads.get(name), moved.returned.grads.get(name)
                if a is None or b is None or a.shape != b.shape or a.ndim < 2:  # no batch and head axes to pick
                    continue
                a, b = a[keep0], b[keep0]
                finite = np.isfinite(a) & np.isfinite(b)
                flipped = bool((np.isfinite(a) != np.isfinite(b)).any())  # a value became (or stopped being) NaN
                diff = np.where(finite, np.abs(np.where(finite, a, 0.0) - np.where(finite, b, 0.0)), 0.0)
                largest = float(diff.max(initial=0.0))
                if flipped or largest > bounds[name]:  # NaN in both runs alike is the reference probe's finding
                    moved_by = "non-finite values appeared or vanished" if flipped else f"moved by {largest:.3g}"
                    self.bug(
                        "grad-batch-leak",
                        f"changing one {what} changes the gradients of another ({name})",
                        f"case {base.label}: {base.shapes()}; {what} {changed} changed, {name} of {what} {other} "
                        f"{moved_by} (tolerance {bounds[name]:.2g})",
                    )
                    return

    def p_grad_dropout(self) -> None:
        """The ``grad-dropout`` probe: with a given dropout mask, the gradients match the reference's through it."""
        if "dropout" in self.unsupported:
            raise ProbeSkip(self.unsupported["dropout"])
        p = 0.25
        cases: tuple[tuple[str, Geom, _Flags], ...] = (
            ("dropout", Geom(2, 2, 6, 6, 8, 8), {"mask": "mask" in self.caps}),
            ("dropout+causal", Geom(1, 2, 7, 7, 4, 6), {"causal": "causal" in self.caps}),
        )
        for lbl, g, ex in cases:
            base = self.make(g, self.primary, label=lbl, **ex)
            keep = self.rng.random((*base.q.shape[:-2], base.q.shape[-2], base.k.shape[-2])) >= p
            case = self.grad_case(base, keep=keep, dropout_p=p)
            self.case_key = self.key(case)
            out = self.call(case)
            if not out.ok:
                self.crash(out)
                continue
            ok = self.compare_grads(out)
            # right without dropout (the reference grid passed), wrong with the keep mask: the dropout differs
            ref = next((r for r in self.probe_results if r.name == "grad-reference"), None)
            codes = {o.finding.code for o in self.obs if o.case == self.case_key}
            if not ok and ref is not None and ref.status == "passed" and codes == {"grad-mismatch"}:
                self.bug(
                    "grad-dropout",
                    "the gradients are right without dropout and wrong with the keep mask: the backward's dropout "
                    "differs from the forward's (another mask, or another scaling)",
                    f"case {case.label}: {case.shapes()}, dropout p={p:g}",
                )

    # the forward battery's run loop (Battery.run) over the gradient probes
    preflight_name = "grad-preflight"
    probe_names = GRAD_PROBES

    def run_probe(self, name: str) -> None:
        getattr(self, "p_" + name.replace("-", "_"))()

    def _completeness(self) -> None:
        results = {p.name: p for p in self.probe_results}
        for name in CORE_GRAD_PROBES:
            if name != "grad-reference" and "mask" in self.unsupported:
                continue
            p = results.get(name)
            if p is None:
                self.incomplete.append(Unsupported(name, "not selected (probes=...)"))
            elif p.status in ("skipped", "not run"):
                self.incomplete.append(Unsupported(name, p.detail or "not run"))


# ----------------------------------------------------------------------------------------------------------------
# entry points


def _same(a: Any, b: Any) -> bool:
    """Whether two gradients of two identical calls are the same (both absent, or equal with NaN equal to NaN)."""
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


def _grad_spec(spec: Spec) -> Spec:
    return replace(spec, ranks=(4,), mask_form="full" if spec.mask_form in ("varlen", "kv_cache") else spec.mask_form)


@dataclass(frozen=True)
class GradTarget:
    """What a worker process needs to build the :class:`GradAdapter` (sent in place of the forward's
    :class:`~attnlab.checker.Spec`; the worker calls :meth:`make_adapter` on the imported function)."""

    spec: Spec
    kind: str
    forward: str | None = None
    lse_units: str = "nats"
    extra_unsupported: tuple[str, ...] = ()

    def make_adapter(self, fn: Any) -> GradAdapter:
        from .target import load_target

        fwd = None if self.forward is None else load_target(self.forward)
        return GradAdapter(
            fn,
            self.spec,
            kind=self.kind,
            forward=fwd,
            lse_units=self.lse_units,
            extra_unsupported=self.extra_unsupported,
        )


def _describe(kind: str, backend: Any, lse_units: str, with_forward: bool) -> str:
    """The call as :meth:`GradAdapter.describe` words it, from what a worker reported."""
    r = backend.resolved
    parts = [a for a in (r.mask_arg, r.causal_arg, r.scale_arg) if a]
    if "dropout" not in backend.structural:
        parts += ["dropout_mask", "dropout_p"]
    if "bias" not in backend.structural:
        parts.append("bias")
    extra = "".join(", " + p + "=" for p in parts)
    if kind == "flash":
        fwd = " with its forward fwd(q, k, v) -> (out, lse)" if with_forward else ""
        return f"bwd(q, k, v, out, lse [{lse_units}], d_out{extra}) -> (dq, dk, dv){fwd}"
    if kind == "plain":
        return f"bwd(q, k, v, d_out{extra}) -> (dq, dk, dv)"
    how = "jax.vjp" if backend.framework == "jax" else "torch autograd"
    return f"fn(q, k, v{extra}), gradients by {how}"


def run_gradients(
    fn: Any,
    spec: Spec,
    *,
    kind: str = "auto",
    forward: Any = None,
    lse_units: str = "nats",
    timeout: float = 10.0,
    seed: int = 0,
    probes: Iterable[str] | None = None,
    name: str | None = None,
    align: str | None = None,
    extra_unsupported: Iterable[str] = (),
    forward_checked: bool | str = False,
    import_timeout: float = 60.0,
) -> Report:
    """Run the gradient battery on ``fn`` and return its :class:`~attnlab.checker.Report`.

    ``fn`` (and ``forward``) may be target strings ``"file.py:NAME"``: the function is then imported and called in
    a worker process (:mod:`attnlab.checker.isolation`), killed on a timeout, as the forward's; a callable runs in
    this process. ``align``: the causal alignment of ``causal=True`` when n_q != n_k and none is declared (default
    top-left); ``extra_unsupported``: gradient-only capabilities declared unsupported (``"dropout"``, ``"bias"``);
    ``forward_checked``: the forward battery ran on the same function (a wrong forward output is its finding, and
    explains the gradient findings of that case: a code, the forward's first finding, names it); otherwise a wrong
    forward output is a ``reference-mismatch``.
    """
    from .isolation import WorkerBackend, available
    from .target import TargetError

    selected = tuple(GRAD_PROBES if probes is None else probes)
    for p in selected:
        if p not in GRAD_PROBES:
            raise UsageError(f"probes: unknown gradient probe {p!r}; expected some of {', '.join(GRAD_PROBES)}")
    if kind not in _ADAPTER_KINDS:
        raise UsageError(f"kind: expected one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    t0 = time.perf_counter()
    spec = _grad_spec(spec)
    isolated = isinstance(fn, str) and available() and (forward is None or isinstance(forward, str))
    if not isolated:
        fn, forward = _load(fn), (None if forward is None else _load(forward))
    extra = tuple(extra_unsupported)

    def run(s: Spec) -> tuple[Any, GradBattery | None, str, bool]:
        if isolated:
            try:
                backend: Any = WorkerBackend(
                    fn, GradTarget(s, kind, forward, lse_units, extra), import_timeout=import_timeout
                )
            except TargetError as err:
                raise UsageError(str(err)) from None
            if backend.import_failure is not None:
                backend.close()
                return backend, None, kind, forward is not None
            k, _, f = backend.resolved.mode.removeprefix("backward ").partition("+")
            with_fwd = bool(f)
        else:
            adapter = GradAdapter(fn, s, kind=kind, forward=forward, lse_units=lse_units, extra_unsupported=extra)
            backend = InProcessBackend(adapter)
            k, with_fwd = adapter.kind, adapter.forward is not None
        try:
            if not [d for d in DTYPES if d not in backend.structural]:
                why = "; ".join(f"{d}: {backend.structural[d]}" for d in DTYPES)
                raise UsageError(f"dtypes: no dtype left to try ({why}); nothing could be tested")
            battery = GradBattery(
                backend,
                s,
                timeout=timeout,
                seed=seed,
                probes=selected,
                lse_units=lse_units,
                kind=k,
                with_forward=with_fwd,
                align=align,
                forward_checked=forward_checked,
            )
            battery.run()
        finally:
            backend.close()
        return backend, battery, k, with_fwd

    backend, battery, k, with_fwd = run(spec)
    label = name or (fn if isinstance(fn, str) else _label(fn))
    if battery is None:  # the module did not import: a crash (or timeout) finding, nothing run
        fail = backend.import_failure
        if fail.timed_out:
            code, message = "timeout", f"importing the module did not finish within {import_timeout:g} s"
        else:
            code, message = "crash", f"importing the module failed: {fail.error.text.splitlines()[0][:300]}"
        finding = Finding(code, message, f"import of {label}", GRAD_FIXES[code], "import")
        return Report(
            target=label,
            framework=spec.framework,
            signature="(not imported)",
            findings=(finding,),
            probes=(ProbeResult("import", "failed", 0, fail.seconds, "", (code,)),),
            incomplete=tuple(Unsupported(p, "not run: the module did not import") for p in CORE_GRAD_PROBES),
            seconds=time.perf_counter() - t0,
            spec={**spec.as_dict(), "backward": kind, "lse_units": lse_units},
            command="check --backward",
            isolation=backend.description,
        )
    detected = backend.resolved.detected
    if spec.framework == "auto" and _failed_everything(battery):
        # the framework was guessed from the module (which may import torch for other functions): try the others,
        # as the forward checker does
        for other in ("numpy", "torch", "jax"):
            loaded = backend.loaded if isolated else loaded_frameworks()  # now: the calls may have imported it
            if other == backend.framework or (other != "numpy" and other not in loaded):
                continue
            try:
                b2, bat2, k2, f2 = run(replace(spec, framework=other))
            except UsageError:
                continue
            if bat2 is not None and not _failed_everything(bat2):
                detected = (
                    f"{other}: detected {detected}, but every call failed in {backend.framework}; in {other} the "
                    "calls ran"
                )
                backend, battery, k, with_fwd = b2, bat2, k2, f2
                break
    return battery.report(
        label,
        backend,
        t0,
        detected,
        signature=_describe(k, backend, lse_units, with_fwd),
        spec={**spec.as_dict(), "backward": k, "lse_units": lse_units},
        command="check --backward",
    )


def _failed_everything(battery: GradBattery) -> bool:
    """No dtype worked and the calls raised (not clean refusals): the framework may be the wrong guess."""
    return not battery.dtypes and any(o.error is not None and not o.error.died for o in battery.runner.outcomes)


def _label(fn: Any) -> str:
    mod = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{mod}:{qual}" if mod else str(qual)


def load_callable(target: Any) -> Any:
    """``target`` itself, or the callable a target string ``"file.py:NAME"`` names (imported in this process)."""
    return _load(target)


def _load(target: Any) -> Any:
    if not isinstance(target, str):
        return target
    from .target import TargetError, load_target

    try:
        return load_target(target)
    except TargetError as err:
        raise UsageError(str(err)) from None


def check_backward(
    bwd: Callable[..., Any] | str,
    forward: Callable[..., Any] | str | None = None,
    *,
    lse_units: str = "nats",
    kind: str = "auto",
    timeout: float = 10.0,
    seed: int = 0,
    probes: Iterable[str] | None = None,
    name: str | None = None,
    **options: Any,
) -> Report:
    """Check a hand-written attention backward alone and return a :class:`~attnlab.checker.Report`.

    Args:
        bwd: ``bwd(q, k, v, d_out, mask=None, scale=None) -> (dq, dk, dv)`` (plain) or FlashAttention-2's
            ``bwd(q, k, v, out, lse, d_out, ...) -> (dq, dk, dv)`` (flash), detected from the parameter names
            (``kind=`` to say which); NumPy, PyTorch or JAX; or a target string ``"file.py:NAME"`` (imported in
            this process). Optional keywords it may take: ``mask=``, ``scale=``, ``causal=``, ``dropout_mask=``
            with ``dropout_p=``, ``bias=`` (then it returns ``d_bias`` fourth).
        forward: a flash backward's forward ``fwd(q, k, v, ...) -> (out, lse)``; without it the golden ``out``
            and ``lse`` ``[B, h, n_q]`` are passed in.
        lse_units: ``"nats"`` or ``"log2"``: the units of the lse the backward takes.
        kind: ``"auto"``, ``"plain"``, ``"flash"`` or ``"autograd"`` (a forward, differentiated by its library).
        timeout, seed, probes, name: as :func:`attnlab.check` (``probes`` from :data:`GRAD_PROBES`).
        options: :func:`attnlab.check`'s options describing the function (layout, gqa, dtypes, mask_convention,
            causal_align, masked_rows, unsupported, ...).

    Raises:
        UsageError: an option has an invalid value, or the function cannot be called at all.
    """
    if lse_units not in LSE_UNITS:
        raise UsageError(f"lse_units: expected 'nats' or 'log2', got {lse_units!r}")
    label = name or (bwd if isinstance(bwd, str) else None)
    fn = bwd
    if not isinstance(fn, str) and not callable(fn):
        raise UsageError(f"bwd: expected a callable backward or a target string, got {type(fn).__name__}")
    fwd = forward
    if fwd is not None and not isinstance(fwd, str) and not callable(fwd):
        raise UsageError(
            f"forward: expected None, a callable forward fwd(q, k, v, ...) -> (out, lse) or a target string, got "
            f"{type(fwd).__name__} {fwd!r}"
        )
    if kind == "auto":  # a backward: FlashAttention-2's signature, or else the plain one (read where it is imported)
        kind = "backward"
    extra = [u for u in options.get("unsupported", ()) if u in GRAD_CAPABILITIES]
    spec = spec_from_options(timeout=timeout, seed=seed, **options)  # timeout and seed checked as check() does
    return run_gradients(
        fn,
        spec,
        kind=kind,
        forward=fwd,
        lse_units=lse_units,
        timeout=spec.timeout,
        seed=spec.seed,
        probes=probes,
        name=label,
        extra_unsupported=extra,
    )


def spec_from_options(
    *,
    gqa: bool | str = False,
    dtypes: Iterable[str] = DTYPES,
    unsupported: Iterable[str] = (),
    ranks: Iterable[int] = (4,),
    **options: Any,
) -> Spec:
    """A :class:`~attnlab.checker.Spec` from :func:`attnlab.check`'s keyword options."""
    unsup = frozenset(u for u in unsupported if u not in GRAD_CAPABILITIES)
    try:
        return Spec(
            gqa=bool(gqa),
            gqa_mapping=gqa if isinstance(gqa, str) else "interleave",
            dtypes=tuple(dtypes),
            unsupported=unsup,
            ranks=tuple(ranks),
            **options,
        )
    except TypeError as err:
        raise UsageError(f"options: {err}") from None


def with_backward(
    report: Report,
    fn: Any,
    backward: Any,
    spec: Spec,
    *,
    lse_units: str = "nats",
    timeout: float = 10.0,
    seed: int = 0,
    name: str | None = None,
    import_timeout: float = 60.0,
) -> Report:
    """The forward ``report`` of :func:`attnlab.check` extended by the gradient battery: ``backward=True``
    (autograd through ``fn``) or a backward callable / target string (checked with ``fn`` as its forward when it
    takes the forward's lse). Gradient findings in cases where the forward output is already wrong are explained
    by the forward's findings."""
    fwd = fn
    if any(p.name == "import" for p in report.probes):
        return report  # the forward's module did not import: nothing to differentiate
    if spec.framework == "auto" and report.framework in ("numpy", "torch", "jax"):
        spec = replace(spec, framework=report.framework)  # what the forward battery found the calls run in
    # the gradient battery, with the options both kinds of backward share
    battery = partial(
        run_gradients, spec=spec, lse_units=lse_units, timeout=timeout, seed=seed, import_timeout=import_timeout
    )
    if backward is True:
        if report.framework == "numpy":
            raise UsageError(
                "backward=True: a NumPy function has no gradient to check; pass its hand-written backward as "
                "backward=bwd (or check_backward(bwd))"
            )
        align = None
        for n in report.notes:  # the alignment the forward battery saw the function use
            if n.code == "causal-alignment":
                align = "bottom_right" if "bottom-right" in n.message else "top_left"
        g = battery(
            fwd, kind="autograd", name=name, align=align, forward_checked=report.codes[0] if report.codes else True
        )
    else:
        if not isinstance(backward, str) and not callable(backward):
            raise UsageError(f"backward: expected True or a backward callable, got {type(backward).__name__}")
        g = battery(backward, kind="backward", forward=fwd, name=None)
    return merge(report, g)


def merge(forward: Report, grads: Report) -> Report:
    """One report: the forward's findings and probes, then the gradient battery's."""
    have = {u.capability for u in forward.unsupported}
    return replace(
        forward,
        signature=f"{forward.signature}; backward: {grads.signature}",
        findings=forward.findings + grads.findings,
        notes=forward.notes + grads.notes,
        unsupported=forward.unsupported + tuple(u for u in grads.unsupported if u.capability not in have),
        probes=forward.probes + grads.probes,
        explained=forward.explained + grads.explained,
        explained_findings=forward.explained_findings + grads.explained_findings,
        incomplete=forward.incomplete + grads.incomplete,
        calls=forward.calls + grads.calls,
        seconds=forward.seconds + grads.seconds,
        spec={**forward.spec, "backward": grads.spec.get("backward"), "lse_units": grads.spec.get("lse_units")},
        command="check --backward",
        isolation=forward.isolation
        if forward.isolation == grads.isolation
        else f"{forward.isolation} (gradients: {grads.isolation})",
    )
