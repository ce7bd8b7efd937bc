"""Tiled online-softmax attention (FlashAttention's algorithm on the CPU), exact and in O(n) extra memory.

The forward never holds an ``[n_q, n_k]`` matrix: the queries are cut into blocks of ``block_q`` rows and the keys
into blocks of ``block_k`` columns. For each query block it keeps, per row, a running maximum ``m_i``, a running
sum ``l_i`` of ``exp(s - m_i)`` and an accumulator ``acc`` of ``exp(s - m_i) V``; each key block updates them::

    S      = (scale · Q_i) K_jᵀ  (+ bias, / temperature)  # [block_q, block_k], masked entries -> -inf
    m_new  = max(m_i, rowmax(S))
    P      = exp(S - m_new)
    l_i    = exp(m_i - m_new) · l_i + rowsum(P)
    acc    = exp(m_i - m_new) · acc + P V_j
    ...
    out    = acc / l_i,   lse = m_i + log(l_i)

This is exact: only the order of the additions differs from the dense computation. Some refinements make it
fast in NumPy, where every element-wise pass over a score block costs about a sixth of its two matrix products:

* scores are rounded exactly as the naive computation rounds them (see :class:`_Units`): only a power of two of
  ``scale / temperature`` is folded into Q (exact), the rest multiplies the product, the running maximum is
  subtracted in nats, and only then is the difference converted for ``exp2`` (about 0.6× the cost of ``exp``) —
  unless ``exp`` measured faster in this process (see :func:`exponential`: NumPy's ``exp2`` is sometimes ~3.5×
  slower for a whole process). Folding all of the factor into Q, in log2 units, cost up to 18× the naive float32
  error at |logits| ~ 1e3-1e4 (issue 12); with numba, the multiplication, the offset and ``exp2`` are one fused pass;
* the row sums of ``P`` come from a matrix-vector product ``P 1`` (a fifth of ``P.sum(axis=1)``, and cheaper than
  a column of ones on ``V``, which makes the second product's width odd);
* when the scores of a query block are bounded (``|scale · q_i · k_j| <= ||scale · q_i|| · max_j ||k_j||``, by
  Cauchy-Schwarz, is small enough that ``exp`` can neither overflow nor lose precision, which holds for typical
  activations), no running maximum is needed at all: each key block is one product, one in-place ``exp2``, one
  product and the matrix-vector product; a masked block is masked *after* ``exp2`` (multiplied by 0/1), because
  NumPy's ``exp2`` takes a scalar slow path on ``-inf`` (measured 6× slower per block). Otherwise the online
  softmax above runs; once every row has a finite ``m_i`` it skips the row-maximum pass and exponentiates
  ``S - m_i`` directly, and a block whose row sums grow past ``2**40`` (``2**200`` in float64) is recomputed
  with the maximum pass. (``m_i`` is always the maximum of scores already seen, so nothing underflows that the
  dense computation would keep.)
* each worker thread keeps its buffers (score block, accumulators) between tasks and calls.

Masks are applied block by block (causal with either alignment or an explicit query offset, sliding windows, key
padding by lengths, packed segments, arbitrary boolean masks); a key block that a query block may not see at all is
skipped, not computed, and one it sees entirely is not masked. An additive ``bias`` is read block by block too (its
largest magnitude joins the bound of the fast path), and ``temperature`` divides the logits, as in the core. The
backward is FlashAttention-2's: recompute ``P`` from the saved ``lse``, ``delta = rowsum(dO ∘ O)``,
``dS = P ∘ (dP - delta)``; on PyTorch tensors that require grad, :func:`flash_attention` runs inside a
``torch.autograd.Function`` whose backward it is (:mod:`attnlab.kernels.autograd`).

Finite inputs whose logits overflow the compute dtype raise :class:`~attnlab.errors.RangeError` (what overflowed,
where, the fix), never NaN: when the Cauchy-Schwarz bound of a query block cannot rule it out (it can for any
realistic input, at no cost), that block's logits are checked for infinities as they are computed. Values of V near
the dtype's limit are divided by a power of two first, so that the unnormalised sums cannot overflow either.

Work is split into tasks (batch·heads × query blocks forward, batch·heads × key blocks backward) run on the cores
by :mod:`attnlab.kernels.threads`, with BLAS pinned to one thread per worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._arrays import compute_dtype, device_of, index_tuples, namespace, shape_of, to_numpy
from ..core.inputs import Causal, MaskedRows, check_finite, check_policy, prepare
from ..errors import DTypeError, MaskedRowError, MaskError, RangeError, ShapeError, masked_rows_error
from ..masks import causal_alignment_message
from ..validate import check_int
from . import autograd, fused
from .config import KernelConfig
from .config import current as current_config
from .overflow import factor_overflow_error, gradient_overflow_error, logits_overflow_error
from .threads import resolve_threads, run_tasks

__all__ = [
    "DEFAULT_BLOCK_K",
    "DEFAULT_BLOCK_Q",
    "Exponential",
    "FlashGrads",
    "FlashResult",
    "exponential",
    "flash_attention",
    "flash_attention_backward",
    "gemm_floor",
]

#: Default block sizes, measured with ``attnlab bench`` on the project's 2-core machines (docs/performance.md).
DEFAULT_BLOCK_Q = 512
DEFAULT_BLOCK_K = 512

_LOG2E = 1.0 / math.log(2.0)
_THRESHOLD = {np.dtype(np.float32): 2.0**40, np.dtype(np.float64): 2.0**200}


@dataclass(frozen=True)
class _Exp:
    """The exponential the kernels use: logits are in nats, and ``exp(x) = fn(pre · x)`` (``exp2`` with ``pre =
    log2(e)``, or ``exp`` with ``pre = 1``), the offset subtracted before ``pre`` multiplies (see :class:`_Units`).
    With ``fused``, score blocks go through :mod:`attnlab.kernels.fused` (exponential, mask and row sums in one
    compiled pass)."""

    name: str
    fn: Any
    pre: float
    fused: bool = False


_EXPS = {
    "fused": _Exp("fused", np.exp2, _LOG2E, fused=True),
    "exp2": _Exp("exp2", np.exp2, _LOG2E),
    "exp": _Exp("exp", np.exp, 1.0),
}
_exp_choice: dict[str, _Exp] = {}


def _exp(dtype: np.dtype, cfg: KernelConfig) -> _Exp:
    """How score blocks are exponentiated, chosen once per process and dtype (unless ``cfg.exp`` forces it; see
    :mod:`attnlab.kernels.config`).

    float32 with numba installed: the fused compiled passes (:mod:`attnlab.kernels.fused`, ~2× faster than
    NumPy's ``exp2`` plus a row sum). Otherwise ``exp2`` (in log2 units) or ``exp`` (in nats), whichever
    measures faster on a 128 KiB block: NumPy's vectorised float32 ``exp2`` usually costs ~0.5× ``exp`` on the
    project's machines, but in roughly a third of processes it runs ~4× slower than usual (~2× ``exp``) for
    the whole life of the process (it depends on the address-space layout: never seen with ASLR disabled).
    Measuring takes ~0.3 ms once; all choices are exact to about one float32 ulp.
    """
    fusable = np.dtype(dtype) == np.float32 and cfg.use_numba and fused.usable()
    if cfg.exp != "auto":
        return _EXPS[cfg.exp if cfg.exp != "fused" or fusable else "exp2"]
    if fusable:
        return _EXPS["fused"]
    key = np.dtype(dtype).str
    choice = _exp_choice.get(key)
    if choice is None:
        x = np.linspace(-20.0, 20.0, 1 << 15, dtype=dtype)
        buf = np.empty_like(x)
        numpy_exps = {name: e for name, e in _EXPS.items() if not e.fused}
        best = {name: math.inf for name in numpy_exps}
        for _ in range(5):
            for name, e in numpy_exps.items():
                t = time.perf_counter()
                e.fn(x, out=buf)
                best[name] = min(best[name], time.perf_counter() - t)
        choice = _exp_choice[key] = _EXPS[min(best, key=best.__getitem__)]
    return choice


@dataclass(frozen=True)
class Exponential:
    """Which exponential the tiled kernels use for one dtype on this machine, and why (see :func:`exponential`).

    Attributes:
        name: ``"fused"`` (numba's compiled pass: scale, offset, ``exp2``, mask and row sums in one pass),
            ``"exp2"`` (NumPy's ``exp2`` in log2 units) or ``"exp"`` (NumPy's ``exp`` in nats).
        dtype: the compute dtype, ``"float32"`` or ``"float64"``.
        reason: one line: why this one.
    """

    name: str
    dtype: str
    reason: str

    @property
    def fused(self) -> bool:
        """True for numba's fused passes."""
        return self.name == "fused"


def exponential(dtype: Any = "float32") -> Exponential:
    """The exponential the tiled kernels use for score blocks of ``dtype`` (float32 or float64) in this process, and
    why: numba's fused passes for float32 when numba is installed and loads, otherwise NumPy's ``exp2`` or ``exp``,
    whichever measured faster on the first call (NumPy's float32 ``exp2`` is usually ~0.5x ``exp`` but in some
    processes ~2x; all are exact to about one float32 ulp). ``attnlab bench`` prints it.

    >>> exponential("float64").name in ("exp2", "exp")
    True
    """
    dt = np.dtype(dtype)
    if dt not in (np.float32, np.float64):
        raise DTypeError(f"dtype: expected float32 or float64 (the kernels' compute dtypes), got {dt}")
    cfg = current_config()
    e = _exp(dt, cfg)
    if cfg.exp != "auto":
        why = f"forced by attnlab.kernels.config.override(exp={cfg.exp!r})"
        if cfg.exp != e.name:
            why += f"; {e.name} instead, as fused needs float32 and numba"
    elif e.fused:
        why = f"float32 with numba {fused.version()}: scale, offset, exp2, mask and row sums in one compiled pass"
    else:
        if dt != np.float32:
            without = "the fused passes are float32 only"
        elif not cfg.use_numba:
            without = "numba turned off by attnlab.kernels.config.override(use_numba=False)"
        elif not fused.AVAILABLE:
            without = "no numba: pip install 'attnlab[fast]' for the fused passes"
        else:
            without = "numba is installed but does not load"
        other = "exp" if e.name == "exp2" else "exp2"
        why = f"measured faster than np.{other} in this process; {without}"
    return Exponential(e.name, dt.name, why)


@dataclass(frozen=True)
class FlashResult:
    """The tiled forward's result.

    Shapes: ``output [..., n_q, d_v]`` (the caller's library and dtype), ``lse [..., n_q]`` (the caller's library,
    compute dtype: float32 or float64): the row log-sum-exp of the logits ``Q Kᵀ · scale / temperature`` with masked
    entries left out (the core's ``AttentionTrace.lse``), ``-inf`` on fully masked rows.
    """

    output: Any
    lse: Any


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


# --------------------------------------------------------------------------------------------------------------
# the plan: validated inputs and the mask, described block by block


@dataclass(frozen=True)
class _Plan:
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
    causal: bool
    shift: int  # position of query 0 relative to key 0 (query i sits at key position i + shift)
    left: int | None
    right: int | None
    key_lengths: np.ndarray | None  # [B] or None
    q_seg: np.ndarray | None  # [B or 1, n_q]
    k_seg: np.ndarray | None  # [B or 1, n_k]
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

    def seq(self, idx: tuple[int, ...]) -> int:
        """Which sequence (index along the caller's first leading axis) the internal batch index belongs to."""
        if not idx:
            return 0
        if self.seq_axis_split:
            return idx[0] * self.group + idx[1]
        return idx[0]

    def key_range(self, idx: tuple[int, ...], i0: int, i1: int) -> tuple[int, int]:
        """Keys ``[lo, hi)`` that query rows ``[i0, i1)`` may see at most (causal, window, key lengths)."""
        lo, hi = 0, self.n_k
        if self.causal:
            hi = min(hi, i1 + self.shift)
        if self.right is not None:
            hi = min(hi, i1 + self.shift + self.right)
        if self.left is not None:
            lo = max(lo, i0 + self.shift - self.left)
        if self.key_lengths is not None:
            kl = self.key_lengths
            hi = min(hi, int(kl[self.seq(idx)] if kl.shape[0] > 1 else kl[0]))
        return lo, hi

    def query_range(self, idx: tuple[int, ...], j0: int, j1: int) -> tuple[int, int]:
        """Query rows ``[lo, hi)`` that may see some key of ``[j0, j1)`` (causal and window only)."""
        lo, hi = 0, self.n_q
        if self.causal:
            lo = max(lo, j0 - self.shift)
        if self.right is not None:
            lo = max(lo, j0 - self.shift - self.right)
        if self.left is not None:
            hi = min(hi, j1 + self.left - self.shift)
        return lo, hi

    def n_keys(self, idx: tuple[int, ...]) -> int:
        if self.key_lengths is None:
            return self.n_k
        kl = self.key_lengths
        return int(kl[self.seq(idx)] if kl.shape[0] > 1 else kl[0])

    def blocked(self, idx: tuple[int, ...], i0: int, i1: int, j0: int, j1: int) -> np.ndarray | bool | None:
        """The block's mask ``[i1-i0, j1-j0]``: ``None`` if nothing is blocked, ``False`` if everything is (skip
        the block), else a bool array True = *blocked*, or (causal/window alone) a cached :class:`_PositionMask`.
        Apply it before ``exp2`` with :func:`_apply_mask` or after it with :func:`_zero_masked`."""
        parts: list[np.ndarray] = []
        # positions: rel = key position - query position
        need_rel = (
            (self.causal and j1 - 1 > i0 + self.shift)
            or (self.right is not None and j1 - 1 > i0 + self.shift + self.right)
            or (self.left is not None and j0 < i1 - 1 + self.shift - self.left)
        )
        if need_rel:
            parts.append(_position_block(i1 - i0, j1 - j0, j0 - i0 - self.shift, self.causal, self.left, self.right))
        if self.q_seg is not None:
            b = self.seq(idx) if self.q_seg.shape[0] > 1 else 0
            qs = self.q_seg[b, i0:i1]
            ks = self.k_seg[b, j0:j1]
            qmin, qmax, kmin, kmax = qs.min(), qs.max(), ks.min(), ks.max()
            if qmax < kmin or kmax < qmin:
                return False
            if not (qmin == qmax == kmin == kmax):
                parts.append(qs[:, None] != ks[None, :])
        if self.mask is not None:
            m = self.mask[idx][i0:i1, j0:j1]
            if not m.all():
                if not m.any():
                    return False
                parts.append(~m)
        if not parts:
            return None
        if len(parts) == 1 and need_rel:
            key = (i1 - i0, j1 - j0, j0 - i0 - self.shift, self.causal, self.left, self.right)
            if _position_all(*key):
                return False
            return _position_mask(*key, self.q.dtype.str)
        bad = parts[0]
        for p in parts[1:]:
            bad = bad | p
        if bad.all():
            return False
        return bad

    def key_blocks(self, idx: tuple[int, ...], i0: int, i1: int) -> Iterator[tuple[int, int, Any]]:
        lo, hi = self.key_range(idx, i0, i1)
        for j0 in range(lo, hi, self.block_k):
            j1 = min(j0 + self.block_k, hi)
            bad = self.blocked(idx, i0, i1, j0, j1)
            if bad is not False:
                yield j0, j1, bad


@functools.lru_cache(maxsize=256)
def _position_block(bq: int, bk: int, offset: int, causal: bool, left: int | None, right: int | None) -> np.ndarray:
    """True = blocked ``[bq, bk]`` for the causal/window constraints, where ``offset`` is the block's first key
    position minus its first query position. Cached: every diagonal block of a call has the same pattern."""
    rel = np.arange(bk)[None, :] + offset - np.arange(bq)[:, None]  # key position - query position
    bad = np.zeros(rel.shape, dtype=bool)
    if causal:
        bad |= rel > 0
    if right is not None:
        bad |= rel > right
    if left is not None:
        bad |= rel < -left
    bad.flags.writeable = False
    return bad


@functools.lru_cache(maxsize=256)
def _position_all(bq: int, bk: int, offset: int, causal: bool, left: int | None, right: int | None) -> bool:
    return bool(_position_block(bq, bk, offset, causal, left, right).all())


@dataclass(frozen=True)
class _PositionMask:
    """A causal/window block mask in ``dtype`` as ``add`` (0 allowed, -inf blocked: adding it costs a fifth of a
    masked copy) and ``keep`` (1 allowed, 0 blocked: multiplies probabilities after ``exp2``), and as ``bad``
    (bool, True = blocked) for the fused passes."""

    add: np.ndarray
    keep: np.ndarray
    bad: np.ndarray


@functools.lru_cache(maxsize=256)
def _position_mask(
    bq: int, bk: int, offset: int, causal: bool, left: int | None, right: int | None, dtype: str
) -> _PositionMask:
    """:func:`_position_block` as a cached :class:`_PositionMask` in ``dtype``."""
    bad = _position_block(bq, bk, offset, causal, left, right)
    add = np.where(bad, -np.inf, 0).astype(dtype)
    keep = np.where(bad, 0, 1).astype(dtype)
    add.flags.writeable = False
    keep.flags.writeable = False
    return _PositionMask(add, keep, bad)


def _bad_array(bad: np.ndarray | _PositionMask | None) -> np.ndarray | None:
    """A block mask as the fused passes take it: a bool array, True = blocked (or None)."""
    return bad.bad if isinstance(bad, _PositionMask) else bad


def _apply_mask(s: np.ndarray, bad: np.ndarray | _PositionMask) -> None:
    """Set the blocked entries of the score block ``s`` to -inf, in place (before a max or ``exp2``)."""
    if isinstance(bad, _PositionMask):
        s += bad.add
    else:
        np.copyto(s, -np.inf, where=bad)


def _zero_masked(p: np.ndarray, bad: np.ndarray | _PositionMask) -> None:
    """Set the blocked entries of the probability block ``p`` to 0, in place (after ``exp2``).

    Masking after the exponential keeps ``-inf`` out of ``exp2``: NumPy's vectorised ``exp2`` takes a slow
    scalar path for ``-inf`` and for results below the smallest normal number (measured: a half-masked 512×512
    block 6.5× slower, inputs near -130 ~90×), which made every causal diagonal block cost several blocks' time.
    """
    if isinstance(bad, _PositionMask):
        p *= bad.keep
    else:
        np.copyto(p, 0, where=bad)


_local = threading.local()


def _scratch(size: int, dtype: np.dtype, purpose: str = "scores") -> np.ndarray:
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


def _bias_block(plan: _Plan, idx: tuple[int, ...], i0: int, i1: int, j0: int, j1: int) -> np.ndarray | None:
    """The bias block ``[i1-i0, j1-j0]`` copied into this thread's buffer, or None without a bias. The fused pass
    reads a C-contiguous block at full SIMD width; a strided view (a slice, a broadcast) it reads element by
    element (per 512×512 block, ``benchmarks/bench_blocks.py --only blocks``: copy + fused pass 45–48 µs, the
    fused pass on the view 280–286 µs, NumPy's ``s += c · bias`` + the pass 70–79 µs)."""
    if plan.bias is None:
        return None
    src = plan.bias[idx][i0:i1, j0:j1]
    out = _scratch(src.size, src.dtype, "bias")[: src.size].reshape(src.shape)
    np.copyto(out, src)
    return out


def _check_window(window: Any) -> tuple[int | None, int | None] | None:
    """``None``; an int ``w`` (keys up to ``w`` positions back, none ahead); or ``(left, right)``, None = unbounded."""
    if window is None:
        return None
    if isinstance(window, (int, np.integer)) and not isinstance(window, bool):
        pair = (int(window), 0)
    elif isinstance(window, (tuple, list)) and len(window) == 2:
        pair = tuple(window)
    else:
        raise MaskError(f"window: expected None, an int >= 0 or a (left, right) pair, got {window!r}")
    for name, w in zip(("window left", "window right"), pair, strict=True):
        if w is not None and (isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 0):
            raise MaskError(f"{name}: expected None or an int >= 0, got {w!r} (window={window!r})")
    return (None if pair[0] is None else int(pair[0]), None if pair[1] is None else int(pair[1]))


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


def _lengths_array(key_lengths: Any, n_k: int, first_axis: int) -> np.ndarray:
    kl = to_numpy(key_lengths)
    if kl.ndim == 0:
        kl = kl.reshape(1)
    if kl.ndim != 1 or not (np.issubdtype(kl.dtype, np.integer)):
        raise ShapeError(f"key_lengths: expected a 1-D integer array [B], got shape {kl.shape} dtype {kl.dtype}")
    if kl.shape[0] not in (1, first_axis):
        raise ShapeError(
            f"key_lengths: {kl.shape[0]} entries, expected one per sequence (B={first_axis}, the first leading "
            f"axis of q) or a single one"
        )
    bad = np.flatnonzero((kl < 0) | (kl > n_k))
    if bad.size:
        raise ShapeError(f"key_lengths: entry {bad[0]} is {kl[bad[0]]}; expected 0 <= length <= n_k={n_k}")
    return kl.astype(np.int64)


def _segments_arrays(segments: Any, n_q: int, n_k: int, first_axis: int) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(segments, tuple) and len(segments) == 2:
        qs, ks = to_numpy(segments[0]), to_numpy(segments[1])
    else:
        qs = ks = to_numpy(segments)
    out = []
    for name, s, n in (("q_segments", qs, n_q), ("k_segments", ks, n_k)):
        if s.ndim == 1:
            s = s[None, :]
        if s.ndim != 2 or not np.issubdtype(s.dtype, np.integer):
            raise ShapeError(
                f"segments: {name} must be integer ids [n] or [B, n], got shape {s.shape} dtype {s.dtype} "
                f"(pass one array for self-attention or a (q_segments, k_segments) pair)"
            )
        if s.shape[1] != n:
            raise ShapeError(f"segments: {name} has {s.shape[1]} ids, expected {n} (shape {s.shape})")
        if s.shape[0] not in (1, first_axis):
            raise ShapeError(f"segments: {name} has {s.shape[0]} rows, expected 1 or one per sequence (B={first_axis})")
        out.append(s)
    qa, ka = out
    if qa.shape[0] != ka.shape[0]:
        b = max(qa.shape[0], ka.shape[0])
        qa, ka = np.broadcast_to(qa, (b, n_q)), np.broadcast_to(ka, (b, n_k))
    return qa, ka


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


def _plan(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: Any,
    q_offset: Any,
    window: Any,
    key_lengths: Any,
    segments: Any,
    mask: Any,
    bias: Any,
    scale: Any,
    temperature: Any,
    masked_rows: Any,
    block_q: Any,
    block_k: Any,
    num_threads: Any,
) -> _Plan:
    if isinstance(q, (list, tuple)):
        q = np.asarray(q)
    if isinstance(k, (list, tuple)):
        k = np.asarray(k)
    if isinstance(v, (list, tuple)):
        v = np.asarray(v)
    if isinstance(mask, (list, tuple)):
        mask = np.asarray(mask)
    if isinstance(bias, (list, tuple)):
        bias = np.asarray(bias)
    bias_shape = None if bias is None else shape_of(bias)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape"):
            raise DTypeError(f"{name}: expected an array, got {type(x).__name__}")
    _check_libraries(q, k, v, mask, bias)
    xp = namespace(q, k, v)
    device = device_of(q) if xp is not np else None
    qs, ks, vs = shape_of(q), shape_of(k), shape_of(v)
    out_dtype = lse_dtype = None
    if xp is not np:
        lse_dtype, out_dtype = compute_dtype(xp, xp.result_type(q.dtype, k.dtype, v.dtype), "q, k, v")
        q, k, v = to_numpy(q), to_numpy(k), to_numpy(v)
        if mask is not None and not isinstance(mask, np.ndarray):
            mask = to_numpy(mask)
        if bias is not None and not isinstance(bias, np.ndarray):
            bias = to_numpy(bias)
    block_q = check_int("block_q", DEFAULT_BLOCK_Q if block_q is None else block_q, minimum=1)
    block_k = check_int("block_k", DEFAULT_BLOCK_K if block_k is None else block_k, minimum=1)
    threads = resolve_threads(num_threads)
    win = _check_window(window)
    check_policy(masked_rows)

    group = 1
    if all(len(s) >= 2 for s in (qs, ks, vs)):
        group = _split_gqa(qs, ks, vs)
    seq_axis_split = False
    if group > 1:
        hk = ks[-3]
        q = q.reshape((*qs[:-3], hk, group, *qs[-2:]))
        k = k[..., None, :, :]  # [..., h_kv, 1, n_k, d_k]
        v = v[..., None, :, :]
        seq_axis_split = len(qs) == 3
        if mask is not None:
            if mask.dtype != np.bool_:
                pass  # prepare() explains
            elif mask.ndim >= 3 and mask.shape[-3] == qs[-3]:
                mask = mask.reshape((*mask.shape[:-3], hk, group, *mask.shape[-2:]))
            elif mask.ndim >= 3:
                mask = mask[..., None, :, :]
        if bias is not None and bias.ndim >= 3:
            if bias.shape[-3] == qs[-3]:
                bias = bias.reshape((*bias.shape[:-3], hk, group, *bias.shape[-2:]))
            else:
                bias = bias[..., None, :, :]

    p = prepare(q, k, v, mask, bias=bias, causal=False, scale=scale, temperature=temperature, masked_rows=masked_rows)
    n_q, n_k = p.n_q, p.n_k
    block_q, block_k = min(block_q, n_q), min(block_k, n_k)  # a block never outgrows its sequence (nor its memory)
    _check_factors(p.scale, p.temperature, p.bias is not None, p.q.dtype)
    batch = p.batch
    if group > 1:
        out_batch = (*batch[:-2], batch[-2] * group)
    else:
        out_batch = batch

    # causal alignment and query offset
    if q_offset is not None:
        if isinstance(q_offset, bool) or not isinstance(q_offset, (int, np.integer)) or q_offset < 0:
            raise MaskError(f"q_offset: expected None or an int >= 0 (query 0's key position), got {q_offset!r}")
        if causal not in (True, False, None):
            raise MaskError(
                f"q_offset={q_offset} already places the queries (query i sits at key position q_offset + i); "
                f"pass causal=True with it, not causal={causal!r}"
            )
        shift = int(q_offset)
        is_causal = bool(causal)
    else:
        if causal in (False, None):
            is_causal = False
            align = None
        elif causal is True:
            if n_q != n_k:
                raise MaskError(causal_alignment_message(n_q, n_k, "causal=True"))
            is_causal, align = True, "top_left"
        elif causal in ("top_left", "bottom_right"):
            is_causal, align = True, causal
        else:
            raise MaskError(f"causal: expected False, True, 'top_left' or 'bottom_right', got {causal!r}")
        if align is None and win is not None and n_q != n_k:
            raise MaskError(
                causal_alignment_message(n_q, n_k, "window").replace(
                    "pass causal='top_left' or causal='bottom_right'",
                    "pass q_offset= or causal='top_left'/'bottom_right'",
                )
            )
        shift = n_k - n_q if align == "bottom_right" else 0
    left, right = win if win is not None else (None, None)

    first_axis = out_batch[0] if out_batch else 1
    kl = None if key_lengths is None else _lengths_array(key_lengths, n_k, first_axis)
    q_seg = k_seg = None
    if segments is not None:
        q_seg, k_seg = _segments_arrays(segments, n_q, n_k, first_axis)

    m = p.mask
    if m is not None:
        m = np.broadcast_to(np.asarray(m), p.scores_shape)

    return _Plan(
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
        causal=is_causal,
        shift=shift,
        left=left,
        right=right,
        key_lengths=kl,
        q_seg=q_seg,
        k_seg=k_seg,
        mask=m,
        bias=None if p.bias is None else np.broadcast_to(p.bias, p.scores_shape),
        bias_raw=p.bias,
        bias_shape=bias_shape,
        masked_rows=p.masked_rows,
        block_q=block_q,
        block_k=block_k,
        threads=threads,
        xp=xp,
        device=device,
        out_dtype=p.out_dtype if xp is np else out_dtype,
        lse_dtype=p.q.dtype if xp is np else lse_dtype,
        config=current_config(),
    )


def _to_caller(plan: _Plan, x: np.ndarray, dtype: Any = None, *, name: str | None = None) -> Any:
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


def _empty_rows_error(plan: _Plan, lse: np.ndarray, what: str) -> MaskedRowError:
    """The core's error for fully masked rows, with indices in the caller's (batch, query) layout."""
    empty = np.isneginf(lse).reshape((*plan.out_batch, plan.n_q))
    return masked_rows_error(index_tuples(empty), (*plan.out_batch, plan.n_q, plan.n_k), nan=what == "forward")


# --------------------------------------------------------------------------------------------------------------
# forward


@dataclass(frozen=True)
class _Units:
    """How a score block becomes logits with the roundings of the naive computation, no more.

    Only a signed power of two of the factor ``scale / temperature`` is folded into Q (``Q · ±2**shift``: exact),
    and the rest, ``R`` in [1, 2), multiplies the block: ``logits = fl(R · (±2**shift Q) Kᵀ) + bias / T`` is the
    naive ``fl(fl(Q Kᵀ) · scale)`` (+ bias) bit for bit, up to the product's own rounding. The running maximum is
    then subtracted in nats, and only the difference is converted for ``exp2`` (``pre · (z - m)``): nearly exact
    where the weights matter. Folding all of the factor into Q rounds every element of ``factor · Q``, and
    converting to log2 units before subtracting rounds numbers as large as the logits: in float32 at |logits| ~
    1e3-1e4 either cost up to 6-18x the naive error, beyond FlashAttention's 2x rule in ~18 % of random cases.
    """

    E: _Exp
    shift: int  # Q is scaled by sign · 2**shift
    sign: int  # the sign of the factor (folded into Q, so that R >= 0)
    R: Any  # logits = R · (folded Q) Kᵀ + c_bias · bias; a scalar of the compute dtype in [1, 2) (0 for scale 0)
    c_bias: Any  # 1 / temperature: the bias in nats
    pre: Any  # E.pre in the compute dtype

    def fold(self, q: np.ndarray) -> np.ndarray:
        """``q · sign · 2**shift`` (a new array; exact unless it leaves the dtype's normal range)."""
        dt = q.dtype
        with np.errstate(over="ignore", under="ignore"):  # an overflow here is caught as an overflow of the logits
            if -np.finfo(dt).maxexp + 2 < self.shift < np.finfo(dt).maxexp - 1:
                return q * dt.type(self.sign * 2.0**self.shift)
            out = np.ldexp(q, self.shift)
        return -out if self.sign < 0 else out


def _units(plan: _Plan) -> _Units:
    dt = plan.q.dtype
    E = _exp(dt, plan.config)
    mant, exp = math.frexp(abs(plan.factor))  # |factor| = mant · 2**exp, mant in [0.5, 1) (0 for 0)
    R = dt.type(2.0 * mant)
    with np.errstate(over="ignore"):  # 1 / temperature may not fit (checked by _plan when there is a bias)
        c_bias = dt.type(1.0 / plan.temperature)
    return _Units(E=E, shift=exp - 1, sign=-1 if plan.factor < 0 else 1, R=R, c_bias=c_bias, pre=dt.type(E.pre))


@dataclass(frozen=True)
class _Extras:
    """Per-call values the forward tasks share: the units, per batch·head the largest key norm, the score bound
    under which the fast path (no running maximum) is exact, and the one beyond which a logit may overflow."""

    u: _Units
    k_norm: np.ndarray  # [*batch]
    safe: float  # |logit| bound (nats) under which exp(S) needs no offset
    bias_max: float  # max |bias| / temperature (nats), 0 without a bias
    limit: float  # |logit| bound (nats) under which no logit, nor a difference of two, can overflow


def _extras(plan: _Plan) -> _Extras:
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
        u=_units(plan),
        k_norm=np.broadcast_to(k_norm, plan.batch),
        safe=safe,
        bias_max=bias_max,
        limit=float(np.finfo(dt).max) / 16,
    )


def _v_shift(plan: _Plan) -> int:
    """The power of two V is divided by (exactly) so that the unnormalised sums ``acc = sum_j P_ij V_j`` cannot
    overflow: ``P`` reaches the row-sum threshold (``2**40`` in float32) between two maximum passes, so ``acc`` is
    at most ``n_k · threshold · max |v|``. 0 (no scaling) unless ``max |v|`` is within ``n_k · 2**41`` of the
    dtype's limit, which no real activation is."""
    dt = plan.q.dtype
    v_max = max(float(plan.v_raw.max()), -float(plan.v_raw.min()), 0.0)
    room = float(np.finfo(dt).max) / (4.0 * _THRESHOLD[dt] * max(plan.n_k, 1))
    if v_max <= room:
        return 0
    return math.ceil(math.log2(v_max / room))


def _scaled_v(plan: _Plan, shift: int) -> _Plan:
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
    plan: _Plan, ex: _Extras, out: np.ndarray, lse: np.ndarray, task: tuple[tuple[int, ...], int, int]
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
    if bounded:
        matmul = np.matmul
        a = u.R * u.pre  # what turns qs Kᵀ into the exponential's argument
        if not u.E.fused:
            # NumPy's passes: all of it folded into Q (rounding each element of Q), which saves a pass per block;
            # within the bound that rounding stays below float32's own (0 of 600 random bounded cases beyond
            # FlashAttention's rule), unlike at large logits (see _Units)
            qs, a = qs * a, dt.type(1)
        for j0, j1, bad in plan.key_blocks(idx, i0, i1):
            bk = j1 - j0
            s = buf[: bq * bk].reshape(bq, bk)  # contiguous [bq, bk]
            matmul(qs, K[j0:j1].T, out=s)  # [bq, bk], |R · s + bias / T| <= safe
            _exp_bounded(plan, u, a, idx, i0, j0, s, bad, lt, ones)  # P = exp(logits), masked 0, lt = P 1
            matmul(s, V[j0:j1], out=pv)
            acc += pv
            l_i += lt
        m_i = np.zeros(bq, dtype=dt)
    else:
        check = not bound + ex.bias_max <= ex.limit
        with np.errstate(over="ignore", invalid="ignore") if check else contextlib.nullcontext():
            m_i = _online_softmax(plan, ex, idx, i0, i1, qs, K, V, w, ones, check)
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


def _bias_into(plan: _Plan, idx: tuple[int, ...], i0: int, j0: int, s: np.ndarray, c: Any) -> None:
    """``s += c · bias block`` in place, if there is a bias (the NumPy passes)."""
    if plan.bias is not None:
        s += plan.bias[idx][i0 : i0 + s.shape[0], j0 : j0 + s.shape[1]] * c


def _to_logits(plan: _Plan, u: _Units, idx: tuple[int, ...], i0: int, j0: int, s: np.ndarray) -> None:
    """``s <- fl(R · s) + c_bias · bias block`` in place (the NumPy passes; ``s`` the product of the folded Q)."""
    if u.R != 1:
        s *= u.R
    _bias_into(plan, idx, i0, j0, s, u.c_bias)


def _logits(
    plan: _Plan, u: _Units, idx: tuple[int, ...], qs: np.ndarray, Kj: np.ndarray, i0: int, j0: int, s: np.ndarray
) -> np.ndarray:
    """The block's logits (nats) into ``s``: ``R · qs Kjᵀ`` (q already folded) plus the bias block, if any."""
    np.matmul(qs, Kj.T, out=s)
    _to_logits(plan, u, idx, i0, j0, s)
    return s


def _exp_offset(u: _Units, s: np.ndarray, off: np.ndarray) -> None:
    """``s <- exp(s - off[:, None])`` in place with NumPy's passes (``s`` in nats): the offset first, then
    ``pre``."""
    s -= off[:, None]
    if u.pre != 1:
        s *= u.pre
    u.E.fn(s, out=s)


def _exp_bounded(
    plan: _Plan,
    u: _Units,
    a: Any,
    idx: tuple[int, ...],
    i0: int,
    j0: int,
    s: np.ndarray,
    bad: np.ndarray | _PositionMask | None,
    lt: np.ndarray,
    ones: np.ndarray,
) -> None:
    """The fast path's exponential of one block of bounded scores: ``s <- fn(a · s + pre · bias / T)`` in place, with
    no offset (``s = qs Kjᵀ``, ``a`` what is left of the factor times ``pre``): masked entries 0, ``lt`` = the row
    sums. One fused pass, or NumPy's passes (the mask multiplied in after the exponential, which is slow on
    ``-inf``; the row sums as ``P 1``)."""
    c = u.c_bias * u.pre
    if u.E.fused:
        bias = _bias_block(plan, idx, i0, i0 + s.shape[0], j0, j0 + s.shape[1])
        fused.kernels().exp2_rows(s, a, bias, c, None, u.pre, _bad_array(bad), lt)
        return
    if a != 1:
        s *= a
    _bias_into(plan, idx, i0, j0, s, c)
    u.E.fn(s, out=s)
    if bad is not None:
        _zero_masked(s, bad)
    np.matmul(s, ones[: s.shape[1]], out=lt)


def _caller_index(plan: _Plan, idx: tuple[int, ...]) -> tuple[int, ...]:
    """An internal batch index (GQA: ``(..., kv head, group member)``) in the caller's layout (``(..., head)``)."""
    if plan.group > 1:
        return (*idx[:-2], idx[-2] * plan.group + idx[-1])
    return idx


def _check_logits(
    plan: _Plan,
    u: _Units,
    idx: tuple[int, ...],
    i0: int,
    j0: int,
    s: np.ndarray,
    bad: np.ndarray | _PositionMask | None,
) -> None:
    """A :class:`~attnlab.errors.RangeError` if a logit of the block ``s`` that the mask allows is not finite."""
    ok = np.isfinite(s)
    blocked = _bad_array(bad)
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
        (*_caller_index(plan, idx), i0 + i, j0 + j),
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
    plan: _Plan,
    ex: _Extras,
    idx: tuple[int, ...],
    i0: int,
    i1: int,
    qs: np.ndarray,
    K: np.ndarray,
    V: np.ndarray,
    w: _Work,
    ones: np.ndarray,
    check: bool = False,
) -> np.ndarray:
    """The online softmax with running max ``m_i`` (lazy: the max pass runs only while some row has none yet, or
    when a block's row sums pass the threshold, and for every block after that one). Accumulates ``P V`` into
    ``w.acc`` and the row sums into ``w.l_i``; returns ``m_i``. With ``check``, every block takes the max pass and
    its logits are checked (:func:`_check_logits`) before they are used."""
    dt = plan.q.dtype
    u = ex.u
    E = u.E
    threshold = _THRESHOLD[dt]
    bq = i1 - i0
    acc, pv, l_i, lt, buf = w.acc, w.pv, w.l_i, w.lt, w.s
    m_i = np.full(bq, -np.inf, dtype=dt)  # running max of the logits (the offset of P)
    ready = False  # every row has a finite m_i
    lazy = not check  # try blocks without the max pass; off after the first block whose scores outgrew m_i
    jit = fused.kernels() if E.fused else None
    one = dt.type(1)
    for j0, j1, bad in plan.key_blocks(idx, i0, i1):
        bk = j1 - j0
        s = buf[: bq * bk].reshape(bq, bk)  # contiguous [bq, bk]
        Kj = K[j0:j1]
        skip_max = ready and lazy  # exponentiate relative to m_i without this block's maximum
        if skip_max and E.fused:  # bias, running max, mask, exponential and row sums in one pass
            np.matmul(qs, Kj.T, out=s)
            bias = _bias_block(plan, idx, i0, i1, j0, j1)
            jit.exp2_rows(s, u.R, bias, u.c_bias, m_i, u.pre, _bad_array(bad), lt)  # P, relative to m_i
        else:
            _logits(plan, u, idx, qs, Kj, i0, j0, s)  # [bq, bk]
            if check:
                _check_logits(plan, u, idx, i0, j0, s, bad)
            if bad is not None:
                _apply_mask(s, bad)
            if skip_max:
                with np.errstate(over="ignore", invalid="ignore"):  # an overflow shows up in the row sums, below
                    _exp_offset(u, s, m_i)  # P relative to the running max (entries may exceed 1)
                    np.matmul(s, ones[:bk], out=lt)
        if skip_max:
            if lt.max() <= threshold:  # False for inf and NaN too
                np.matmul(s, V[j0:j1], out=pv)
                acc += pv
                l_i += lt
                continue
            lazy = False  # scores that grow along the keys (ALiBi, a window) would fail block after block
            _logits(plan, u, idx, qs, Kj, i0, j0, s)  # scores grew too much: redo this block with the max pass
            if bad is not None:
                _apply_mask(s, bad)
        m_new = np.maximum(m_i, s.max(axis=1))
        ready = bool(np.isfinite(m_new).all())
        m_use = m_new if ready else np.where(np.isfinite(m_new), m_new, 0).astype(dt)
        alpha = np.exp(m_i - m_use)  # rescales the old acc and l_i (0 where m_i was -inf)
        if E.fused:
            jit.exp2_rows(s, one, None, one, m_use, u.pre, None, lt)  # logits already; masked entries -inf: 0
        else:
            _exp_offset(u, s, m_use)
            np.matmul(s, ones[:bk], out=lt)
        np.matmul(s, V[j0:j1], out=pv)
        acc *= alpha[:, None]
        acc += pv
        l_i *= alpha
        l_i += lt
        m_i = m_new
    return np.where(np.isfinite(m_i), m_i, 0).astype(dt)


