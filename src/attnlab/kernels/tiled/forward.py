"""The tiled forward: each query block against the key blocks it may see, with the bounded fast path or the online
softmax (see :mod:`attnlab.kernels.tiled`), run as tasks on the worker threads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core.inputs import Causal, MaskedRows
from ...errors import RangeError
from .. import autograd, fused
from ..overflow import logits_overflow_error
from ..threads import run_tasks
from .exponentials import Units, exp_offset
from .gradients import saved_backward
from .plan import (
    Plan,
    PositionMask,
    TiledOptions,
    apply_mask,
    bad_array,
    bias_block,
    bias_into,
    caller_index,
    empty_rows_error,
    forward_tasks,
    make_plan,
    options,
    to_caller,
    to_logits,
    zero_masked,
)
from .result import FlashResult

__all__ = ["THRESHOLD", "flash_attention", "forward"]

_local = threading.local()  # each worker thread's buffers (:func:`_work`)

#: Row sums of ``P`` beyond which a block is recomputed with the maximum pass (and that bound V's scaling).
THRESHOLD = {np.dtype(np.float32): 2.0**40, np.dtype(np.float64): 2.0**200}


@dataclass(frozen=True)
class _Extras:
    """Per-call values the forward tasks share: the units, per batch·head the largest key norm, the score bound
    under which the fast path (no running maximum) is exact, and the one beyond which a logit may overflow."""

    u: Units
    k_norm: np.ndarray  # [*batch]
    safe: float  # |logit| bound (nats) under which exp(S) needs no offset
    bias_max: float  # max |bias| / temperature (nats), 0 without a bias
    limit: float  # |logit| bound (nats) under which no logit, nor a difference of two, can overflow


def _extras(plan: Plan) -> _Extras:
    dt = plan.q.dtype
    v_raw, k_raw = plan.v_raw, plan.k_raw
    with np.errstate(over="ignore"):  # an infinite norm only says "check this block" (see _forward_task)
        k_norm = np.sqrt(np.einsum("...ij,...ij->...i", k_raw, k_raw).max(axis=-1))  # [*k batch]
    v_max = max(float(v_raw.max()), -float(v_raw.min()))  # max |v| without a temporary
    # exp(S) stays far from overflow in every sum and product, and far from underflow (<= 60, or 600 in float64)
    big, cap = (69.0, 60.0) if dt == np.float32 else (690.0, 600.0)
    safe = min(cap, big - math.log(max(plan.n_k, 1)) - math.log(max(v_max, 1.0)))
    bias_max = 0.0
    if plan.bias_raw is not None and plan.bias_raw.size:
        bias_max = max(float(plan.bias_raw.max()), -float(plan.bias_raw.min())) / plan.temperature
    return _Extras(
        u=plan.units(),
        k_norm=np.broadcast_to(k_norm, plan.batch),
        safe=safe,
        bias_max=bias_max,
        limit=float(np.finfo(dt).max) / 16,
    )


def _v_shift(plan: Plan) -> int:
    """The power of two V is divided by (exactly) so that the unnormalised sums ``acc = sum_j P_ij V_j`` cannot
    overflow: ``P`` reaches the row-sum threshold (``2**40`` in float32) between two maximum passes, so ``acc`` is
    at most ``n_k · threshold · max |v|``. 0 (no scaling) unless ``max |v|`` is within ``n_k · 2**41`` of the
    dtype's limit, which no real activation is."""
    dt = plan.q.dtype
    v_max = max(float(plan.v_raw.max()), -float(plan.v_raw.min()), 0.0)
    room = float(np.finfo(dt).max) / (4.0 * THRESHOLD[dt] * max(plan.n_k, 1))
    if v_max <= room:
        return 0
    return math.ceil(math.log2(v_max / room))


