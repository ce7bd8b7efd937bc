"""The gradient oracle: what the checker needs to check anyone's attention backward pass (issue 14).

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

The gradient probes (``GRAD_PROBES``, functions in :mod:`attnlab.checker.probes`), run by the same session as the
forward's (:mod:`attnlab.checker.engine`) with the gradient strategy (:class:`attnlab.checker.gradients.Gradients`),
after the preflight finds the dtypes and capabilities:

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
>>> from attnlab.checker import check_backward
>>> check_backward(bwd, dtypes=("float64",)).codes
()
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from .. import masks as _masks
from ..core import attention_trace
from ..core.dropout import Dropout
from ..core.gradients import attention_backward
from .adapters import Adapter, Returned, Spec, UsageError, framework_dtype_name, round_to
from .callables import signature_of
from .fixes import FIXES
from .grad_hypotheses import reduce_kv
from .report import CORE_GRAD_PROBES, GRAD_PROBES, Report
from .runner import CallRequest, Case, loaded_frameworks
from .spec import GRAD_CAPABILITIES, listed
from .tolerance import bound, expand_kv

__all__ = [
    "BACKWARD_CODES",
    "CORE_GRAD_PROBES",
    "GRADS",
    "GRAD_CAPABILITIES",
    "GRAD_FIXES",
    "GRAD_PROBES",
    "KINDS",
    "LSE_UNITS",
    "GradAdapter",
    "GradCase",
    "GradReturned",
    "GradTarget",
    "describe_backward",
    "detect_kind",
    "golden_grads",
    "golden_out_lse",
    "grad_bound",
    "grad_spec",
    "load_callable",
    "merge",
    "spec_from_options",
]

#: How the gradients are obtained: ``auto`` (from the signature), ``autograd`` (PyTorch's, through the forward),
#: ``plain`` (a backward taking ``q, k, v, d_out``) or ``flash`` (FlashAttention-2's signature, with ``out`` and
#: ``lse``).
KINDS = ("auto", "autograd", "plain", "flash")
#: ``kind="backward"`` (internal): plain or flash, decided from the signature where the function is imported.
_ADAPTER_KINDS = (*KINDS, "backward")
#: The units a flash backward's lse may be declared in (``lse_units=``): natural log, or log2 (exp2 kernels).
LSE_UNITS = ("nats", "log2")

#: The backward finding codes, with their meaning in a few words (docs/checker.md, "Backward", explains each).
BACKWARD_CODES: dict[str, str] = {
    "grad-mismatch": "gradients differ from the float64 golden and no named mistake explains it",
    "grad-jacobian": "the softmax Jacobian is incomplete (dS = P ∘ dP without - delta, or its diagonal alone)",
    "grad-delta": "delta is computed from the wrong quantity (rowsum(dP) or rowsum(P) instead of rowsum(dO ∘ O))",
    "grad-scale": "1/sqrt(d_k) is missing from dQ/dK, or applied twice",
    "grad-transposed": "dV, dK or dQ is computed with a transposed factor (P instead of Pᵀ, dS instead of dSᵀ)",
    "grad-masked-leak": "masked keys' K/V receive gradient from rows that cannot see them",
    "grad-masked-row": "NaN/inf gradients on fully masked rows, or gradients not following the forward's policy",
    "grad-gqa-sum": "GQA dK/dV are not summed over the query heads of a group",
    "grad-lse": "the backward's P is recomputed from a wrong lse (no max, wrong units, wrong axis)",
    "grad-accumulate": "per-block accumulators (dK/dV/dQ) are overwritten instead of accumulated",
    "grad-causal": "the backward's causal mask differs from the forward's (off by one, the other alignment, missing, "
    "or added where the forward has none)",
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
    "+ n_k - n_q bottom-right), and none when the forward had none (read the same causal flag)",
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

_MASK_NAMES = ("mask", "attn_mask", "attention_mask")
_CAUSAL_NAMES = ("causal", "is_causal")
_SCALE_NAMES = ("scale", "softmax_scale", "sm_scale")
_KEEP_NAMES = ("dropout_mask", "keep_mask")
_P_NAMES = ("dropout_p",)
_BIAS_NAMES = ("bias", "attn_bias")
_FLASH_NAMES = ("lse", "logsumexp", "softmax_lse", "out", "o", "output")
#: The gradients a call returns, in order.
GRADS = ("dq", "dk", "dv", "dbias")


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

        self.keep_arg = both((spec.dropout_arg,) if spec.dropout_arg else _KEEP_NAMES)
        self.p_arg = both(_P_NAMES)
        self.bias_arg = both(_BIAS_NAMES)
        self.pending: dict[str, Any] = {}
        self.bias_given = False
        self.inner_mutated: list[str] = []
        self.extra_unsupported = dict.fromkeys(extra_unsupported, "declared unsupported")
        self.fn = self._call

    def structural_unsupported(self) -> dict[str, str]:
        out = super().structural_unsupported()
        if self.keep_arg is None or self.p_arg is None:
            named = self.spec.dropout_arg
            out["dropout"] = f"the function takes no {named or 'dropout_mask'}= and dropout_p=" + (
                "" if named else "; another name: dropout_arg="
            )
        if self.bias_arg is None:
            out["bias"] = "the function takes no bias="
        out.update(self.extra_unsupported)
        return out

    # -- one call ---------------------------------------------------------------------------------------------
    def build_request(self, req: CallRequest) -> tuple[tuple, dict]:
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
        assert req.d_out is not None  # every gradient request carries d_out (Gradients.request)
        d_out = self.to_framework(self.to_layout(req.d_out), req.dtype)
        pending: dict[str, Any] = {"d_out": d_out}
        if self.kind == "flash" and self.forward is None:
            assert req.out is not None and req.lse is not None  # the golden ones (Gradients.request: golden_lse)
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
            grads = tuple(grads[n] for n in GRADS if grads.get(n) is not None)
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
        names = GRADS[: len(grads)] if want == 4 else GRADS[:3]
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


# ----------------------------------------------------------------------------------------------------------------
# the golden


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


@dataclass(frozen=True)
class GradTarget:
    """What a worker process needs to build the :class:`GradAdapter` (sent in place of the forward's
    :class:`~attnlab.checker.Spec`; the worker calls :meth:`make_adapter` on the imported function)."""

    spec: Spec
    kind: str
    forward: str | None = None
    lse_units: str = "nats"
    extra_unsupported: tuple[str, ...] = ()

    def make_adapter(self, fn: Any, load: Callable[[str], Any]) -> GradAdapter:
        """The adapter of the imported ``fn`` (its forward imported with ``load``, the worker's import)."""
        fwd = None if self.forward is None else load(self.forward)
        return GradAdapter(
            fn,
            self.spec,
            kind=self.kind,
            forward=fwd,
            lse_units=self.lse_units,
            extra_unsupported=self.extra_unsupported,
        )


def describe_backward(kind: str, backend: Any, lse_units: str, with_forward: bool) -> str:
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


def spec_from_options(*, unsupported: Any = (), **options: Any) -> Spec:
    """A :class:`~attnlab.checker.Spec` from :func:`attnlab.check`'s keyword options (list options as iterables or
    comma-separated strings, as everywhere); the gradient-only capabilities of ``unsupported`` are left out."""
    unsup = frozenset(u for u in listed(unsupported) if u not in GRAD_CAPABILITIES)
    try:
        return Spec(unsupported=unsup, **options)
    except TypeError as err:
        raise UsageError(f"options: {err}") from None


def grad_spec(spec: Spec) -> Spec:
    """``spec`` as the gradient probes call the function: a full mask for the sequence forms."""
    return replace(spec, mask_form="full" if spec.mask_form in ("varlen", "kv_cache") else spec.mask_form)


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