def _forward_tasks(plan: _Plan) -> list[tuple[tuple[int, ...], int, int]]:
    tasks = []
    for idx in np.ndindex(*plan.batch):
        for i0 in range(0, plan.n_q, plan.block_q):
            i1 = min(i0 + plan.block_q, plan.n_q)
            lo, hi = plan.key_range(idx, i0, i1)
            tasks.append((max(0, hi - lo), (idx, i0, i1)))
    tasks.sort(key=lambda t: -t[0])  # the most expensive first, so the cheap ones fill the gaps
    return [t for _, t in tasks]


def flash_attention(
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
        mask: boolean, True = may attend, broadcastable to ``[..., h, n_q, n_k]``; applied block by block.
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
    if autograd.wants_grad(q, k, v, bias):
        options = dict(
            causal=causal, q_offset=q_offset, window=window, key_lengths=key_lengths, segments=segments, mask=mask,
            scale=scale, temperature=temperature, masked_rows=masked_rows, block_q=block_q, block_k=block_k,
            num_threads=num_threads,
        )  # fmt: skip
        output, lse = autograd.flash_function(q, k, v, bias, options)
        return FlashResult(output=output, lse=lse)
    plan = _plan(
        q,
        k,
        v,
        causal=causal,
        q_offset=q_offset,
        window=window,
        key_lengths=key_lengths,
        segments=segments,
        mask=mask,
        bias=bias,
        scale=scale,
        temperature=temperature,
        masked_rows=masked_rows,
        block_q=block_q,
        block_k=block_k,
        num_threads=num_threads,
    )
    dt = plan.q.dtype
    v_shift = _v_shift(plan)
    plan = _scaled_v(plan, v_shift)
    out = np.empty((*plan.batch, plan.n_q, plan.d_v), dtype=dt)
    lse = np.empty((*plan.batch, plan.n_q), dtype=dt)
    tasks = _forward_tasks(plan)
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
        raise _empty_rows_error(plan, lse, "forward")
    return FlashResult(output=_to_caller(plan, out, name="output"), lse=_to_caller(plan, lse, plan.lse_dtype))


# --------------------------------------------------------------------------------------------------------------
# backward


class _BiasGrad:
    """``dbias = dS / temperature``, accumulated block by block into the bias's own (unbroadcast) shape: memory is
    that of the bias, never ``[*batch, n_q, n_k]`` unless the bias is that large itself."""

    def __init__(self, plan: _Plan) -> None:
        raw = plan.bias_raw
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


def _backward_task(
    plan: _Plan,
    u: _Units,
    qs_all: np.ndarray,
    d_o: np.ndarray,
    lse_safe: np.ndarray,
    delta: np.ndarray,
    dk: np.ndarray,
    dv: np.ndarray,
    dbias: _BiasGrad | None,
    task: tuple[tuple[int, ...], int, int],
) -> tuple[tuple[int, ...], np.ndarray | None]:
    idx, ja, jb = task
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow shows up in the gradients, checked after
        return _backward_blocks(plan, u, qs_all, d_o, lse_safe, delta, dk, dv, dbias, idx, ja, jb)


def _backward_blocks(
    plan: _Plan,
    u: _Units,
    qs_all: np.ndarray,
    d_o: np.ndarray,
    lse_safe: np.ndarray,
    delta: np.ndarray,
    dk: np.ndarray,
    dv: np.ndarray,
    dbias: _BiasGrad | None,
    idx: tuple[int, ...],
    ja: int,
    jb: int,
) -> tuple[tuple[int, ...], np.ndarray | None]:
    """The key blocks ``[ja, jb)`` of batch·head ``idx``: ``dk``, ``dv`` (and ``dbias``) written, ``dq`` returned."""
    dt = plan.q.dtype
    E = u.E
    Qs = qs_all[idx]  # [n_q, d_k], folded: R · Qs Kᵀ + c_bias · bias are the logits
    K, V = plan.k[idx], plan.v[idx]
    dO, L, D = d_o[idx], lse_safe[idx], delta[idx]
    dq = None
    jit = fused.kernels() if E.fused else None
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
                bias = _bias_block(plan, idx, i0, i1, j0, j1)
                jit.exp2_rows(s, u.R, bias, u.c_bias, L[i0:i1], u.pre, _bad_array(bad), None)  # P: one pass
            else:
                _to_logits(plan, u, idx, i0, j0, s)
                if bad is not None:
                    _apply_mask(s, bad)
                _exp_offset(u, s, L[i0:i1])  # P, exactly the forward's weights
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


def flash_attention_backward(
    q: Any,
    k: Any,
    v: Any,
    output: Any,
    lse: Any,
    d_out: Any,
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
    d_lse: Any = None,
) -> FlashGrads:
    """FlashAttention-2's backward: gradients of the tiled forward from its output and ``lse`` in O(n) memory.

    ``P`` is recomputed block by block from ``lse``; ``delta = rowsum(dO ∘ O) - dlse``, ``dV = Pᵀ dO``,
    ``dP = dO Vᵀ``, ``dS = P ∘ (dP - delta)``, ``dQ = dS K · scale / T``, ``dK = dSᵀ Q · scale / T``,
    ``dbias = dS / T`` (T the temperature; ``∂lse_i/∂logit_ij = P_ij`` is why a gradient of ``lse`` only shifts
    ``delta``).

    Args:
        q, k, v: the forward's inputs (shapes as in :func:`flash_attention`, GQA included).
        output: the forward's output ``[..., h, n_q, d_v]``.
        lse: the forward's ``lse [..., h, n_q]``.
        d_out: ``dO = ∂L/∂output`` ``[..., h, n_q, d_v]``.
        causal, q_offset, window, key_lengths, segments, mask, bias, scale, temperature: exactly as given to the
            forward.
        masked_rows: rows with ``lse = -inf`` (fully masked) get zero gradient under ``"zero"``; ``"raise"``
            (default) and ``"nan"`` raise :class:`~attnlab.errors.MaskedRowError` (a NaN output has no gradient).
        block_q, block_k, num_threads: as in :func:`flash_attention`.
        d_lse: ``∂L/∂lse`` ``[..., h, n_q]`` when the loss uses the forward's ``lse`` too (None: it does not).

    Returns:
        :class:`FlashGrads` ``(dq, dk, dv, dbias)``, each shaped like its input (summed over broadcast and
        GQA-shared heads) in the inputs' library and dtype; ``dbias`` is None without a bias, and is accumulated
        in the bias's own shape (its memory, not ``[..., n_q, n_k]``, unless the bias is that large).

    The gradients carry no autograd history (no double backward): with PyTorch tensors that require grad and
    grad mode on, this raises :class:`~attnlab.errors.DTypeError` rather than return tensors that would silently
    drop second-order terms; :func:`flash_attention` itself is differentiable (its ``torch.autograd.Function``
    calls this). Gradients that overflow the compute dtype from finite inputs raise
    :class:`~attnlab.errors.RangeError`. As in FlashAttention, ``P`` is only as exact as ``lse``: a float32
    ``lse`` of magnitude L carries ~L · 6e-8 absolute rounding, a relative error of the recomputed weights (at
    |logits| ~ 1e4, ~1e-3: far beyond real activations, but a float64 lse would not have it).

    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> q, k, v, d_o = (rng.standard_normal((3, 50, 8)) for _ in range(4))
    >>> f = flash_attention(q, k, v, causal=True, block_q=16, block_k=16)
    >>> g = flash_attention_backward(q, k, v, f.output, f.lse, d_o, causal=True, block_q=16, block_k=16)
    >>> g.dq.shape, g.dk.shape, g.dv.shape
    ((3, 50, 8), (3, 50, 8), (3, 50, 8))
    """
    autograd.refuse_grad("flash_attention_backward", q=q, k=k, v=v, output=output, lse=lse, d_out=d_out, bias=bias)
    plan = _plan(
        q,
        k,
        v,
        causal=causal,
        q_offset=q_offset,
        window=window,
        key_lengths=key_lengths,
        segments=segments,
        mask=mask,
        bias=bias,
        scale=scale,
        temperature=temperature,
        masked_rows=masked_rows,
        block_q=block_q,
        block_k=block_k,
        num_threads=num_threads,
    )
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
            raise ShapeError("lse: holds NaN or +inf; expected the forward's lse (finite, -inf on fully masked rows)")
        arrays[name] = xn.astype(dt, copy=False)
    lse_n = arrays["lse"].reshape(full_out[:-1])
    if np.isneginf(lse_n).any() and plan.masked_rows != "zero":
        err = _empty_rows_error(plan, lse_n.reshape(caller_out[:-1]), "backward")
        raise MaskedRowError(
            f"{err} — in the backward, fully masked rows have a gradient only under masked_rows='zero' "
            f"(zero output, zero gradient)",
            err.rows,
        )
    # +inf on fully masked rows: exp(s - inf) = 0, those rows pass no gradient
    u = _units(plan)
    lse_safe = np.where(np.isneginf(lse_n), np.inf, lse_n)
    d_o = arrays["d_out"].reshape(full_out)
    o = arrays["output"].reshape(full_out)
    with np.errstate(over="ignore", invalid="ignore"):
        delta = np.einsum("...ij,...ij->...i", d_o, o)  # [*batch, n_q] rowsum(dO ∘ O)
    if d_lse is not None:
        delta = delta - arrays["d_lse"].reshape(full_out[:-1])  # dS = P ∘ (dP - delta + dlse)
    qs_all = u.fold(plan.q)  # [*batch, n_q, d_k]: R · qs Kᵀ (+ bias / T) are the logits
    dk = np.zeros((*plan.batch, plan.n_k, plan.d_k), dtype=dt)
    dv = np.zeros((*plan.batch, plan.n_k, plan.d_v), dtype=dt)
    dq = np.zeros((*plan.batch, plan.n_q, plan.d_k), dtype=dt)

    # tasks: one per batch·head when there are enough, else each one's keys split between the threads
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
    dbias = None if plan.bias_raw is None else _BiasGrad(plan)
    results = run_tasks(
        lambda t: _backward_task(plan, u, qs_all, d_o, lse_safe, delta, dk, dv, dbias, t), tasks, plan.threads
    )
    with np.errstate(over="ignore", invalid="ignore"):
        for idx, dq_part in results:
            if dq_part is not None:
                dq[idx] += dq_part
        dq *= dt.type(plan.factor)
    for name, g in (("dq", dq), ("dk", dk), ("dv", dv), ("dbias", None if dbias is None else dbias.acc)):
        if g is not None and not np.isfinite(g).all():
            where = tuple(int(i) for i in np.argwhere(~np.isfinite(g))[0])
            raise gradient_overflow_error(
                name, where, float(g[where]), str(dt), d_out_max=float(np.abs(arrays["d_out"]).max())
            )

    def back(name: str, x: np.ndarray, shape: tuple[int, ...], caller_shape: tuple[int, ...]) -> Any:
        return _to_caller(plan, np.ascontiguousarray(_sum_to(x, shape)).reshape(caller_shape), name=name)

    cq, ck, cv = plan.caller_shapes
    return FlashGrads(
        dq=back("dq", dq, plan.q_shape, cq),
        dk=back("dk", dk, plan.k_shape, ck),
        dv=back("dv", dv, plan.v_shape, cv),
        dbias=None if dbias is None else _to_caller(plan, dbias.total(), name="dbias"),
    )


# --------------------------------------------------------------------------------------------------------------
# the GEMM floor (for benchmarks)


def _floor_task(plan: _Plan, out: np.ndarray, task: tuple[tuple[int, ...], int, int]) -> None:
    idx, i0, i1 = task
    dt = plan.q.dtype
    qs = plan.q[idx][i0:i1] * dt.type(plan.scale)
    K, V = plan.k[idx], plan.v[idx]
    acc = np.zeros((i1 - i0, plan.d_v), dtype=dt)
    pv = np.empty_like(acc)
    buf = _scratch((i1 - i0) * plan.block_k, dt)
    for j0, j1, _ in plan.key_blocks(idx, i0, i1):
        s = buf[: (i1 - i0) * (j1 - j0)].reshape(i1 - i0, j1 - j0)
        np.matmul(qs, K[j0:j1].T, out=s)
        np.matmul(s, V[j0:j1], out=pv)
        acc += pv
    out[idx][i0:i1] = acc


def gemm_floor(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: Causal = False,
    block_q: int | None = None,
    block_k: int | None = None,
    num_threads: int | None = None,
) -> np.ndarray:
    """The tiled forward's matrix products alone, ``sum_j (Q_i K_jᵀ) V_j`` with no softmax: NOT attention.

    The same tasks, blocks, block skipping and threads as :func:`flash_attention`; its time is the physical limit
    of this design, which ``attnlab bench`` reports as the "GEMM floor". Shapes as in :func:`flash_attention`.
    """
    plan = _plan(
        q, k, v, causal=causal, q_offset=None, window=None, key_lengths=None, segments=None, mask=None, bias=None,
        scale=None, temperature=1.0, masked_rows="zero", block_q=block_q, block_k=block_k, num_threads=num_threads,
    )  # fmt: skip
    out = np.empty((*plan.batch, plan.n_q, plan.d_v), dtype=plan.q.dtype)
    run_tasks(lambda t: _floor_task(plan, out, t), _forward_tasks(plan), plan.threads)
    return out.reshape((*plan.out_batch, plan.n_q, plan.d_v))