def _scaled_v(plan: Plan, shift: int) -> Plan:
    """``plan`` with V divided by ``2**shift`` (exact up to underflow of values ``2**shift`` below the largest)."""
    if shift == 0:
        return plan
    with np.errstate(under="ignore"):
        v_raw = np.ldexp(plan.v_raw, -shift)
    return dataclasses.replace(plan, v_raw=v_raw, v=np.broadcast_to(v_raw, plan.v.shape))


@functools.lru_cache(maxsize=16)
def _ones(n: int, dtype: str) -> np.ndarray:
    """A read-only vector of ``n`` ones: ``P @ ones`` gives the row sums of ``P`` (a matrix-vector product reads
    the block once, at a fifth of the cost of ``P.sum(axis=1)``)."""
    ones = np.ones(n, dtype=dtype)
    ones.flags.writeable = False
    return ones


class _Work:
    """One worker thread's buffers for a query block (reused across tasks and calls: fresh arrays per task would
    cost allocations and page faults): the score block ``s``, ``acc`` (``P V``), ``pv``, ``l_i`` and ``lt``."""

    __slots__ = ("acc", "key", "l_i", "lt", "pv", "s")

    def __init__(self, bq: int, bk: int, d_v: int, dt: np.dtype) -> None:
        self.key = (bq, bk, d_v, dt.str)
        self.s = np.empty(bq * bk, dtype=dt)
        self.acc = np.empty((bq, d_v), dtype=dt)
        self.pv = np.empty((bq, d_v), dtype=dt)
        self.l_i = np.empty(bq, dtype=dt)
        self.lt = np.empty(bq, dtype=dt)


def _work(bq: int, bk: int, d_v: int, dt: np.dtype) -> _Work:
    """This thread's :class:`_Work` for the shape (kept while the shape repeats; not kept when large)."""
    if bq * bk > 1 << 22:  # more than 16 MiB of float32: not worth keeping
        return _Work(bq, bk, d_v, dt)
    w = getattr(_local, "work", None)
    if w is None or w.key != (bq, bk, d_v, dt.str):
        w = _local.work = _Work(bq, bk, d_v, dt)
    return w


def _forward_task(
    plan: Plan, ex: _Extras, out: np.ndarray, lse: np.ndarray, task: tuple[tuple[int, ...], int, int]
) -> None:
    """One query block against its key blocks.

    Fast path: when ``|scale · q_i · k_j| <= ex.safe`` for the whole block (Cauchy-Schwarz on the norms),
    ``exp(S)`` needs no running maximum at all: each key block costs one product, one exponential with the row
    sums (:func:`_exp_bounded`) and one product with ``V``. Otherwise the online softmax with a
    running maximum ``m_i`` (see the module docstring) runs. When the same bound cannot rule out a logit beyond
    the dtype's range (``ex.limit``), every block's logits are checked for infinities and NaN (a
    :class:`~attnlab.errors.RangeError`); with the bound, none is possible and nothing is checked.
    """
    idx, i0, i1 = task
    dt = plan.q.dtype
    bq = i1 - i0
    u = ex.u
    qs = u.fold(plan.q[idx][i0:i1])  # [bq, d_k]: R · qs Kᵀ (+ bias / T) are the logits
    K, V = plan.k[idx], plan.v[idx]  # [n_k, d_k], [n_k, d_v]
    w = _work(bq, plan.block_k, plan.d_v, dt)
    acc, pv, l_i, lt, buf = w.acc, w.pv, w.l_i, w.lt, w.s
    acc.fill(0)
    l_i.fill(0)
    ones = _ones(plan.block_k, dt.str)
    with np.errstate(over="ignore"):
        q_norm = float(np.sqrt(np.einsum("ij,ij->i", qs, qs).max()))
    bound = q_norm * float(ex.k_norm[idx]) * float(u.R)  # |logits - bias / T| (inf or NaN: unknown)
    bounded = bound + ex.bias_max <= ex.safe and not plan.config.force_online
    if plan.config.observe is not None:
        plan.config.observe("bounded" if bounded else "online")
    if bounded:
        matmul = np.matmul
        a = u.R * u.pre  # what turns qs Kᵀ into the exponential's argument
        if not u.E.fused:
            # NumPy's passes: all of it folded into Q (rounding each element of Q), which saves a pass per block;
            # within the bound that rounding stays below float32's own (0 of 600 random bounded cases beyond
            # FlashAttention's rule), unlike at large logits (see Units)
            qs, a = qs * a, dt.type(1)
        for j0, j1, bad in plan.key_blocks(idx, i0, i1):
            bk = j1 - j0
            s = buf[: bq * bk].reshape(bq, bk)  # contiguous [bq, bk]
            matmul(qs, K[j0:j1].T, out=s)  # [bq, bk], |R · s + bias / T| <= safe
            _exp_bounded(plan, u, a, (idx, i0, j0), s, bad, lt, ones)  # P = exp(logits), masked 0, lt = P 1
            matmul(s, V[j0:j1], out=pv)
            acc += pv
            l_i += lt
        m_i = np.zeros(bq, dtype=dt)
    else:
        check = not bound + ex.bias_max <= ex.limit
        with np.errstate(over="ignore", invalid="ignore") if check else contextlib.nullcontext():
            m_i = _online_softmax(plan, ex, task, qs, w, check)
    full = l_i > 0
    if full.all():
        acc /= l_i[:, None]
        out[idx][i0:i1] = acc
        lse[idx][i0:i1] = m_i + np.log(l_i)
    else:
        safe_l = np.where(full, l_i, 1)
        acc /= safe_l[:, None]
        if plan.masked_rows == "nan":
            acc[~full] = np.nan
        out[idx][i0:i1] = acc
        lse[idx][i0:i1] = np.where(full, m_i + np.log(safe_l), -np.inf)


