"""The tiled backward (FlashAttention-2's): ``P`` recomputed block by block from the forward's ``lse``, tasks over
key blocks so that each task owns its ``dK``, ``dV`` rows, ``dQ`` summed from the tasks' parts.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._arrays import shape_of, to_numpy
from ...core.inputs import check_finite
from ...errors import DTypeError, MaskedRowError, NonFiniteError, OptionError, ShapeError
from .. import autograd, fused
from ..overflow import gradient_overflow_error
from ..threads import run_tasks
from .exponentials import Units, exp_offset
from .plan import (
    Plan,
    TiledOptions,
    apply_mask,
    bad_array,
    bias_block,
    empty_rows_error,
    make_plan,
    to_caller,
    to_logits,
)
from .result import FlashResult

__all__ = ["FlashGrads", "backward", "flash_attention_backward", "saved_backward"]


@dataclass(frozen=True)
class FlashGrads:
    """Gradients of the tiled backward, each shaped (and typed) like its input.

    Shapes: ``dq [..., n_q, d_k]``, ``dk [..., n_k, d_k]``, ``dv [..., n_k, d_v]``, ``dbias`` as the bias (None
    without one); inputs that were broadcast (a shared k/v, GQA's kv heads, a bias shared across heads) get their
    gradients summed back.
    """

    dq: Any
    dk: Any
    dv: Any
    dbias: Any = None


class _BiasGrad:
    """``dbias = dS / temperature``, accumulated block by block into the bias's own (unbroadcast) shape: memory is
    that of the bias, never ``[*batch, n_q, n_k]`` unless the bias is that large itself."""

    def __init__(self, plan: Plan) -> None:
        raw = plan.bias_raw
        assert raw is not None  # made only for a call with a bias
        self.plan = plan
        self.acc = np.zeros((1,) * (len(plan.batch) + 2 - raw.ndim) + raw.shape, dtype=plan.q.dtype)
        self.factor = plan.q.dtype.type(1.0 / plan.temperature)
        self.lock = threading.Lock()

    def add(self, idx: tuple[int, ...], i0: int, j0: int, ds: np.ndarray) -> None:
        """Add the block ``ds [bq, bk]`` (rows from ``i0``, columns from ``j0`` of batch·head ``idx``)."""
        acc = self.acc[tuple(i if n > 1 else 0 for i, n in zip(idx, self.acc.shape[:-2], strict=True))]
        rows, cols = slice(i0, i0 + ds.shape[0]), slice(j0, j0 + ds.shape[1])
        if acc.shape[0] == 1:
            ds, rows = ds.sum(axis=0, keepdims=True), slice(0, 1)
        if acc.shape[1] == 1:
            ds, cols = ds.sum(axis=1, keepdims=True), slice(0, 1)
        with self.lock:
            acc[rows, cols] += ds * self.factor

    def total(self) -> np.ndarray:
        """The gradient in the caller's bias shape."""
        return self.acc.reshape(self.plan.bias_shape)


def _sum_to(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``x`` over the axes along which an input of ``shape`` was broadcast."""
    extra = x.ndim - len(shape)
    if extra > 0:
        x = x.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, (a, b) in enumerate(zip(x.shape, shape, strict=True)) if b == 1 and a != 1)
    if axes:
        x = x.sum(axis=axes, keepdims=True)
    return x


@dataclass(frozen=True)
class _Backward:
    """What every backward task reads (and the arrays it writes: ``dk``, ``dv``, ``dbias``)."""

    plan: Plan
    u: Units
    qs_all: np.ndarray  # [*batch, n_q, d_k], folded (see Units)
    d_o: np.ndarray  # [*batch, n_q, d_v]
    lse_safe: np.ndarray  # [*batch, n_q], +inf on fully masked rows
    delta: np.ndarray  # [*batch, n_q]
    dk: np.ndarray  # [*batch, n_k, d_k]
    dv: np.ndarray  # [*batch, n_k, d_v]
    dbias: _BiasGrad | None


def _backward_task(c: _Backward, task: tuple[tuple[int, ...], int, int]) -> tuple[tuple[int, ...], np.ndarray | None]:
    """The key blocks ``[ja, jb)`` of batch·head ``idx`` (``task = (idx, ja, jb)``): ``dk``, ``dv`` (and ``dbias``)
    written into ``c``, ``dq`` returned."""
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow shows up in the gradients, checked after
        return _backward_blocks(c, *task)


def _backward_blocks(c: _Backward, idx: tuple[int, ...], ja: int, jb: int) -> tuple[tuple[int, ...], np.ndarray | None]:
    """:func:`_backward_task`'s loop over key blocks, and for each over the query blocks that see it."""
    plan, u, dk, dv, dbias = c.plan, c.u, c.dk, c.dv, c.dbias
    dt = plan.q.dtype
    E = u.E
    Qs = c.qs_all[idx]  # [n_q, d_k], folded: R · Qs Kᵀ + c_bias · bias are the logits
    K, V = plan.k[idx], plan.v[idx]
    dO, L, D = c.d_o[idx], c.lse_safe[idx], c.delta[idx]
    dq = None
    jit: Any = fused.kernels() if E.fused else None  # used only where E.fused
    for j0 in range(ja, jb, plan.block_k):
        j1 = min(j0 + plan.block_k, jb)
        Kj, Vj = K[j0:j1], V[j0:j1]
        dKj = np.zeros((j1 - j0, plan.d_k), dtype=dt)
        dVj = np.zeros((j1 - j0, plan.d_v), dtype=dt)
        ilo, ihi = plan.query_range(idx, j0, j1)
        for i0 in range(ilo, ihi, plan.block_q):
            i1 = min(i0 + plan.block_q, ihi)
            bad = plan.blocked(idx, i0, i1, j0, j1)
            if bad is False:
                continue
            s = Qs[i0:i1] @ Kj.T  # [bq, bk]
            if E.fused:
                bias = bias_block(plan, idx, i0, i1, j0, j1)
                jit.exp2_rows(s, u.R, bias, u.c_bias, L[i0:i1], u.pre, bad_array(bad), None)  # P: one pass
            else:
                to_logits(plan, u, idx, i0, j0, s)
                if bad is not None:
                    apply_mask(s, bad)
                exp_offset(u, s, L[i0:i1])  # P, exactly the forward's weights
            dOi = dO[i0:i1]
            dVj += s.T @ dOi  # dV += Pᵀ dO
            dP = dOi @ Vj.T  # [bq, bk]
            if E.fused:
                jit.ds_rows(dP, D[i0:i1], s)  # dS = P ∘ (dP - delta)
            else:
                dP -= D[i0:i1, None]
                dP *= s  # dS = P ∘ (dP - delta)
            if dbias is not None:
                dbias.add(idx, i0, j0, dP)
            if dq is None:
                dq = np.zeros((plan.n_q, plan.d_k), dtype=dt)
            dq[i0:i1] += dP @ Kj  # unscaled; times scale at the end
            dKj += dP.T @ Qs[i0:i1]  # dK += dSᵀ (2**shift · Q)
        dKj *= u.R  # dK = dSᵀ Q · scale / temperature
        dk[idx][j0:j1] = dKj
        dv[idx][j0:j1] = dVj
    return idx, dq


def _saved(plan: Plan, output: Any, lse: Any, d_out: Any, d_lse: Any) -> dict[str, np.ndarray]:
    """The forward's ``output`` and ``lse``, ``d_out`` and ``d_lse`` checked against the plan, as NumPy arrays of
    the compute dtype in the internal layout ``[*batch, n_q(, d_v)]``."""
    dt = plan.q.dtype
    full_out = (*plan.batch, plan.n_q, plan.d_v)
    caller_out = (*plan.out_batch, plan.n_q, plan.d_v)
    arrays = {}
    named = [("output", output, caller_out), ("lse", lse, caller_out[:-1]), ("d_out", d_out, caller_out)]
    if d_lse is not None:
        named.append(("d_lse", d_lse, caller_out[:-1]))
    for name, x, want in named:
        x = np.asarray(x) if isinstance(x, (list, tuple)) else x
        if not hasattr(x, "shape"):
            raise DTypeError(f"{name}: expected an array, got {type(x).__name__}")
        if shape_of(x) != want:
            legend = "[..., n_q]" if "lse" in name else "[..., n_q, d_v]"
            raise ShapeError(f"{name}: shape {shape_of(x)}, expected {want} {legend} (the forward's output shape)")
        xn = to_numpy(x)
        if name != "lse":
            check_finite(np, xn, name)
        elif np.isnan(xn).any() or np.isposinf(xn).any():
            raise NonFiniteError(
                "lse: holds NaN or +inf; expected the forward's lse (finite, -inf on fully masked rows)"
            )
        arrays[name] = xn.astype(dt, copy=False).reshape(full_out if "lse" not in name else full_out[:-1])
    if np.isneginf(arrays["lse"]).any() and plan.masked_rows != "zero":
        err = empty_rows_error(plan, arrays["lse"].reshape(caller_out[:-1]), "backward")
        raise MaskedRowError(
            f"{err} — in the backward, fully masked rows have a gradient only under masked_rows='zero' "
            f"(zero output, zero gradient)",
            err.rows,
        )
    return arrays


def _backward_tasks(plan: Plan) -> list[tuple[tuple[int, ...], int, int]]:
    """``(idx, ja, jb)``: one per batch·head when there are enough, else each one's keys split between the threads."""
    n_b = math.prod(plan.batch)
    splits = 1 if n_b >= plan.threads else math.ceil(plan.threads / n_b) * 2
    tasks = []
    for idx in np.ndindex(*plan.batch):
        nk = plan.n_keys(idx)
        if nk == 0:
            continue
        per = max(plan.block_k, math.ceil(nk / splits / plan.block_k) * plan.block_k)
        for ja in range(0, nk, per):
            tasks.append((idx, ja, min(ja + per, nk)))
    return tasks


def backward(plan: Plan, output: Any, lse: Any, d_out: Any, d_lse: Any) -> FlashGrads:
    """The gradients of the forward planned by ``plan`` (see :func:`flash_attention_backward`)."""
    dt = plan.q.dtype
    arrays = _saved(plan, output, lse, d_out, d_lse)
    u = plan.units()
    lse_n = arrays["lse"]
    d_o = arrays["d_out"]
    with np.errstate(over="ignore", invalid="ignore"):
        delta = np.einsum("...ij,...ij->...i", d_o, arrays["output"])  # [*batch, n_q] rowsum(dO ∘ O)
    if d_lse is not None:
        delta = delta - arrays["d_lse"]  # dS = P ∘ (dP - delta + dlse)
    c = _Backward(
        plan=plan,
        u=u,
        qs_all=u.fold(plan.q),  # R · qs Kᵀ (+ bias / T) are the logits
        d_o=d_o,
        lse_safe=np.where(np.isneginf(lse_n), np.inf, lse_n),  # +inf on fully masked rows: exp(s - inf) = 0
        delta=delta,
        dk=np.zeros((*plan.batch, plan.n_k, plan.d_k), dtype=dt),
        dv=np.zeros((*plan.batch, plan.n_k, plan.d_v), dtype=dt),
        dbias=None if plan.bias_raw is None else _BiasGrad(plan),
    )
    dq = np.zeros((*plan.batch, plan.n_q, plan.d_k), dtype=dt)
    results = run_tasks(lambda t: _backward_task(c, t), _backward_tasks(plan), plan.threads)
    with np.errstate(over="ignore", invalid="ignore"):
        for idx, dq_part in results:
            if dq_part is not None:
                dq[idx] += dq_part
        dq *= dt.type(plan.factor)
    grads = (("dq", dq), ("dk", c.dk), ("dv", c.dv), ("dbias", None if c.dbias is None else c.dbias.acc))
    for name, g in grads:
        if g is not None and not np.isfinite(g).all():
            where = tuple(int(i) for i in np.argwhere(~np.isfinite(g))[0])
            raise gradient_overflow_error(name, where, float(g[where]), str(dt), d_out_max=float(np.abs(d_o).max()))

    def back(name: str, x: np.ndarray, shape: tuple[int, ...], caller_shape: tuple[int, ...]) -> Any:
        return to_caller(plan, np.ascontiguousarray(_sum_to(x, shape)).reshape(caller_shape), name=name)

    cq, ck, cv = plan.caller_shapes
    return FlashGrads(
        dq=back("dq", dq, plan.q_shape, cq),
        dk=back("dk", c.dk, plan.k_shape, ck),
        dv=back("dv", c.dv, plan.v_shape, cv),
        dbias=None if c.dbias is None else to_caller(plan, c.dbias.total(), name="dbias"),
    )


def saved_backward(
    q: Any, k: Any, v: Any, bias: Any, options: TiledOptions, output: Any, lse: Any, d_out: Any, d_lse: Any
) -> FlashGrads:
    """:func:`backward` from what the forward's ``torch.autograd.Function`` saved (its inputs, options, output and
    ``lse``; shapes as in :func:`flash_attention_backward`): the backward :mod:`attnlab.kernels.autograd` runs."""
    return backward(make_plan(q, k, v, bias, options), output, lse, d_out, d_lse)


def flash_attention_backward(result: FlashResult, d_out: Any, *, d_lse: Any = None) -> FlashGrads:
    """FlashAttention-2's backward: gradients of the tiled forward from its result in O(n) memory.

    ``P`` is recomputed block by block from ``lse``; ``delta = rowsum(dO ∘ O) - dlse``, ``dV = Pᵀ dO``,
    ``dP = dO Vᵀ``, ``dS = P ∘ (dP - delta)``, ``dQ = dS K · scale / T``, ``dK = dSᵀ Q · scale / T``,
    ``dbias = dS / T`` (T the temperature; ``∂lse_i/∂logit_ij = P_ij`` is why a gradient of ``lse`` only shifts
    ``delta``).

    Args:
        result: the forward's :class:`FlashResult`: its output, ``lse``, inputs and options (nothing is repeated).
        d_out: ``dO = ∂L/∂output`` ``[..., h, n_q, d_v]``.
        d_lse: ``∂L/∂lse`` ``[..., h, n_q]`` when the loss uses the forward's ``lse`` too (None: it does not).

    Fully masked rows (``lse = -inf``) get zero gradient under the forward's ``masked_rows="zero"``; under
    ``"raise"`` and ``"nan"`` they raise :class:`~attnlab.errors.MaskedRowError` (a NaN output has no gradient).

    Returns:
        :class:`FlashGrads` ``(dq, dk, dv, dbias)``, each shaped like its input (summed over broadcast and
        GQA-shared heads) in the inputs' library and dtype; ``dbias`` is None without a bias, and is accumulated
        in the bias's own shape (its memory, not ``[..., n_q, n_k]``, unless the bias is that large).

    For an output and lse that came from elsewhere, build the result yourself: ``FlashResult(output, lse,
    inputs=(q, k, v, bias), options=TiledOptions.of(**forward_options))``.

    The gradients carry no autograd history (no double backward): with PyTorch tensors that require grad and
    grad mode on, this raises :class:`~attnlab.errors.DTypeError` rather than return tensors that would silently
    drop second-order terms; :func:`flash_attention` itself is differentiable (its ``torch.autograd.Function``
    runs this backward). Gradients that overflow the compute dtype from finite inputs raise
    :class:`~attnlab.errors.RangeError`. As in FlashAttention, ``P`` is only as exact as ``lse``: a float32
    ``lse`` of magnitude L carries ~L · 6e-8 absolute rounding, a relative error of the recomputed weights (at
    |logits| ~ 1e4, ~1e-3: far beyond real activations, but a float64 lse would not have it).

    >>> import numpy as np
    >>> from attnlab.kernels import flash_attention
    >>> rng = np.random.default_rng(1)
    >>> q, k, v, d_o = (rng.standard_normal((3, 50, 8)) for _ in range(4))
    >>> f = flash_attention(q, k, v, causal=True, block_q=16, block_k=16)
    >>> g = flash_attention_backward(f, d_o)
    >>> g.dq.shape, g.dk.shape, g.dv.shape
    ((3, 50, 8), (3, 50, 8), (3, 50, 8))
    """
    if not isinstance(result, FlashResult):
        raise DTypeError(
            f"result: expected the FlashResult flash_attention returned (it holds the forward's inputs and options), "
            f"got {type(result).__name__}; for an output and lse from elsewhere build FlashResult(output, lse, "
            f"inputs=(q, k, v, bias), options=TiledOptions.of(**forward_options))"
        )
    if result.inputs is None:
        raise OptionError(
            "result: a FlashResult without the forward's inputs; pass the result flash_attention returned"
        )
    q, k, v, bias = result.inputs
    output, lse = result.output, result.lse
    autograd.refuse_grad("flash_attention_backward", q=q, k=k, v=v, output=output, lse=lse, d_out=d_out, bias=bias)
    return backward(make_plan(q, k, v, bias, result.options), output, lse, d_out, d_lse)
