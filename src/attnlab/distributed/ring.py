"""Exact context-parallel (ring) attention on ``torch.distributed``: forward, backward and an autograd wrapper.

Each of the P ranks of a process group holds a shard of the sequence (see :class:`~attnlab.distributed.RingLayout`):
its queries ``q [..., h, n_r, d_k]`` and its keys and values ``k [..., h_kv, n_r, d_k]``, ``v [..., h_kv, n_r, d_v]``.
The key/value shards travel around the ring (rank r sends to r+1 and receives from r-1, with ``isend``/``irecv``
posted *before* the local computation so the transfer overlaps it). At every step a rank runs a tiled online
softmax of its queries against the visiting block (tiles of ``block_q × block_k``) into its running ``m_i``,
``l_i``, ``acc``: the running ``(acc / l_i, m_i + log l_i)`` is the partial ``(out, lse)`` over the keys seen so
far, and each tile merges into it by the log-sum-exp rule of :func:`merge_partials`, in place. After P steps every
rank holds exact attention for its own queries and their row log-sum-exp.

The backward runs the same ring (FlashAttention-2 style, with the saved ``lse``): ``delta = rowsum(dO ∘ O)``,
``P = exp(S - lse)``, ``dV += Pᵀ dO``, ``dP = dO Vᵀ``, ``dS = P ∘ (dP - delta)``, ``dQ += dS K · scale``,
``dK += dSᵀ Q · scale``. The visiting block's ``dK, dV`` accumulators travel with it and make one extra hop at
the end, back to the rank that owns the block.

Causal attention skips every tile that no query of the rank may see (and drops the mask on tiles that are fully
visible); with the zig-zag layout every rank then does the same work. GQA: ``h`` query heads share ``h_kv`` key/value
heads (``h % h_kv == 0``); only the ``h_kv`` heads travel. Padding by lengths: ``key_lengths [B]`` hides keys at
global position >= ``key_lengths[b]``; ``query_lengths [B]`` also empties the rows of padded queries, which then
follow the core's ``masked_rows`` policy ("raise", "zero", "nan"). Which keys each query sees is one
:class:`~attnlab.masks.MaskSpec` on the global positions, read tile by tile.

Every rank validates its inputs and the ranks agree (one small all-gather) before any ring traffic, so a bad shard
on one rank raises the same error type on every rank instead of leaving the others waiting. Without an initialized
process group (or with P = 1) everything runs in this one process, with the same tiled code.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import errors as _errors
from .._arrays import index_tuples, namespace
from .._signatures import same_arguments
from ..core.inputs import CoreOptions, MaskedRows, Prepared, check_finite, prepare
from ..errors import AttnlabError, MaskedRowError, OptionError, ShapeError, masked_rows_error, missing_extra
from ..masks import MaskSpec
from ..validate import check_int
from .layout import Layout, RingLayout

try:
    import torch
    import torch.distributed as dist
except ImportError:  # pragma: no cover - exercised only without the extra
    raise missing_extra("torch", "torch") from None

__all__ = [
    "RingGrads",
    "RingOptions",
    "RingResult",
    "RingStats",
    "merge_partials",
    "ring_attention",
    "ring_attention_backward",
    "ring_attention_forward",
]

_DEFAULT_BLOCK = 256
_TAG_KV = 16  # k: 16, v: 17
_TAG_DKV = 32  # dk: 32, dv: 33


# --------------------------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class RingStats:
    """What one rank did in one ring pass.

    ``tiles_computed`` / ``tiles_skipped`` count ``block_q × block_k`` tiles (skipped: no query of the tile may see
    any of its keys); ``flops`` counts the multiply-adds of the matmuls actually run (×2); ``bytes_sent`` and
    ``bytes_received`` count this rank's ring payloads (``k, v`` and, in the backward, ``dk, dv``); ``wait_s`` is the
    time it spent blocked waiting for transfers after its computation was done (communication *not* hidden).
    """

    rank: int
    world_size: int
    steps: int
    tiles_computed: int
    tiles_skipped: int
    flops: int
    bytes_sent: int
    bytes_received: int
    wait_s: float = 0.0


@dataclass(frozen=True)
class RingResult:
    """The forward of one rank.

    Shapes: ``output [..., h, n_r, d_v]`` (input dtype), ``lse [..., h, n_r]`` (compute dtype, natural log of the
    row sum of ``exp(scale · q kᵀ)`` over the allowed keys, ``-inf`` on fully masked rows). ``masked_rows`` lists
    every fully masked row of the *global* problem as ``(*batch_index, head, global_query_index)``, the same on
    every rank; ``policy`` says what was done with them. ``inputs`` (this rank's ``(q, k, v)``, references) and
    ``options`` (:class:`RingOptions`) are what :func:`ring_attention_backward` needs besides ``d_out``.
    """

    output: Any
    lse: Any
    masked_rows: tuple[tuple[int, ...], ...]
    policy: str
    layout: RingLayout
    stats: RingStats
    inputs: tuple[Any, Any, Any] | None = field(default=None, repr=False, compare=False)
    options: RingOptions | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class RingGrads:
    """The backward of one rank: ``dq [..., h, n_r, d_k]``, ``dk [..., h_kv, n_r, d_k]``, ``dv [..., h_kv, n_r, d_v]``
    (gradients of the loss for this rank's local shards, in the inputs' dtypes)."""

    dq: Any
    dk: Any
    dv: Any
    stats: RingStats


# --------------------------------------------------------------------------------------------------------------
# the lse merge


def merge_partials(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
    """Merge two partial attention results over disjoint key sets into the result over their union.

    ``lse = log(exp(lse_a) + exp(lse_b))``, ``out = exp(lse_a - lse) · out_a + exp(lse_b - lse) · out_b``.
    A side with ``lse = -inf`` (no allowed key) contributes nothing; if both are ``-inf`` the row stays empty
    (``out`` 0, ``lse -inf``), never NaN.

    Shapes: ``out_a, out_b [..., n_q, d_v]``, ``lse_a, lse_b [..., n_q]``; returns ``(out, lse)`` of the same shapes.

    >>> import torch
    >>> o, l = merge_partials(torch.tensor([[1.0]]), torch.tensor([0.0]), torch.tensor([[3.0]]), torch.tensor([0.0]))
    >>> o.tolist(), round(float(l[0]), 4)
    ([[2.0]], 0.6931)
    """
    m = torch.maximum(lse_a, lse_b)  # [..., n_q]
    empty = torch.isneginf(m)
    m_safe = torch.where(empty, torch.zeros_like(m), m)
    w_a = torch.exp(lse_a - m_safe)  # exp(-inf) = 0 for an empty side
    w_b = torch.exp(lse_b - m_safe)
    total = w_a + w_b
    safe_total = torch.where(empty, torch.ones_like(total), total)
    lse = torch.where(empty, torch.full_like(m, -math.inf), m_safe + torch.log(safe_total))
    out = (w_a / safe_total)[..., None] * out_a + (w_b / safe_total)[..., None] * out_b  # [..., n_q, d_v]
    return out, lse


# --------------------------------------------------------------------------------------------------------------
# the plan: validated, agreed settings shared by forward and backward


@dataclass(frozen=True)
class _Ring:
    """This rank's place in the ring: the process ``group`` (None: the world; also when running alone), its
    ``rank`` among ``world`` ranks, and ``peers``, the global rank of each group rank."""

    group: Any
    rank: int
    world: int
    peers: tuple[int, ...]

    @property
    def nxt(self) -> int:
        return self.peers[(self.rank + 1) % self.world]

    @property
    def prv(self) -> int:
        return self.peers[(self.rank - 1) % self.world]

    def sources(self) -> Iterator[int]:
        """The rank whose key/value block this rank holds at each step: its own first, then r-1, r-2, ..."""
        return ((self.rank - step) % self.world for step in range(self.world))


@dataclass(frozen=True)
class _Plan:
    ring: _Ring
    options: RingOptions  # as the caller passed them (block sizes checked)
    core: Prepared  # the core's validation of one row of each shard: scale, masked_rows policy, compute dtype
    layout_q: RingLayout
    layout_k: RingLayout
    spec: MaskSpec  # causal, key lengths, query lengths, on the global positions (sized)
    lead: tuple[int, ...]
    h: int
    h_kv: int
    d_k: int
    d_v: int
    masked_rows: tuple[tuple[int, ...], ...] = field(default=())

    @property
    def cdt(self) -> Any:
        """The compute dtype (float32, or float64 for float64 inputs and where float32 logits could overflow)."""
        return self.core.q.dtype


def _ring_of(group: Any) -> _Ring:
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise AttnlabError("group: a process group was passed, but torch.distributed is not initialized")
        return _Ring(None, 0, 1, (0,))
    g = group if group is not None else dist.group.WORLD
    return _Ring(group, dist.get_rank(g), dist.get_world_size(g), tuple(dist.get_process_group_ranks(g)))


def _agree(ring: _Ring, error: BaseException | None, signature: tuple) -> list[tuple]:
    """All-gather (error, signature) across the ring's group; raise on every rank if any rank failed."""
    world = ring.world
    if world == 1:
        if error is not None:
            raise error
        return [signature]
    mine = (None if error is None else (type(error).__name__, str(error)), signature)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine, group=ring.group)
    failed = [(r, e) for r, (e, _) in enumerate(gathered) if e is not None]
    if failed:
        if error is not None:
            raise error
        r, (cls_name, msg) = failed[0]
        cls = getattr(_errors, cls_name, None)
        if not (isinstance(cls, type) and issubclass(cls, AttnlabError)) or cls is MaskedRowError:
            cls = AttnlabError
        raise cls(f"rank {r} of {world} rejected its inputs, so every rank stops: {msg}")
    return [s for _, s in gathered]