def _logits(
    plan: Plan, u: Units, at: tuple[tuple[int, ...], int, int], qs: np.ndarray, Kj: np.ndarray, s: np.ndarray
) -> np.ndarray:
    """The block's logits (nats) into ``s``: ``R · qs Kjᵀ`` (q already folded) plus the bias block, if any."""
    np.matmul(qs, Kj.T, out=s)
    to_logits(plan, u, *at, s)
    return s


def _exp_bounded(
    plan: Plan,
    u: Units,
    a: Any,
    at: tuple[tuple[int, ...], int, int],
    s: np.ndarray,
    bad: np.ndarray | PositionMask | None,
    lt: np.ndarray,
    ones: np.ndarray,
) -> None:
    """The fast path's exponential of one block of bounded scores: ``s <- fn(a · s + pre · bias / T)`` in place, with
    no offset (``s = qs Kjᵀ``, ``a`` what is left of the factor times ``pre``): masked entries 0, ``lt`` = the row
    sums. One fused pass, or NumPy's passes (the mask multiplied in after the exponential, which is slow on
    ``-inf``; the row sums as ``P 1``)."""
    idx, i0, j0 = at  # the block's batch·head index, first query row and first key
    c = u.c_bias * u.pre
    if u.E.fused:
        bias = bias_block(plan, idx, i0, i0 + s.shape[0], j0, j0 + s.shape[1])
        fused.kernels().exp2_rows_bounded(s, a, bias, c, bad_array(bad), lt)
        return
    if a != 1:
        s *= a
    bias_into(plan, idx, i0, j0, s, c)
    u.E.fn(s, out=s)
    if bad is not None:
        zero_masked(s, bad)
    np.matmul(s, ones[: s.shape[1]], out=lt)


