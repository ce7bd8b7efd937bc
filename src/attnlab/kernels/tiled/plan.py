"""The tiled kernels' plan: validated inputs in the compute dtype, and the mask described block by block (which key
blocks a query block sees, each block's mask), shared by the forward and the backward.

Internal to :mod:`attnlab.kernels.tiled`: names here are public to the package's modules, not to users.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..._arrays import compute_dtype, device_of, index_tuples, namespace, shape_of, to_numpy
from ...core.inputs import CoreOptions, MaskedRows, check_policy, prepare
from ...errors import DTypeError, MaskedRowError, RangeError, ShapeError, masked_rows_error
from ...masks import BlockMask, MaskSpec
from ...validate import check_int
from ..config import KernelConfig
from ..config import current as current_config
from ..overflow import factor_overflow_error
from ..threads import resolve_threads
from .exponentials import Units
from .exponentials import units as make_units

__all__ = [
    "DEFAULT_BLOCK_K",
    "DEFAULT_BLOCK_Q",
    "Plan",
    "PositionMask",
    "TiledOptions",
    "apply_mask",
    "bad_array",
    "bias_block",
    "bias_into",
    "caller_index",
    "empty_rows_error",
    "forward_tasks",
    "make_plan",
    "options",
    "position_mask",
    "scratch",
    "to_caller",
    "to_logits",
    "zero_masked",
]

#: Default block sizes, measured with ``attnlab bench`` on the project's 2-core machines (docs/performance.md).
DEFAULT_BLOCK_Q = 512
#: The default key block size (see :data:`DEFAULT_BLOCK_Q`).
DEFAULT_BLOCK_K = 512


@dataclass(frozen=True)
class TiledOptions:
    """Every option of :func:`~attnlab.kernels.flash_attention` but the arrays, as one value: the forward builds it
    once (:func:`options`), its :class:`~attnlab.kernels.FlashResult` keeps it, and the backward plans from it
    (nothing repeated). ``mask`` is the :class:`~attnlab.masks.MaskSpec` that the forward's mask keywords build; the
    rest as the keywords of :func:`~attnlab.kernels.flash_attention`."""

    mask: MaskSpec = field(default_factory=MaskSpec)
    scale: float | None = None
    temperature: float = 1.0
    masked_rows: MaskedRows = "raise"
    block_q: int | None = None
    block_k: int | None = None
    num_threads: int | None = None

    @classmethod
    def of(cls, **keywords: Any) -> TiledOptions:
        """The options :func:`~attnlab.kernels.flash_attention` builds from these keywords (``causal=``,
        ``mask=``, ``scale=``, ``masked_rows=`` ...), checked as it checks them: with
        ``FlashResult(output, lse, inputs=(q, k, v, bias), options=TiledOptions.of(...))`` the tiled backward runs
        on an output and lse that came from elsewhere (another kernel's forward)."""
        return options(**keywords)


#: The keywords of :func:`~attnlab.kernels.flash_attention` that :meth:`MaskSpec.build` turns into the ``mask`` field.
_MASK_KEYWORDS = ("causal", "q_offset", "window", "key_lengths", "segments")


def options(mask: Any = None, **keywords: Any) -> TiledOptions:
    """:class:`TiledOptions` from :func:`~attnlab.kernels.flash_attention`'s keywords: ``mask`` (a boolean array or a
    :class:`~attnlab.masks.MaskSpec`) and the mask keywords (``causal``, ``q_offset``, ``window``, ``key_lengths``,
    ``segments``) build its ``mask``, the others are its fields. The keywords are listed once, in
    :func:`~attnlab.kernels.flash_attention`'s signature, whose defaults are :class:`TiledOptions`' and
    :class:`~attnlab.masks.MaskSpec`'s own."""
    parts = {name: keywords.pop(name) for name in _MASK_KEYWORDS if name in keywords}
    return TiledOptions(MaskSpec.build(mask, **parts), **keywords)


@dataclass(frozen=True)
class Plan:
    """Everything the forward and the backward run from, made once by :func:`make_plan`: the inputs in the compute
    dtype, their sizes, scale and temperature, the sized :class:`~attnlab.masks.MaskSpec` with the dense mask and
    bias, the block sizes and threads.

    Shapes:
        * ``q [*batch, n_q, d_k]``, ``k [*batch, n_k, d_k]``, ``v [*batch, n_k, d_v]``: broadcast views in the compute
          dtype; ``batch`` is the internal batch (GQA: ``[..., h_kv, group]``), ``out_batch`` the caller's;
        * ``mask``, ``bias`` ``[*batch, n_q, n_k]`` (broadcast views) or None.
    """

    q: np.ndarray  # [*batch, n_q, d_k] (a broadcast view), compute dtype
    k: np.ndarray  # [*batch, n_k, d_k]
    v: np.ndarray  # [*batch, n_k, d_v]
    k_raw: np.ndarray  # k, v as prepared (not broadcast)
    v_raw: np.ndarray
    caller_shapes: tuple[tuple[int, ...], ...]  # q, k, v as the caller passed them
    q_shape: tuple[int, ...]  # shapes of the (GQA-reshaped) inputs, for summing gradients back
    k_shape: tuple[int, ...]
    v_shape: tuple[int, ...]
    batch: tuple[int, ...]  # internal batch (GQA: [..., h_kv, group])
    out_batch: tuple[int, ...]  # the caller's batch (GQA: [..., h])
    group: int  # GQA group size (1 without GQA)
    seq_axis_split: bool  # GQA on 3-D inputs: the first caller axis is split into (h_kv, group)
    n_q: int
    n_k: int
    d_k: int
    d_v: int
    scale: float
    temperature: float  # logits are (scale · q · k) / temperature
    spec: MaskSpec  # the structure (causal, window, lengths, segments), sized; its dense part is ``mask``
    mask: np.ndarray | None  # broadcast view [*batch, n_q, n_k]
    bias: np.ndarray | None  # broadcast view [*batch, n_q, n_k], compute dtype
    bias_raw: np.ndarray | None  # the bias as prepared (GQA-reshaped, not broadcast)
    bias_shape: tuple[int, ...] | None  # the bias as the caller passed it
    masked_rows: str
    block_q: int
    block_k: int
    threads: int
    xp: Any
    device: Any
    out_dtype: Any
    lse_dtype: Any  # the compute dtype in the caller's library (float32 or float64)
    config: KernelConfig  # read once, on the calling thread (attnlab.kernels.config)

    @property
    def factor(self) -> float:
        """What multiplies ``q · k`` to give the logits: ``scale / temperature``."""
        return self.scale / self.temperature

    def units(self) -> Units:
        """How this plan's score blocks become logits and the exponential's argument (:class:`Units`)."""
        return make_units(self.q.dtype, self.factor, self.temperature, self.config)

    def seq(self, idx: tuple[int, ...]) -> int:
        """Which sequence (index along the caller's first leading axis) the internal batch index belongs to."""
        if not idx:
            return 0
        if self.seq_axis_split:
            return idx[0] * self.group + idx[1]
        return idx[0]

    def key_range(self, idx: tuple[int, ...], i0: int, i1: int) -> tuple[int, int]:
        """Keys ``[lo, hi)`` that query rows ``[i0, i1)`` may see at most (causal, window, key lengths)."""
        return self.spec.key_range(i0, i1, self.seq(idx))

    def query_range(self, idx: tuple[int, ...], j0: int, j1: int) -> tuple[int, int]:
        """Query rows ``[lo, hi)`` that may see some key of ``[j0, j1)`` (causal and window)."""
        return self.spec.query_range(j0, j1, self.seq(idx))

    def n_keys(self, idx: tuple[int, ...]) -> int:
        """The keys of batch element ``idx`` that are not padding (:meth:`attnlab.masks.MaskSpec.n_keys`)."""
        return self.spec.n_keys(self.seq(idx))

    def blocked(
        self, idx: tuple[int, ...], i0: int, i1: int, j0: int, j1: int
    ) -> np.ndarray | PositionMask | Literal[False] | None:
        """The block's mask ``[i1-i0, j1-j0]`` (:meth:`MaskSpec.blocked <attnlab.masks.MaskSpec.blocked>`): ``None``
        if nothing is blocked, ``False`` if everything is (skip the block), else a bool array True = *blocked*, or
        (causal/window alone) a cached :class:`PositionMask`. Apply it before ``exp2`` with :func:`apply_mask` or
        after it with :func:`zero_masked`."""
        b = self.spec.blocked(i0, i1, j0, j1, self.seq(idx), None if self.mask is None else self.mask[idx])
        if b is None or b is False:
            return b
        if b.position is not None:
            return position_mask(b, self.q.dtype.str)
        return b.blocked

    def key_blocks(self, idx: tuple[int, ...], i0: int, i1: int) -> Iterator[tuple[int, int, Any]]:
        """The key blocks ``(j0, j1, blocked)`` that query rows ``[i0, i1)`` of ``idx`` visit, in order; blocks
        where everything is blocked are skipped, ``blocked`` is as :meth:`blocked` returns."""
        lo, hi = self.key_range(idx, i0, i1)
        for j0 in range(lo, hi, self.block_k):
            j1 = min(j0 + self.block_k, hi)
            bad = self.blocked(idx, i0, i1, j0, j1)
            if bad is not False:
                yield j0, j1, bad


@dataclass(frozen=True)
class PositionMask:
    """A causal/window block mask in ``dtype`` as ``add`` (0 allowed, -inf blocked: adding it costs a fifth of a
    masked copy) and ``keep`` (1 allowed, 0 blocked: multiplies probabilities after ``exp2``), and as ``bad``
    (bool, True = blocked) for the fused passes."""

    add: np.ndarray
    keep: np.ndarray
    bad: np.ndarray


_position_masks: dict[tuple[Any, ...], PositionMask] = {}


def position_mask(block: BlockMask, dtype: str) -> PositionMask:
    """A causal/window :class:`~attnlab.masks.BlockMask` (``block.position`` set) as a :class:`PositionMask` in
    ``dtype``, cached by its pattern: every diagonal block of a call shares one."""
    key = (block.position, dtype)
    pm = _position_masks.get(key)
    if pm is None:
        bad = block.blocked
        add = np.where(bad, -np.inf, 0).astype(dtype)
        keep = np.where(bad, 0, 1).astype(dtype)
        add.flags.writeable = False
        keep.flags.writeable = False
        if len(_position_masks) >= 256:
            _position_masks.clear()
        pm = _position_masks[key] = PositionMask(add, keep, bad)
    return pm


def bad_array(bad: np.ndarray | PositionMask | None) -> np.ndarray | None:
    """A block mask as the fused passes take it: a bool array, True = blocked (or None)."""
    return bad.bad if isinstance(bad, PositionMask) else bad


def apply_mask(s: np.ndarray, bad: np.ndarray | PositionMask) -> None:
    """Set the blocked entries of the score block ``s`` to -inf, in place (before a max or ``exp2``)."""
    if isinstance(bad, PositionMask):
        s += bad.add
    else:
        np.copyto(s, -np.inf, where=bad)


def zero_masked(p: np.ndarray, bad: np.ndarray | PositionMask) -> None:
    """Set the blocked entries of the probability block ``p`` to 0, in place (after ``exp2``).

    Masking after the exponential keeps ``-inf`` out of ``exp2``: NumPy's vectorised ``exp2`` takes a slow
    scalar path for ``-inf`` and for results below the smallest normal number (measured: a half-masked 512×512
    block 6.5× slower, inputs near -130 ~90×), which made every causal diagonal block cost several blocks' time.
    """
    if isinstance(bad, PositionMask):
        p *= bad.keep
    else:
        np.copyto(p, 0, where=bad)


_local = threading.local()


def scratch(size: int, dtype: np.dtype, purpose: str = "scores") -> np.ndarray:
    """A flat buffer of at least ``size`` elements owned by the calling thread, one per ``purpose`` (kept between
    calls: a fresh half-megabyte block per task would cost page faults)."""
    if size > 1 << 22:  # more than 16 MiB of float32: not worth keeping
        return np.empty(size, dtype=dtype)
    key = (purpose, np.dtype(dtype).str)
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    buf = bufs.get(key)
    if buf is None or buf.size < size:
        buf = bufs[key] = np.empty(size, dtype=dtype)
    return buf


def bias_block(plan: Plan, idx: tuple[int, ...], i0: int, i1: int, j0: int, j1: int) -> np.ndarray | None:
    """The bias block ``[i1-i0, j1-j0]`` copied into this thread's buffer, or None without a bias. The fused pass
    reads a C-contiguous block at full SIMD width; a strided view (a slice, a broadcast) it reads element by
    element (per 512×512 block, ``benchmarks/bench_blocks.py --only blocks``: copy + fused pass 45–48 µs, the
    fused pass on the view 280–286 µs, NumPy's ``s += c · bias`` + the pass 70–79 µs)."""
    if plan.bias is None:
        return None
    src = plan.bias[idx][i0:i1, j0:j1]
    out = scratch(src.size, src.dtype, "bias")[: src.size].reshape(src.shape)
    np.copyto(out, src)
    return out


def _split_gqa(qs: tuple[int, ...], ks: tuple[int, ...], vs: tuple[int, ...]) -> int:
    """The GQA group size: q ``[..., h, n_q, d_k]`` with k, v ``[..., h_kv, n_k, d]`` and ``h % h_kv == 0``."""
    if len(qs) < 3 or len(ks) < 3 or len(vs) < 3:
        return 1
    h, hk, hv = qs[-3], ks[-3], vs[-3]
    if hk != hv:
        if 1 in (hk, hv):
            return 1  # a broadcast k or v: prepare() checks it
        raise ShapeError(f"v: {hv} kv heads (dim -3) do not match k's {hk} (q {qs}, k {ks}, v {vs})")
    if h == hk or hk == 1:
        return 1
    if h % hk:
        raise ShapeError(
            f"k: {hk} kv heads (dim -3) do not divide q's {h} heads; GQA needs h % h_kv == 0 (q {qs}, k {ks}, v {vs})"
        )
    return h // hk


def _library(x: Any) -> str:
    """The array library ``x`` belongs to: ``"numpy"`` for NumPy arrays, scalars and lists, else its top module."""
    if isinstance(x, (np.ndarray, np.generic, list, tuple, int, float, bool)):
        return "numpy"
    return type(x).__module__.split(".")[0]


def _check_libraries(q: Any, k: Any, v: Any, mask: Any, bias: Any) -> None:
    """q, k and v come from one library; mask and bias from that library or NumPy (a :class:`DTypeError` if not)."""
    libs = {name: _library(x) for name, x in (("q", q), ("k", k), ("v", v))}
    main = libs["q"]
    for name, x in (("k", k), ("v", v), ("mask", mask), ("bias", bias)):
        if x is None:
            continue
        lib = libs.get(name) or _library(x)
        if lib != main and (name in ("k", "v") or lib != "numpy"):
            raise DTypeError(
                f"{name}: a {type(x).__module__}.{type(x).__name__} with q a {type(q).__module__}.{type(q).__name__}; "
                f"q, k and v must come from one array library (mask and bias from it or NumPy): convert first, "
                f"for example torch.as_tensor(x) or x.numpy()"
            )


def _check_factors(scale: float, temperature: float, has_bias: bool, dtype: np.dtype) -> None:
    """The logits' factors must be finite: ``scale / temperature`` in float64 (only a power of two of it is folded
    into Q, exactly, so it may exceed float32's range), ``1 / temperature`` in the compute dtype with a bias."""
    factor = scale / temperature
    if not math.isfinite(factor):
        raise factor_overflow_error("scale / temperature", factor, "float64", scale=scale, temperature=temperature)
    if has_bias and not 2.0 / temperature <= float(np.finfo(dtype).max):
        raise factor_overflow_error(
            "1 / temperature", 1.0 / temperature, str(dtype), scale=scale, temperature=temperature
        )


@dataclass(frozen=True)
class _Arrays:
    """The caller's arrays as NumPy arrays, and what the results go back as."""

    q: Any
    k: Any
    v: Any
    mask: Any
    bias: Any
    xp: Any
    device: Any
    out_dtype: Any  # None for NumPy inputs (then the core's choice)
    lse_dtype: Any


def _caller_arrays(q: Any, k: Any, v: Any, mask: Any, bias: Any) -> _Arrays:
    """Lists become NumPy arrays; arrays of another library are read into NumPy (their dtypes remembered)."""
    q, k, v, mask, bias = (np.asarray(x) if isinstance(x, (list, tuple)) else x for x in (q, k, v, mask, bias))
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape"):
            raise DTypeError(f"{name}: expected an array, got {type(x).__name__}")
    _check_libraries(q, k, v, mask, bias)
    xp = namespace(q, k, v)
    if xp is np:
        return _Arrays(q, k, v, mask, bias, xp, None, None, None)
    device = device_of(q)
    lse_dtype, out_dtype = compute_dtype(xp, xp.result_type(q.dtype, k.dtype, v.dtype), "q, k, v")
    mask, bias = (x if x is None or isinstance(x, np.ndarray) else to_numpy(x) for x in (mask, bias))
    return _Arrays(to_numpy(q), to_numpy(k), to_numpy(v), mask, bias, xp, device, out_dtype, lse_dtype)


def _group_heads(a: _Arrays, group: int) -> tuple[_Arrays, bool]:
    """GQA: q ``[..., h, n_q, d_k]`` as ``[..., h_kv, group, n_q, d_k]``, k and v ``[..., h_kv, 1, n_k, d]``, a
    per-head mask or bias split the same way; and whether the caller's first axis was split (3-D inputs)."""
    if group == 1:
        return a, False
    qs = shape_of(a.q)
    hk = shape_of(a.k)[-3]
    q = a.q.reshape((*qs[:-3], hk, group, *qs[-2:]))
    k, v = a.k[..., None, :, :], a.v[..., None, :, :]  # [..., h_kv, 1, n_k, d]
    mask, bias = a.mask, a.bias
    if mask is not None and mask.dtype == np.bool_ and mask.ndim >= 3:  # a non-bool mask: prepare() explains
        if mask.shape[-3] == qs[-3]:
            mask = mask.reshape((*mask.shape[:-3], hk, group, *mask.shape[-2:]))
        else:
            mask = mask[..., None, :, :]
    if bias is not None and bias.ndim >= 3:
        if bias.shape[-3] == qs[-3]:
            bias = bias.reshape((*bias.shape[:-3], hk, group, *bias.shape[-2:]))
        else:
            bias = bias[..., None, :, :]
    return dataclasses.replace(a, q=q, k=k, v=v, mask=mask, bias=bias), len(qs) == 3


def make_plan(q: Any, k: Any, v: Any, bias: Any, options: TiledOptions) -> Plan:
    """Validate ``q, k, v, bias`` and ``options`` (shapes as in :func:`~attnlab.kernels.flash_attention`) into the
    :class:`Plan` the forward and the backward run from."""
    o = options
    bias_shape = None if bias is None else shape_of(np.asarray(bias) if isinstance(bias, (list, tuple)) else bias)
    a = _caller_arrays(q, k, v, o.mask.dense, bias)
    qs, ks, vs = shape_of(a.q), shape_of(a.k), shape_of(a.v)
    block_q = check_int("block_q", DEFAULT_BLOCK_Q if o.block_q is None else o.block_q, minimum=1)
    block_k = check_int("block_k", DEFAULT_BLOCK_K if o.block_k is None else o.block_k, minimum=1)
    threads = resolve_threads(o.num_threads)
    check_policy(o.masked_rows)
    group = _split_gqa(qs, ks, vs) if all(len(s) >= 2 for s in (qs, ks, vs)) else 1
    a, seq_axis_split = _group_heads(a, group)
    p = prepare(
        a.q, a.k, a.v, a.mask, a.bias, CoreOptions(scale=o.scale, temperature=o.temperature, masked_rows=o.masked_rows)
    )
    n_q, n_k, batch = p.n_q, p.n_k, p.batch
    _check_factors(p.scale, p.temperature, p.bias is not None, p.q.dtype)
    out_batch = (*batch[:-2], batch[-2] * group) if group > 1 else batch
    spec = dataclasses.replace(o.mask, dense=None).sized(n_q, n_k, out_batch[0] if out_batch else 1)
    return Plan(
        q=np.broadcast_to(p.q, (*batch, n_q, p.d_k)),
        k=np.broadcast_to(p.k, (*batch, n_k, p.d_k)),
        v=np.broadcast_to(p.v, (*batch, n_k, p.d_v)),
        k_raw=p.k,
        v_raw=p.v,
        caller_shapes=(qs, ks, vs),
        q_shape=shape_of(p.q),
        k_shape=shape_of(p.k),
        v_shape=shape_of(p.v),
        batch=batch,
        out_batch=out_batch,
        group=group,
        seq_axis_split=seq_axis_split,
        n_q=n_q,
        n_k=n_k,
        d_k=p.d_k,
        d_v=p.d_v,
        scale=p.scale,
        temperature=p.temperature,
        spec=spec,
        mask=None if p.mask is None else np.broadcast_to(np.asarray(p.mask), p.scores_shape),
        bias=None if p.bias is None else np.broadcast_to(p.bias, p.scores_shape),
        bias_raw=p.bias,
        bias_shape=bias_shape,
        masked_rows=p.masked_rows,
        block_q=min(block_q, n_q),  # a block never outgrows its sequence (nor its memory)
        block_k=min(block_k, n_k),
        threads=threads,
        xp=a.xp,
        device=a.device,
        out_dtype=p.out_dtype if a.xp is np else a.out_dtype,
        lse_dtype=p.q.dtype if a.xp is np else a.lse_dtype,
        config=current_config(),
    )


def to_caller(plan: Plan, x: np.ndarray, dtype: Any = None, *, name: str | None = None) -> Any:
    """``x`` in the caller's library (and ``dtype``, default the output dtype). Cast to a narrower dtype (float16,
    bfloat16), a finite value that does not fit is a :class:`~attnlab.errors.RangeError` naming ``name``."""
    dtype = plan.out_dtype if dtype is None else dtype
    xp = plan.xp
    with np.errstate(over="ignore" if name is not None else "warn"):  # a named cast is checked just below
        y = x.astype(dtype, copy=False) if xp is np else xp.astype(xp.asarray(x, device=plan.device), dtype)
    if name is not None and y.dtype != x.dtype:
        lost = ~np.isfinite(to_numpy(y)) & np.isfinite(x)
        if lost.any():
            where = tuple(int(i) for i in np.argwhere(lost)[0])
            shown = str(dtype).replace("torch.", "")
            raise RangeError(
                f"{name}: {float(x[where]):.7g} at index {where} does not fit in {shown} (largest finite "
                f"{float(xp.finfo(dtype).max):.7g}), the inputs' dtype it is returned in; pass float32 inputs "
                f"(then the result is float32) or scale {'v' if name == 'output' else 'v or d_out'} down"
            )
    return y


def empty_rows_error(plan: Plan, lse: np.ndarray, what: str) -> MaskedRowError:
    """The core's error for fully masked rows, with indices in the caller's (batch, query) layout."""
    empty = np.isneginf(lse).reshape((*plan.out_batch, plan.n_q))
    return masked_rows_error(index_tuples(empty), (*plan.out_batch, plan.n_q, plan.n_k), nan=what == "forward")


def bias_into(plan: Plan, idx: tuple[int, ...], i0: int, j0: int, s: np.ndarray, c: Any) -> None:
    """``s += c · bias block`` in place, if there is a bias (the NumPy passes)."""
    if plan.bias is not None:
        s += plan.bias[idx][i0 : i0 + s.shape[0], j0 : j0 + s.shape[1]] * c


def to_logits(plan: Plan, u: Units, idx: tuple[int, ...], i0: int, j0: int, s: np.ndarray) -> None:
    """``s <- fl(R · s) + c_bias · bias block`` in place (the NumPy passes; ``s`` the product of the folded Q)."""
    if u.R != 1:
        s *= u.R
    bias_into(plan, idx, i0, j0, s, u.c_bias)


def caller_index(plan: Plan, idx: tuple[int, ...]) -> tuple[int, ...]:
    """An internal batch index (GQA: ``(..., kv head, group member)``) in the caller's layout (``(..., head)``)."""
    if plan.group > 1:
        return (*idx[:-2], idx[-2] * plan.group + idx[-1])
    return idx


def forward_tasks(plan: Plan) -> list[tuple[tuple[int, ...], int, int]]:
    """The forward's work items ``(batch index, i0, i1)``: one per batch element and query block, the most
    expensive (most keys to visit) first, so that threads given the cheap ones last fill the gaps."""
    tasks = []
    for idx in np.ndindex(*plan.batch):
        for i0 in range(0, plan.n_q, plan.block_q):
            i1 = min(i0 + plan.block_q, plan.n_q)
            lo, hi = plan.key_range(idx, i0, i1)
            tasks.append((max(0, hi - lo), (idx, i0, i1)))
    tasks.sort(key=lambda t: -t[0])  # the most expensive first, so the cheap ones fill the gaps
    return [t for _, t in tasks]