def _local_checks(q: Any, k: Any, v: Any, scale: Any, masked_rows: Any) -> tuple[Any, tuple]:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise _errors.DTypeError(f"{name}: ring attention runs on torch tensors, got {type(x).__name__}")
    shapes = f"(q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)})"
    for name, x, legend in (
        ("q", q, "[..., h, n_r, d_k]"),
        ("k", k, "[..., h_kv, n_r, d_k]"),
        ("v", v, "[..., h_kv, n_r, d_v]"),
    ):
        if x.ndim < 3:
            raise ShapeError(f"{name}: expected at least 3 dims {legend} (heads before the sequence), got {shapes}")
    if not (q.ndim == k.ndim == v.ndim and q.shape[:-3] == k.shape[:-3] == v.shape[:-3]):
        raise ShapeError(f"q, k, v: leading (batch) dims before the head axis must be equal {shapes}")
    h, h_kv = q.shape[-3], k.shape[-3]
    if v.shape[-3] != h_kv:
        raise ShapeError(f"v: {v.shape[-3]} heads (dim -3) but k has h_kv={h_kv} {shapes}")
    if h % h_kv:
        raise ShapeError(
            f"k: h_kv={h_kv} key/value heads (dim -3) must divide q's h={h} heads (GQA groups h / h_kv) {shapes}"
        )
    if q.device != k.device or q.device != v.device:
        raise _errors.DTypeError(f"q, k, v: on different devices ({q.device}, {k.device}, {v.device})")
    if k.shape[-1] != q.shape[-1]:
        raise ShapeError(f"k: last dim d_k={k.shape[-1]} does not match q's d_k={q.shape[-1]} {shapes}")
    if v.shape[-2] != k.shape[-2]:
        raise ShapeError(f"v: n_k={v.shape[-2]} (dim -2) does not match k's n_k={k.shape[-2]} {shapes}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_finite(namespace(x), x, name)
    # the core's validation of dims, dtypes, scale and policy; on one row of each, since prepare() also converts
    # to the compute dtype (a copy of every shard would add to the peak memory), grouped for GQA
    g = h // h_kv
    q1, k1, v1 = q[..., :1, :], k[..., :1, :], v[..., :1, :]
    if g > 1:
        q1, k1, v1 = q1.reshape(*q.shape[:-3], h_kv, g, 1, q.shape[-1]), k1.unsqueeze(-3), v1.unsqueeze(-3)
    try:
        p = prepare(q1, k1, v1, options=CoreOptions(scale=scale, masked_rows=masked_rows))
    except AttnlabError as err:
        raise type(err)(f"{err} (ring attention inputs {shapes})") from None
    sig = (tuple(q.shape[:-3]), h, h_kv, q.shape[-1], v.shape[-1], str(q.dtype), str(k.dtype), str(v.dtype))
    return p, sig


def _as_key(lengths: Any) -> Any:
    """``lengths`` as a comparable value (the ranks must agree on it)."""
    if lengths is None:
        return None
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.detach().cpu().numpy()
    arr = np.asarray(lengths)
    return (arr.shape, arr.ravel().tolist())


@dataclass(frozen=True)
class RingOptions:
    """Every option of :func:`ring_attention_forward` but the arrays, as one value: the forward's
    :class:`RingResult` keeps it, and :func:`ring_attention_backward` plans from it (nothing repeated). Fields and
    defaults as the keywords of :func:`ring_attention_forward`."""

    causal: Any = False
    scale: float | None = None
    key_lengths: Any = None
    query_lengths: Any = None
    layout: Layout = "contiguous"
    masked_rows: MaskedRows = "raise"
    block_q: int = _DEFAULT_BLOCK
    block_k: int = _DEFAULT_BLOCK
    group: Any = None


def _structure(o: RingOptions, lead: tuple[int, ...]) -> MaskSpec:
    """The options' :class:`~attnlab.masks.MaskSpec` (unsized); lengths need a batch axis."""
    for name in ("key_lengths", "query_lengths"):
        if getattr(o, name) is not None and not lead:
            raise ShapeError(f"{name}: lengths need a batch axis: q must be [B, ..., h, n_r, d_k] (at least 4 dims)")
    return MaskSpec(causal=o.causal, key_lengths=o.key_lengths, query_lengths=o.query_lengths)


def _make_plan(q: Any, k: Any, v: Any, o: RingOptions) -> _Plan:
    ring = _ring_of(o.group)
    error: BaseException | None = None
    sig: tuple = ()
    p = spec = None
    try:
        p, sig = _local_checks(q, k, v, o.scale, o.masked_rows)
        for name, b in (("block_q", o.block_q), ("block_k", o.block_k)):
            check_int(name, b, minimum=1)  # tile sizes
        spec = _structure(o, tuple(q.shape[:-3]))
        sig = (*sig, o.layout, str(o.causal), str(o.masked_rows), p.scale, _as_key(o.key_lengths))
        sig = (*sig, _as_key(o.query_lengths))
    except Exception as err:  # every rank must hear about it, whatever it is
        error = err
    n_r = (q.shape[-2], k.shape[-2]) if error is None else (0, 0)
    sigs = _agree(ring, error, (sig, n_r))
    assert p is not None and spec is not None
    for r, (s, _) in enumerate(sigs):
        if s != sigs[0][0]:
            raise ShapeError(
                f"q, k, v: ranks disagree on (batch, h, h_kv, d_k, d_v, dtypes, layout, causal, masked_rows, scale, "
                f"key_lengths, query_lengths): "
                f"rank 0 has {sigs[0][0]}, rank {r} has {s}"
            )
    layout_q, layout_k = _layouts(sigs, ring.world, o.layout)
    lead = tuple(q.shape[:-3])
    spec = spec.sized(layout_q.n, layout_k.n, lead[0] if lead else 1)
    h, h_kv = q.shape[-3], k.shape[-3]
    rows = _empty_rows(spec, lead, h, p.masked_rows)
    return _Plan(
        ring=ring,
        options=o,
        core=p,
        layout_q=layout_q,
        layout_k=layout_k,
        spec=spec,
        lead=lead,
        h=h,
        h_kv=h_kv,
        d_k=q.shape[-1],
        d_v=v.shape[-1],
        masked_rows=rows,
    )


def _layouts(sigs: list[tuple], world: int, layout: Layout) -> tuple[RingLayout, RingLayout]:
    """The global query and key layouts from the ranks' shard lengths (a :class:`ShapeError` if they do not fit)."""
    q_sizes = tuple(s[1][0] for s in sigs)
    k_sizes = tuple(s[1][1] for s in sigs)
    layout_q = RingLayout(sum(q_sizes), world, layout)
    layout_k = RingLayout(sum(k_sizes), world, layout)
    for name, lay, got in (("q", layout_q, q_sizes), ("k", layout_k, k_sizes)):
        if got != lay.sizes():
            raise ShapeError(
                f"{name}: the ranks hold {got} positions, but a {layout!r} layout of n={lay.n} over P={world} "
                f"ranks holds {lay.sizes()}; shard with RingLayout({lay.n}, {world}, {layout!r}).shard(x, rank)"
            )
    return layout_q, layout_k


def _empty_rows(spec: MaskSpec, lead: tuple[int, ...], h: int, policy: str) -> tuple[tuple[int, ...], ...]:
    """Every fully masked row of the global problem as ``(*batch, head, global query)`` (raised under "raise")."""
    empty = spec.empty_rows()  # [S, n_q], S = 1 or B
    if not empty.any():
        return ()
    n_q, n_k = spec.n_q, spec.n_k
    assert n_q is not None and n_k is not None  # the plan's spec is sized
    # [S, n_q] -> [*lead, h, n_q]: the batch axis is lead's first; without lead it is a single row
    per_row = empty.reshape((empty.shape[0],) + (1,) * len(lead) + (n_q,)) if lead else empty[0]
    rows = index_tuples(np.broadcast_to(per_row, (*lead, h, n_q)))
    if policy == "raise":
        raise masked_rows_error(
            rows,
            (*lead, h, n_q, n_k),
            index="(*batch, head, global query)",
            scores="global scores",
            fix="key_lengths / query_lengths / causal",
        )
    return rows


# --------------------------------------------------------------------------------------------------------------
# tiles and their masks


def _tiles(layout: RingLayout, rank: int, block: int) -> list[tuple[int, int, int]]:
    """``(global_start, local_start, length)`` of each tile of rank ``rank``'s rows; tiles never straddle chunks."""
    out, local = [], 0
    for a, b in layout.chunks(rank):
        for s in range(a, b, block):
            e = min(s + block, b)
            out.append((s, local + s - a, e - s))
        local += b - a
    return out


def _tile_mask(plan: _Plan, qt: tuple[int, int, int], kt: tuple[int, int, int], device: Any) -> Any:
    """``None`` (every pair allowed), ``False`` (no pair allowed) or a bool mask broadcastable to the scores tile
    ``[*lead, h_kv, g, bq, bk]`` (True = may attend): :meth:`MaskSpec.block <attnlab.masks.MaskSpec.block>` on the
    tile's global positions."""
    qa, _, bq = qt
    ka, _, bk = kt
    m = plan.spec.block(qa, qa + bq, ka, ka + bk)  # [S, bq, bk], S = 1 or B
    if m is None or m is False:
        return m
    nd = len(plan.lead) + 4
    return torch.from_numpy(m).to(device).reshape((m.shape[0],) + (1,) * (nd - 3) + (bq, bk))


# --------------------------------------------------------------------------------------------------------------
# ring communication


class _Traffic:
    def __init__(self) -> None:
        self.sent = 0
        self.received = 0
        self.wait_s = 0.0

    def wait(self, reqs: list[Any]) -> None:
        t0 = time.perf_counter()
        for r in reqs:
            r.wait()
        self.wait_s += time.perf_counter() - t0

    def stats(self, ring: _Ring, counts: list[int]) -> RingStats:
        """The pass's :class:`RingStats`: one step per rank, ``counts`` = (tiles computed, tiles skipped, flops)."""
        computed, skipped, flops = counts
        return RingStats(
            ring.rank, ring.world, ring.world, computed, skipped, flops, self.sent, self.received, self.wait_s
        )


def _exchange(plan: _Plan, sends: list[Any], recvs: list[Any], tag: int, traffic: _Traffic) -> list[Any]:
    """Post each tensor of ``sends`` to the next rank and each of ``recvs`` from the previous one (one tag per
    tensor, so transfers in flight at the same time never mix); returns the requests to wait on."""
    ops = []
    for i, (snd, rcv) in enumerate(zip(sends, recvs, strict=True)):
        ops.append(dist.P2POp(dist.isend, snd, plan.ring.nxt, plan.ring.group, tag + i))
        ops.append(dist.P2POp(dist.irecv, rcv, plan.ring.prv, plan.ring.group, tag + i))
        traffic.sent += snd.numel() * snd.element_size()
        traffic.received += rcv.numel() * rcv.element_size()
    return dist.batch_isend_irecv(ops)


def _block_shapes(plan: _Plan, src: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of rank ``src``'s ``k [..., h_kv, n_s, d_k]`` and ``v [..., h_kv, n_s, d_v]``."""
    n = plan.layout_k.size(src)
    return (*plan.lead, plan.h_kv, n, plan.d_k), (*plan.lead, plan.h_kv, n, plan.d_v)


def _empty_block(plan: _Plan, src: int, dtype: Any, device: Any) -> list[Any]:
    return [torch.empty(s, dtype=dtype, device=device) for s in _block_shapes(plan, src)]


# --------------------------------------------------------------------------------------------------------------
# forward


def _group_q(plan: _Plan, x: Any) -> Any:
    """``[..., h, n, d]`` -> ``[..., h_kv, g, n, d]`` (a view)."""
    return x.reshape(*plan.lead, plan.h_kv, plan.h // plan.h_kv, *x.shape[-2:])


def _live_tiles(plan: _Plan, src: int, device: Any, counts: list[int]) -> Iterator[tuple[int, int, int, int, Any]]:
    """The tiles of this rank's queries against rank ``src``'s keys where some query may attend to some key, as
    ``(qs, bq, ks, bk, mask)``: local starts and lengths, ``mask [S, bq, bk]`` broadcast as in :func:`_tile_mask`
    (None: every pair allowed). Counts the tiles computed in ``counts[0]`` and those skipped in ``counts[1]``."""
    for qt in _tiles(plan.layout_q, plan.ring.rank, plan.options.block_q):
        for kt in _tiles(plan.layout_k, src, plan.options.block_k):
            mask = _tile_mask(plan, qt, kt, device)
            if mask is False:
                counts[1] += 1
                continue
            counts[0] += 1
            yield qt[1], qt[2], kt[1], kt[2], mask


def _tile_logits(plan: _Plan, q_t: Any, k_t: Any, mask: Any) -> Any:
    """``scale · q_t k_tᵀ`` ``[..., h_kv, g, bq, bk]``, ``-inf`` where ``mask`` blocks."""
    s = (q_t @ k_t.transpose(-1, -2)) * plan.core.scale
    return s if mask is None else s.masked_fill(~mask, -math.inf)


def _accumulate(plan: _Plan, qg: Any, kv: tuple[Any, Any], src: int, state: tuple, counts: list[int]) -> None:
    """Online softmax of the local queries ``qg [..., h_kv, g, n_r, d_k]`` against rank ``src``'s block
    ``kv = (k [..., h_kv, n_s, d_k], v [..., h_kv, n_s, d_v])``, tile by tile, into the running ``state = (m_i, l_i
    [..., h_kv, g, n_r], acc [..., h_kv, g, n_r, d_v])`` (in place: they are the forward's own buffers).

    The running pair ``(acc / l_i, m_i + log l_i)`` is the partial ``(out, lse)`` over every key seen so far, so
    each tile update is the :func:`merge_partials` of the old result with the tile's, done without extra buffers.
    """
    k, v = kv
    m_i, l_i, acc = state
    kg, vg = k.unsqueeze(-3), v.unsqueeze(-3)  # [..., h_kv, 1, n_s, d]: shared by the g query heads of a group
    rows = math.prod(plan.lead) * plan.h
    for qs, bq, ks, bk, mask in _live_tiles(plan, src, qg.device, counts):
        s = _tile_logits(plan, qg[..., qs : qs + bq, :], kg[..., ks : ks + bk, :], mask)  # [..., h_kv, g, bq, bk]
        m_old = m_i[..., qs : qs + bq]
        m_new = torch.maximum(m_old, s.amax(dim=-1))  # [..., bq]
        m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - m_safe[..., None])  # [..., bq, bk], exactly 0 where masked
        alpha = torch.exp(m_old - m_safe)  # rescales what was accumulated under the old maximum
        l_i[..., qs : qs + bq] = alpha * l_i[..., qs : qs + bq] + p.sum(dim=-1)
        acc[..., qs : qs + bq, :] = alpha[..., None] * acc[..., qs : qs + bq, :] + p @ vg[..., ks : ks + bk, :]
        m_i[..., qs : qs + bq] = m_new
        counts[2] += 2 * rows * bq * bk * (plan.d_k + plan.d_v)


def _forward(plan: _Plan, q: Any, k: Any, v: Any) -> tuple[Any, Any, RingStats]:
    """Returns ``out [..., h, n_r, d_v]`` (compute dtype, policy applied), ``lse [..., h, n_r]`` and the stats."""
    qg = _group_q(plan, q.to(plan.cdt))
    traffic = _Traffic()
    counts = [0, 0, 0]
    m_i = torch.full(qg.shape[:-1], -math.inf, dtype=plan.cdt, device=q.device)  # [..., h_kv, g, n_r]
    l_i = torch.zeros_like(m_i)
    acc = torch.zeros((*qg.shape[:-1], plan.d_v), dtype=plan.cdt, device=q.device)  # [..., h_kv, g, n_r, d_v]
    cur = [k.contiguous(), v.contiguous()]  # travel in the input dtype
    world = plan.ring.world
    for step, src in enumerate(plan.ring.sources()):
        reqs, nxt = [], None
        if step < world - 1:  # post the next block's transfer before computing on this one
            nxt = _empty_block(plan, (src - 1) % world, k.dtype, k.device)
            reqs = _exchange(plan, cur, nxt, _TAG_KV, traffic)
        _accumulate(plan, qg, (cur[0].to(plan.cdt), cur[1].to(plan.cdt)), src, (m_i, l_i, acc), counts)
        if nxt is not None:
            traffic.wait(reqs)
            cur = nxt
    empty = l_i == 0  # no allowed key in the whole sequence
    safe_l = torch.where(empty, torch.ones_like(l_i), l_i)
    out = acc.div_(safe_l[..., None])  # acc is ours: normalize in place
    lse = torch.where(empty, torch.full_like(m_i, -math.inf), m_i + torch.log(safe_l))
    out = out.reshape(*plan.lead, plan.h, *out.shape[-2:])
    lse = lse.reshape(*plan.lead, plan.h, lse.shape[-1])
    if plan.core.masked_rows == "nan" and plan.masked_rows:
        out = torch.where(torch.isneginf(lse)[..., None], torch.full_like(out, math.nan), out)
    return out, lse, traffic.stats(plan.ring, counts)


# --------------------------------------------------------------------------------------------------------------
# backward


def _block_backward(
    plan: _Plan, saved: tuple, kv: tuple[Any, Any], src: int, dq: Any, counts: list[int]
) -> tuple[Any, Any]:
    """FlashAttention-2 backward of the local queries against rank ``src``'s block ``kv = (k, v)``, with ``saved =
    (qg, dOg, lse, delta)`` (grouped for GQA); adds into ``dq`` and returns this rank's contribution
    ``(dk [..., h_kv, n_s, d_k], dv [..., h_kv, n_s, d_v])``."""
    qg, dOg, lse, delta = saved
    k, v = kv
    kg, vg = k.unsqueeze(-3), v.unsqueeze(-3)  # [..., h_kv, 1, n_s, d]
    dk = torch.zeros(k.shape, dtype=plan.cdt, device=k.device)
    dv = torch.zeros(v.shape, dtype=plan.cdt, device=v.device)
    rows = math.prod(plan.lead) * plan.h
    for qs, bq, ks, bk, mask in _live_tiles(plan, src, qg.device, counts):
        q_t, dO_t = qg[..., qs : qs + bq, :], dOg[..., qs : qs + bq, :]
        k_t, v_t = kg[..., ks : ks + bk, :], vg[..., ks : ks + bk, :]
        s = _tile_logits(plan, q_t, k_t, mask)  # [..., h_kv, g, bq, bk]
        p = torch.exp(s - lse[..., qs : qs + bq, None])  # [..., bq, bk]: the forward's weights, recomputed
        dv[..., ks : ks + bk, :] += (p.transpose(-1, -2) @ dO_t).sum(dim=-3)  # summed over the g query heads
        dp = dO_t @ v_t.transpose(-1, -2)  # [..., bq, bk]
        ds = p * (dp - delta[..., qs : qs + bq, None])
        dq[..., qs : qs + bq, :] += (ds @ k_t) * plan.core.scale
        dk[..., ks : ks + bk, :] += (ds.transpose(-1, -2) @ q_t).sum(dim=-3) * plan.core.scale
        counts[2] += 2 * rows * bq * bk * (3 * plan.d_k + 2 * plan.d_v)
    return dk, dv


def _backward(plan: _Plan, dO: Any, q: Any, k: Any, v: Any, out: Any, lse: Any) -> tuple[Any, Any, Any, RingStats]:
    qg = _group_q(plan, q.to(plan.cdt))
    dOg = _group_q(plan, dO.to(plan.cdt))
    og = _group_q(plan, out.to(plan.cdt))
    lse_g = lse.to(plan.cdt).reshape(qg.shape[:-1])
    empty = torch.isneginf(lse_g)
    delta = (dOg * torch.where(empty[..., None], torch.zeros_like(og), og)).sum(dim=-1)  # [..., h_kv, g, n_r]
    lse_g = torch.where(empty, torch.full_like(lse_g, math.inf), lse_g)  # fully masked rows: P = exp(-inf) = 0
    dq = torch.zeros(qg.shape, dtype=plan.cdt, device=q.device)
    traffic = _Traffic()
    counts = [0, 0, 0]
    cur = [k.contiguous(), v.contiguous()]
    dkv_reqs: list[Any] = []
    dkv_in: list[Any] | None = None
    world = plan.ring.world
    for step, src in enumerate(plan.ring.sources()):
        kv_reqs, nxt = [], None
        if step < world - 1:
            nxt = _empty_block(plan, (src - 1) % world, k.dtype, k.device)
            kv_reqs = _exchange(plan, cur, nxt, _TAG_KV, traffic)
        kv = (cur[0].to(plan.cdt), cur[1].to(plan.cdt))
        dk_blk, dv_blk = _block_backward(plan, (qg, dOg, lse_g, delta), kv, src, dq, counts)
        if dkv_in is not None:  # the accumulators the previous ranks built for this block
            traffic.wait(dkv_reqs)
            dk_blk.add_(dkv_in[0])
            dv_blk.add_(dkv_in[1])
        if world > 1:  # pass them on (after the last step: home to the block's owner)
            dkv_in = _empty_block(plan, (src - 1) % world, plan.cdt, k.device)
            dkv_reqs = _exchange(plan, [dk_blk, dv_blk], dkv_in, _TAG_DKV, traffic)
        if nxt is not None:
            traffic.wait(kv_reqs)
            cur = nxt
    if world > 1:
        traffic.wait(dkv_reqs)
        assert dkv_in is not None
        dk, dv = dkv_in
    else:
        dk, dv = dk_blk, dv_blk
    return dq.reshape(q.shape).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), traffic.stats(plan.ring, counts)


# --------------------------------------------------------------------------------------------------------------
# public API


def ring_attention_forward(  # 13 parameters: the public keywords, one RingOptions below
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: Any = False,
    scale: float | None = None,
    key_lengths: Any = None,
    query_lengths: Any = None,
    layout: Layout = "contiguous",
    masked_rows: MaskedRows = "raise",
    block_q: int = _DEFAULT_BLOCK,
    block_k: int = _DEFAULT_BLOCK,
    group: Any = None,
) -> RingResult:
    """Exact attention for this rank's queries over the whole (sharded) sequence; call it on every rank of ``group``.

    ``out_i = Σ_j softmax_j(scale · q_i·k_j, allowed) v_j`` over all global keys j, computed by passing the key/value
    shards around the ring.

    Args:
        q: this rank's queries ``[..., h, n_r, d_k]`` (a torch tensor; rows at the layout's global positions).
        k: this rank's keys ``[..., h_kv, n_r', d_k]``; ``h_kv`` divides ``h`` (GQA / MQA when smaller).
        v: this rank's values ``[..., h_kv, n_r', d_v]``.
        causal: False, True (needs global n_q == n_k), ``"top_left"`` or ``"bottom_right"``, as in the core, on the
            *global* positions.
        scale: multiplies ``q kᵀ``; default ``1/sqrt(d_k)``.
        key_lengths: ``[B]`` (or one shared) key lengths: key j of sequence b is padding when j >= key_lengths[b]
            (needs q ``[B, ..., h, n_r, d_k]``).
        query_lengths: ``[B]``: queries at i >= query_lengths[b] are padding; their rows are fully masked.
        layout: how the sequence was sharded: ``"contiguous"`` or ``"zigzag"`` (balanced causal work), see
            :class:`~attnlab.distributed.RingLayout`. Global n is the sum of the ranks' shard lengths.
        masked_rows: what a row with no allowed key becomes: ``"raise"`` (a MaskedRowError on every rank),
            ``"zero"`` (output 0, as FlashAttention) or ``"nan"``.
        block_q, block_k: tile sizes of the local online softmax (memory per rank O(n_r · d + block_q · block_k)).
        group: the ``torch.distributed`` process group (default: the world; uninitialized = one local rank).

    Returns:
        :class:`RingResult` with ``output [..., h, n_r, d_v]`` and ``lse [..., h, n_r]``.

    >>> import torch
    >>> q = torch.randn(1, 2, 7, 4, dtype=torch.float64)
    >>> r = ring_attention_forward(q, q[:, :1], q[:, :1], causal=True, block_q=3, block_k=2)  # P = 1, GQA 2:1
    >>> import attnlab
    >>> ref = attnlab.scaled_dot_product_attention(q, q[:, :1], q[:, :1], causal=True)
    >>> bool(torch.allclose(r.output, ref)), r.stats.tiles_skipped
    (True, 3)
    """
    options = RingOptions(causal, scale, key_lengths, query_lengths, layout, masked_rows, block_q, block_k, group)
    plan = _make_plan(q, k, v, options)
    out, lse, stats = _forward(plan, q, k, v)
    return RingResult(
        output=out.to(q.dtype),
        lse=lse,
        masked_rows=plan.masked_rows,
        policy=plan.core.masked_rows,
        layout=plan.layout_q,
        stats=stats,
        inputs=(q, k, v),
        options=options,
    )


def ring_attention_backward(result: RingResult, d_out: Any) -> RingGrads:
    """Gradients for this rank's ``q, k, v`` shards from its forward's result and ``d_out = ∂loss/∂output``.

    ``result`` is this rank's :class:`RingResult` (its output, ``lse``, inputs and options: nothing is repeated, no
    attention matrix is kept). Fully masked rows get zero gradient. Call it on every rank.

    Shapes: ``d_out [..., h, n_r, d_v]``; returns :class:`RingGrads` ``dq [..., h, n_r, d_k]``,
    ``dk [..., h_kv, n_r', d_k]``, ``dv [..., h_kv, n_r', d_v]``.

    >>> import torch
    >>> q = torch.randn(1, 2, 6, 4, dtype=torch.float64)
    >>> fwd = ring_attention_forward(q, q, q, causal=True, block_q=4, block_k=2)
    >>> ring_attention_backward(fwd, torch.ones_like(fwd.output)).dq.shape
    torch.Size([1, 2, 6, 4])
    """
    if not isinstance(result, RingResult):
        raise _errors.DTypeError(
            f"result: expected the RingResult ring_attention_forward returned (it holds the forward's inputs and "
            f"options), got {type(result).__name__}"
        )
    if result.inputs is None or result.options is None:
        raise OptionError(
            "result: a RingResult without the forward's inputs; pass what ring_attention_forward returned"
        )
    return _gradients(*result.inputs, result.output, result.lse, d_out, result.options)


def _gradients(q: Any, k: Any, v: Any, output: Any, lse: Any, d_out: Any, options: RingOptions) -> RingGrads:
    """The ring backward of one rank (shapes as in :func:`ring_attention_backward`)."""
    plan = _make_plan(q, k, v, options)
    want = (*q.shape[:-1], v.shape[-1])
    for name, x, shape in (("d_out", d_out, want), ("output", output, want), ("lse", lse, tuple(q.shape[:-1]))):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != tuple(shape):
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ShapeError(f"{name}: expected a tensor of shape {tuple(shape)}, got {got}")
    dq, dk, dv, stats = _backward(plan, d_out, q, k, v, output, lse)
    return RingGrads(dq=dq, dk=dk, dv=dv, stats=stats)


class _RingAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, plan: _Plan) -> Any:
        out, lse, _ = _forward(plan, q, k, v)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx: Any, dO: Any) -> Any:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv, _ = _backward(ctx.plan, dO.contiguous(), q, k, v, out, lse)
        return dq, dk, dv, None


@same_arguments(ring_attention_forward)
def ring_attention(q: Any, k: Any, v: Any, **options: Any) -> Any:
    """Differentiable ring attention: :func:`ring_attention_forward`'s ``output``, with a backward that runs the
    ring again (``loss.backward()`` on every rank gives each rank the gradients of its own shards).

    Arguments (the same signature) as in :func:`ring_attention_forward`. Shapes: ``q [..., h, n_r, d_k]``,
    ``k [..., h_kv, n_r', d_k]``, ``v [..., h_kv, n_r', d_v]`` -> ``[..., h, n_r, d_v]``.

    >>> import torch
    >>> q = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    >>> ring_attention(q, q, q, causal=True).sum().backward()
    >>> q.grad.shape
    torch.Size([2, 5, 3])
    """
    plan = _make_plan(q, k, v, RingOptions(**options))
    return _RingAttentionFunction.apply(q, k, v, plan)