def _check_logits(
    plan: Plan, at: tuple[tuple[int, ...], int, int], s: np.ndarray, bad: np.ndarray | PositionMask | None
) -> None:
    """A :class:`~attnlab.errors.RangeError` if a logit of the block ``s`` that the mask allows is not finite."""
    idx, i0, j0 = at
    ok = np.isfinite(s)
    blocked = bad_array(bad)
    if blocked is not None:
        ok |= blocked
    if ok.all():
        return
    i, j = (int(x) for x in np.argwhere(~ok)[0])
    value = float(s[i, j])
    q_max = max(float(plan.q.max()), -float(plan.q.min()))
    k_max = max(float(plan.k_raw.max()), -float(plan.k_raw.min()))
    bias_max = None
    if plan.bias_raw is not None:
        bias_max = max(float(plan.bias_raw.max()), -float(plan.bias_raw.min()))
    raise logits_overflow_error(
        (*caller_index(plan, idx), i0 + i, j0 + j),
        value,
        -1,
        (*plan.out_batch, plan.n_q, plan.n_k),
        str(plan.q.dtype),
        q_max=q_max,
        k_max=k_max,
        bias_max=bias_max,
        scale=plan.scale,
        temperature=plan.temperature,
    )


def _online_softmax(
    plan: Plan, ex: _Extras, task: tuple[tuple[int, ...], int, int], qs: np.ndarray, w: _Work, check: bool = False
) -> np.ndarray:
    """The online softmax with running max ``m_i`` (lazy: the max pass runs only while some row has none yet, or
    when a block's row sums pass the threshold, and for every block after that one). Accumulates ``P V`` into
    ``w.acc`` and the row sums into ``w.l_i``; returns ``m_i``. With ``check``, every block takes the max pass and
    its logits are checked (:func:`_check_logits`) before they are used."""
    idx, i0, i1 = task
    dt = plan.q.dtype
    K, V = plan.k[idx], plan.v[idx]  # [n_k, d_k], [n_k, d_v]
    ones = _ones(plan.block_k, dt.str)
    u = ex.u
    E = u.E
    threshold = THRESHOLD[dt]
    bq = i1 - i0
    acc, pv, l_i, lt, buf = w.acc, w.pv, w.l_i, w.lt, w.s
    m_i = np.full(bq, -np.inf, dtype=dt)  # running max of the logits (the offset of P)
    ready = False  # every row has a finite m_i
    lazy = not check  # try blocks without the max pass; off after the first block whose scores outgrew m_i
    jit: Any = fused.kernels() if E.fused else None  # used only where E.fused
    one = dt.type(1)
    for j0, j1, bad in plan.key_blocks(idx, i0, i1):
        bk = j1 - j0
        s = buf[: bq * bk].reshape(bq, bk)  # contiguous [bq, bk]
        Kj = K[j0:j1]
        skip_max = ready and lazy  # exponentiate relative to m_i without this block's maximum
        if skip_max and E.fused:  # bias, running max, mask, exponential and row sums in one pass
            np.matmul(qs, Kj.T, out=s)
            bias = bias_block(plan, idx, i0, i1, j0, j1)
            jit.exp2_rows(s, u.R, bias, u.c_bias, m_i, u.pre, bad_array(bad), lt)  # P, relative to m_i
        else:
            _logits(plan, u, (idx, i0, j0), qs, Kj, s)  # [bq, bk]
            if check:
                _check_logits(plan, (idx, i0, j0), s, bad)
            if bad is not None:
                apply_mask(s, bad)
            if skip_max:
                with np.errstate(over="ignore", invalid="ignore"):  # an overflow shows up in the row sums, below
                    exp_offset(u, s, m_i)  # P relative to the running max (entries may exceed 1)
                    np.matmul(s, ones[:bk], out=lt)
        if skip_max:
            if lt.max() <= threshold:  # False for inf and NaN too
                np.matmul(s, V[j0:j1], out=pv)
                acc += pv
                l_i += lt
                continue
            lazy = False  # scores that grow along the keys (ALiBi, a window) would fail block after block
            _logits(plan, u, (idx, i0, j0), qs, Kj, s)  # scores grew too much: redo this block with the max pass
            if bad is not None:
                apply_mask(s, bad)
        m_new = np.maximum(m_i, s.max(axis=1))
        ready = bool(np.isfinite(m_new).all())
        m_use = m_new if ready else np.where(np.isfinite(m_new), m_new, 0).astype(dt)
        alpha = np.exp(m_i - m_use)  # rescales the old acc and l_i (0 where m_i was -inf)
        if E.fused:
            jit.exp2_rows(s, one, None, one, m_use, u.pre, None, lt)  # logits already; masked entries -inf: 0
        else:
            exp_offset(u, s, m_use)
            np.matmul(s, ones[:bk], out=lt)
        np.matmul(s, V[j0:j1], out=pv)
        acc *= alpha[:, None]
        acc += pv
        l_i *= alpha
        l_i += lt
        m_i = m_new
    return np.where(np.isfinite(m_i), m_i, 0).astype(dt)


def flash_attention(  # 16 parameters: the public keywords, each a field of TiledOptions, built once below
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: Causal = False,
    q_offset: int | None = None,
    window: Any = None,
    key_lengths: Any = None,
    segments: Any = None,
    mask: Any = None,
    bias: Any = None,
    scale: float | None = None,
    temperature: float = 1.0,
    masked_rows: MaskedRows = "raise",
    block_q: int | None = None,
    block_k: int | None = None,
    num_threads: int | None = None,
) -> FlashResult:
    """Exact attention, tiled: ``softmax((Q Kᵀ · scale + bias) / temperature, masked) V`` without an ``[n_q, n_k]``
    matrix.

    Args:
        q: queries ``[..., h, n_q, d_k]`` (NumPy, PyTorch or any array-API array; computed in NumPy). q, k and v
            come from one library (mask and bias from it or NumPy), else :class:`~attnlab.errors.DTypeError`.
            PyTorch tensors that require grad get gradients (q, k, v, bias; through ``output`` and ``lse``) from
            :func:`flash_attention_backward`, in a ``torch.autograd.Function``.
        k: keys ``[..., h_kv, n_k, d_k]``. ``h_kv`` may divide ``h`` (GQA/MQA: query head i reads kv head
            ``i // (h / h_kv)``, without repeating K and V). Other leading dims broadcast.
        v: values ``[..., h_kv, n_k, d_v]``.
        causal: ``True`` (needs n_q == n_k, or ``q_offset``), ``"top_left"`` or ``"bottom_right"``.
        q_offset: the key position of query 0 (query i sits at position ``q_offset + i``): decoding and chunked
            prefill. Places the causal diagonal and the window; then ``causal`` is True or False.
        window: sliding window: an int ``w`` (query at position p sees keys ``p - w .. p``) or ``(left, right)``
            (``None`` = unbounded on that side). Positions as for ``causal`` (top-left when n_q == n_k).
        key_lengths: ints ``[B]``: keys ``j >= key_lengths[b]`` of sequence b are padding. B is the first leading
            axis of q (or 1, shared by all).
        segments: packed sequences: integer ids ``[n]`` or ``[B, n]`` (self-attention) or a pair
            ``(q_segments, k_segments)``; a query sees only keys with the same id.
        mask: boolean, True = may attend, broadcastable to ``[..., h, n_q, n_k]``; applied block by block. Or a
            :class:`~attnlab.masks.MaskSpec` (then none of causal, q_offset, window, key_lengths, segments), which
            the keywords above build otherwise.
        bias: additive float scores (ALiBi, relative positions), finite, broadcastable to ``[..., h, n_q, n_k]``;
            read block by block (never broadcast to full size). With GQA, a per-head bias is ``[..., h, n_q, n_k]``.
        scale: multiplies ``Q Kᵀ``; default ``1/sqrt(d_k)``.
        temperature: divides the logits (> 1 flattens the weights, < 1 sharpens them), as in the core.
        masked_rows: fully masked rows: ``"raise"`` (:class:`~attnlab.errors.MaskedRowError`), ``"zero"``
            (output 0, as FlashAttention) or ``"nan"``. ``lse`` is ``-inf`` on them.
        block_q, block_k: tile sizes (default :data:`DEFAULT_BLOCK_Q`, :data:`DEFAULT_BLOCK_K`); any int >= 1
            works, dividing n or not (larger than n_q or n_k: clamped to it, so memory never follows a huge size).
        num_threads: worker threads (default: every core when threadpoolctl is installed, else 1; at most
            :func:`~attnlab.kernels.threads.max_threads`, from one shared pool).

    Returns:
        :class:`FlashResult` with ``output [..., h, n_q, d_v]`` (caller's library and dtype) and
        ``lse [..., h, n_q]`` (caller's library, float32 or float64: the compute dtype).

    All masks combine (AND). Extra memory is ``O(block_q · block_k)`` per thread plus the output.

    Raises :class:`~attnlab.errors.RangeError` when finite inputs give logits beyond the compute dtype's range
    (``q = 1e20`` in float32, ``scale=1e308`` in float64, ``temperature=1e-310``), naming what overflowed: never
    NaN, and never a "masked row" for an underflowing temperature.

    >>> import numpy as np, attnlab
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((2, 97, 16)) for _ in range(3))
    >>> r = flash_attention(q, k, v, causal=True, block_q=32, block_k=20)
    >>> bool(np.allclose(r.output, attnlab.scaled_dot_product_attention(q, k, v, causal=True)))
    True
    >>> r.lse.shape
    (2, 97)
    """
    opts = options(
        causal=causal, q_offset=q_offset, window=window, key_lengths=key_lengths, segments=segments, mask=mask,
        scale=scale, temperature=temperature, masked_rows=masked_rows, block_q=block_q, block_k=block_k,
        num_threads=num_threads,
    )  # fmt: skip
    if autograd.wants_grad(q, k, v, bias):
        output, lse = autograd.flash_function(q, k, v, bias, opts, forward=forward, backward=saved_backward)
    else:
        output, lse = forward(q, k, v, bias, opts)
    return FlashResult(output=output, lse=lse, inputs=(q, k, v, bias), options=opts)


def forward(q: Any, k: Any, v: Any, bias: Any, options: TiledOptions) -> tuple[Any, Any]:
    """``(output, lse)`` of :func:`flash_attention` without autograd (shapes as there; the caller's library)."""
    plan = make_plan(q, k, v, bias, options)
    dt = plan.q.dtype
    v_shift = _v_shift(plan)
    plan = _scaled_v(plan, v_shift)
    out = np.empty((*plan.batch, plan.n_q, plan.d_v), dtype=dt)
    lse = np.empty((*plan.batch, plan.n_q), dtype=dt)
    tasks = forward_tasks(plan)
    ex = _extras(plan)
    run_tasks(lambda t: _forward_task(plan, ex, out, lse, t), tasks, plan.threads)
    out = out.reshape((*plan.out_batch, plan.n_q, plan.d_v))
    lse = lse.reshape((*plan.out_batch, plan.n_q))
    if v_shift:
        out = np.ldexp(out, v_shift)  # exact: |output| <= max |v|
    bad = np.isnan(lse) | np.isposinf(lse)
    if bad.any():  # not reachable by the bounds above: a last guard against a silent NaN
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise RangeError(
            f"lse: {lse[where]} at (*batch, query) index {where} from finite inputs: a value overflowed {dt} in the "
            f"tiled forward (max |q| {float(np.abs(plan.q).max()):.7g}, max |k| {float(np.abs(plan.k).max()):.7g}, "
            f"scale {plan.scale:.7g}, temperature {plan.temperature:.7g}). Fix: smaller inputs or float64 inputs"
        )
    if plan.masked_rows == "raise" and np.isneginf(lse).any():
        raise empty_rows_error(plan, lse, "forward")
    return to_caller(plan, out, name="output"), to_caller(plan, lse, plan.lse_dtype)
