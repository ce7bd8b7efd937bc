"""The KV cache (article 001 §14): keep every past token's keys and values, compute only the new token's query.

One :class:`KVCache` per layer holds ``K [B, h_kv, L, d_k]`` and ``V [B, h_kv, L, d_v]`` in preallocated buffers
that grow by doubling, a length per sequence (sequences of a batch may be at different positions), and works for
MHA, GQA and MQA (``h_kv`` may be any divisor of the query heads). A decode step appends the new token's k/v and
then runs :func:`cached_attention`: the ``t`` newest queries attend, bottom-right aligned, to everything cached
for their sequence, which gives exactly the rows of one full causal forward.

Memory is the article's formula ``B · L · layers · h_kv · d_head · 2 · bytes`` (:attr:`KVCache.nbytes` for one
layer; :func:`attnlab.cost.kv_cache_bytes` for a model).

Padded batches follow one rule: ``append(..., lengths=)`` stores only each sequence's real tokens, and the next
:func:`cached_attention` gives that sequence's padding queries 0 (``lengths[b] = 0``: all of them). Storage in
float16 or bfloat16 refuses a value it cannot hold (:class:`~attnlab.errors.RangeError`) instead of storing inf;
logits that overflow raise :class:`~attnlab.errors.RangeError` too. Queries that require grad get gradients
(:mod:`attnlab.kernels.autograd`); the cached keys and values are detached copies, and appending tensors that
require grad is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._arrays import device_of, index_tuples, namespace, shape_of, to_numpy
from ..core.inputs import MaskedRows, check_finite, check_policy, resolve_scale
from ..core.softmax import masked_softmax
from ..errors import DTypeError, MaskedRowError, OptionError, RangeError, ShapeError
from ..masks import MaskSpec, real_tokens
from ..validate import check_int
from . import autograd
from .config import current as current_config
from .overflow import factor_overflow_error, logits_overflow_error

__all__ = ["KVCache", "cached_attention", "decode_step"]


def _storage_dtype(dtype: Any) -> np.dtype:
    """The cache's storage dtype: a NumPy float dtype, or bfloat16 (``"bfloat16"``, ``torch.bfloat16`` or
    ``ml_dtypes.bfloat16``; NumPy has none of its own, so it needs ``ml_dtypes``, which comes with jax)."""
    if "bfloat16" in str(dtype):
        try:
            import ml_dtypes
        except ImportError:
            raise DTypeError(
                "dtype: bfloat16 storage needs ml_dtypes (NumPy has no bfloat16): pip install ml_dtypes"
            ) from None
        bf16: np.dtype = np.dtype(ml_dtypes.bfloat16)
        return bf16
    try:
        dt: np.dtype = np.dtype(dtype)
    except TypeError:
        raise DTypeError(f"dtype: {dtype!r} is not a NumPy dtype") from None
    if dt.kind != "f":
        raise DTypeError(f"dtype: expected a floating dtype (float16, bfloat16, float32, float64), got {dt}")
    return dt


def _finfo_max(dt: np.dtype) -> float:
    if dt.name == "bfloat16":
        import ml_dtypes

        return float(ml_dtypes.finfo(dt).max)
    return float(np.finfo(dt).max)


class KVCache:
    """One layer's key/value cache for a batch of sequences, each with its own length.

    Args:
        batch: number of sequences B.
        num_kv_heads: key/value heads h_kv (GQA/MQA: fewer than the query heads).
        head_dim: d_k.
        head_dim_v: d_v (default d_k).
        capacity: initial room in tokens; the buffers double when a sequence outgrows them.
        dtype: storage dtype (float32 default; float16 or bfloat16 halve the memory, attention still computes in
            float32). :meth:`append` refuses a value the storage dtype cannot hold (a
            :class:`~attnlab.errors.RangeError`): float16 would store 1e5 as ``inf`` and every later step would
            be NaN.

    Shapes: :attr:`keys` ``[B, h_kv, L, d_k]``, :attr:`values` ``[B, h_kv, L, d_v]`` with ``L = max(lengths)``
    (views, no copy; positions ``>= lengths[b]`` of a shorter sequence hold zeros), :attr:`lengths` ``[B]``.

    Padding: ``append(k_new, v_new, lengths=)`` appends only the first ``lengths[b]`` of the ``t`` new tokens of
    sequence b; the rest is padding, never stored. The following :func:`cached_attention` treats query rows
    ``i >= lengths[b]`` of that sequence as padding too (their output is 0), so ``lengths=[0]`` appends nothing
    and gives that sequence an all-zero output.

    The cache stores copies without autograd history: :meth:`append` refuses PyTorch tensors that require grad
    (a :class:`~attnlab.errors.DTypeError`) rather than silently cut their gradient; queries may require grad.

    >>> c = KVCache(1, 2, 4, capacity=2)
    >>> c.append(np.ones((1, 2, 3, 4)), np.ones((1, 2, 3, 4)))
    >>> c.keys.shape, c.lengths.tolist(), c.capacity
    ((1, 2, 3, 4), [3], 4)
    >>> c.nbytes  # B · L · h_kv · d_head · 2 · bytes = 1 · 3 · 2 · 4 · 2 · 4
    192
    """

    def __init__(
        self,
        batch: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        head_dim_v: int | None = None,
        capacity: int = 256,
        dtype: Any = np.float32,
    ) -> None:
        self.batch = check_int("batch", batch, minimum=1)
        self.num_kv_heads = check_int("num_kv_heads", num_kv_heads, minimum=1)
        self.head_dim = check_int("head_dim", head_dim, minimum=1)
        self.head_dim_v = self.head_dim if head_dim_v is None else check_int("head_dim_v", head_dim_v, minimum=1)
        cap = check_int("capacity", capacity, minimum=1)
        self.dtype = _storage_dtype(dtype)
        self._k, self._v = self._alloc(cap, "capacity")
        self._lengths = np.zeros(self.batch, dtype=np.int64)
        self._last = np.zeros(self.batch, dtype=np.int64)
        self._last_width: int | None = None  # t of the last append; None: nothing appended since creation/reset

    # ---------------------------------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Tokens each sequence has room for before the buffers grow."""
        return int(self._k.shape[2])

    @property
    def lengths(self) -> np.ndarray:
        """``[B]`` tokens cached per sequence (a copy)."""
        return self._lengths.copy()

    @property
    def last_appended(self) -> np.ndarray:
        """``[B]`` tokens the last :meth:`append` added per sequence (a copy)."""
        return self._last.copy()

    @property
    def max_length(self) -> int:
        """The longest sequence's cached length (L of :attr:`keys` and :attr:`values`)."""
        return int(self._lengths.max())

    @property
    def keys(self) -> np.ndarray:
        """``[B, h_kv, L, d_k]``, L = max(lengths): a read-only view of the cache."""
        k = self._k[:, :, : self.max_length]
        k.flags.writeable = False
        return k

    @property
    def values(self) -> np.ndarray:
        """``[B, h_kv, L, d_v]``, L = max(lengths): a read-only view of the cache."""
        v = self._v[:, :, : self.max_length]
        v.flags.writeable = False
        return v

    @property
    def nbytes(self) -> int:
        """Bytes of cached keys and values: ``B · L · h_kv · (d_k + d_v) · bytes`` with L = max(lengths).

        With ``d_k == d_v == d_head`` this is the article's ``B · L · h_kv · d_head · 2 · bytes`` for one layer.
        """
        return (
            self.batch * self.max_length * self.num_kv_heads * (self.head_dim + self.head_dim_v) * self.dtype.itemsize
        )

    @property
    def allocated_nbytes(self) -> int:
        """Bytes actually allocated (the capacity, which grows by doubling)."""
        return self._k.nbytes + self._v.nbytes

    def __repr__(self) -> str:
        return (
            f"KVCache(batch={self.batch}, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"head_dim_v={self.head_dim_v}, lengths={self._lengths.tolist()}, capacity={self.capacity}, "
            f"dtype={self.dtype})"
        )

    # ---------------------------------------------------------------------------------------------------------
    def _alloc(self, cap: int, why: str) -> tuple[np.ndarray, np.ndarray]:
        """Zeroed K and V buffers for ``cap`` tokens (an :class:`~attnlab.errors.OptionError` naming ``why`` if the
        memory cannot be had)."""
        shapes = (
            (self.batch, self.num_kv_heads, cap, self.head_dim),
            (self.batch, self.num_kv_heads, cap, self.head_dim_v),
        )
        try:
            return np.zeros(shapes[0], dtype=self.dtype), np.zeros(shapes[1], dtype=self.dtype)
        except (MemoryError, ValueError):
            need = self.batch * self.num_kv_heads * cap * (self.head_dim + self.head_dim_v) * self.dtype.itemsize
            raise OptionError(
                f"{why}: room for {cap} tokens needs {need / 2**30:.3g} GiB "
                f"(B·h_kv·tokens·(d_k + d_v)·bytes), which cannot be allocated; ask for less"
            ) from None

    def _grow(self, need: int) -> None:
        cap = self.capacity
        while cap < need:
            cap *= 2
        if cap == self.capacity:
            return
        n = self.max_length
        k, v = self._alloc(cap, f"append: growing to {need} tokens")
        k[:, :, :n] = self._k[:, :, :n]
        v[:, :, :n] = self._v[:, :, :n]
        self._k, self._v = k, v

    def _stored(self, name: str, x: np.ndarray, real: np.ndarray) -> np.ndarray:
        """``x`` in the storage dtype, or a :class:`~attnlab.errors.RangeError` if a real (non-padding) value does
        not fit it. ``real`` is ``[B, t]``, True for the tokens that will be stored."""
        if x.dtype == self.dtype:
            return x
        with np.errstate(over="ignore"):
            y = x.astype(self.dtype)
        lost = ~np.isfinite(y) & real[:, None, :, None]
        if lost.any():
            where = tuple(int(i) for i in np.argwhere(lost)[0])
            raise RangeError(
                f"{name}: {float(x[where]):.7g} at index {where} does not fit in the cache's {self.dtype} (largest "
                f"finite {_finfo_max(self.dtype):.7g}): it would be stored as inf and every later step would be NaN. "
                f"Use KVCache(..., dtype=np.float32) or scale the keys/values down"
            )
        return y

    def append(self, k_new: Any, v_new: Any, *, lengths: Any = None) -> None:
        """Append new tokens' keys and values to each sequence.

        Args:
            k_new: ``[B, h_kv, t, d_k]`` keys of the t new tokens.
            v_new: ``[B, h_kv, t, d_v]`` values.
            lengths: ``[B]`` ints: sequence b appends only its first ``lengths[b]`` new tokens (the rest is
                padding, not stored; the next :func:`cached_attention` gives its padding queries 0); default t
                for all.

        Nothing is stored if an argument is refused: shapes, dtypes, NaN/inf (:class:`~attnlab.errors.NonFiniteError`),
        a real value beyond the storage dtype's range (:class:`~attnlab.errors.RangeError`), tensors that require
        grad (:class:`~attnlab.errors.DTypeError`).
        """
        autograd.refuse_grad("KVCache.append (the cache stores detached copies)", k_new=k_new, v_new=v_new)
        kn, vn = to_numpy(k_new), to_numpy(v_new)
        want_k = (self.batch, self.num_kv_heads, None, self.head_dim)
        want_v = (self.batch, self.num_kv_heads, None, self.head_dim_v)
        for name, x, want, legend in (("k_new", kn, want_k, "d_k"), ("v_new", vn, want_v, "d_v")):
            if x.ndim != 4 or x.shape[:2] != want[:2] or x.shape[3] != want[3]:
                raise ShapeError(
                    f"{name}: shape {x.shape}, expected [B={self.batch}, h_kv={self.num_kv_heads}, t, "
                    f"{legend}={want[3]}]"
                )
            if x.dtype.kind not in "fiu":
                raise DTypeError(f"{name}: dtype {x.dtype} is not a real number dtype")
            check_finite(np, x, name)
        if kn.shape[2] != vn.shape[2]:
            raise ShapeError(f"v_new: {vn.shape[2]} new tokens (dim 2) but k_new has {kn.shape[2]}")
        t = kn.shape[2]
        if lengths is None:
            new = np.full(self.batch, t, dtype=np.int64)
        else:
            new = to_numpy(lengths)
            if new.shape != (self.batch,) or not np.issubdtype(new.dtype, np.integer):
                raise ShapeError(f"lengths: expected {self.batch} ints [B], got shape {new.shape} dtype {new.dtype}")
            new = new.astype(np.int64)
        real = real_tokens(new, t, size="t")  # [B, t]
        kn, vn = self._stored("k_new", kn, real), self._stored("v_new", vn, real)
        self._grow(int((self._lengths + new).max()))
        if lengths is None and (self._lengths == self._lengths[0]).all():
            s = int(self._lengths[0])
            self._k[:, :, s : s + t] = kn
            self._v[:, :, s : s + t] = vn
        else:
            for b in range(self.batch):
                s, n = int(self._lengths[b]), int(new[b])
                self._k[b, :, s : s + n] = kn[b, :, :n]
                self._v[b, :, s : s + n] = vn[b, :, :n]
        self._lengths += new
        self._last = new
        self._last_width = t

    def reset(self) -> None:
        """Forget every cached token (the buffers are kept, zeroed where they were used)."""
        n = self.max_length
        self._k[:, :, :n] = 0
        self._v[:, :, :n] = 0
        self._lengths[:] = 0
        self._last[:] = 0
        self._last_width = None


@dataclass
class _Saved:
    """What the backward of :func:`cached_attention` needs (copies: the cache may change after the call)."""

    q: np.ndarray  # [B, h, t, d_k], compute dtype
    k: np.ndarray  # [B, h_kv, L, d_k]
    v: np.ndarray  # [B, h_kv, L, d_v]
    out: np.ndarray  # [B, h_kv, g, t, d_v], before padding rows were zeroed
    lse: np.ndarray  # [B, h_kv, g, t] nats, -inf on empty rows
    spec: MaskSpec  # the step's mask: bottom-right causal from each sequence's position, its cached length
    real: np.ndarray  # [B, t]
    empty: np.ndarray  # [B, h_kv, g, t] real rows with no key
    scale: float
    masked_rows: str
    q_like: Any  # the caller's q (library, dtype, device of dq)

    def backward(self, d_out: Any) -> Any:
        """``dq`` from ``d_out [B, h, t, d_v]``: FlashAttention-2's backward per sequence (padding rows: 0)."""
        from .tiled import FlashResult, TiledOptions, flash_attention_backward

        if self.masked_rows == "nan" and self.empty.any():
            raise MaskedRowError(
                "cache: a real query row had no cached key (output NaN under masked_rows='nan'); NaN has no "
                "gradient: use masked_rows='zero' for a zero output and a zero gradient",
                index_tuples(self.empty.reshape(self.q.shape[:3])),
            )
        B, h, t, d_k = self.q.shape
        h_kv = self.k.shape[1]
        g = h // h_kv
        cdt = self.q.dtype
        do = to_numpy(d_out).astype(cdt).reshape(B, h_kv, g, t, -1) * self.real[:, None, None, :, None]
        dq = np.zeros((B, h_kv, g, t, d_k), dtype=cdt)
        for b in range(B):
            if self.spec.n_keys(b) == 0:
                continue
            inputs = (self.q[b].reshape(h_kv, g, t, d_k), self.k[b, :, None], self.v[b, :, None], None)
            opts = TiledOptions(mask=self.spec.sequence(b), scale=self.scale, masked_rows="zero")
            forward = FlashResult(output=self.out[b], lse=self.lse[b], inputs=inputs, options=opts)
            gr = flash_attention_backward(forward, do[b])
            dq[b] = gr.dq
        dq = dq.reshape(B, h, t, d_k)
        import torch

        return torch.as_tensor(dq, device=self.q_like.device).to(self.q_like.dtype)


def _cached(
    qn: np.ndarray, cache: KVCache, sc: float, masked_rows: str, n_new: np.ndarray, keep: bool
) -> tuple[np.ndarray, _Saved | None]:
    """The attention of ``qn [B, h, t, d_k]`` to the cache in the compute dtype ``[B, h, t, d_v]``; with ``keep``,
    also what the backward needs."""
    B, h, t, d_k = qn.shape
    h_kv = cache.num_kv_heads
    g = h // h_kv
    cdt: Any = np.float64 if qn.dtype == np.float64 and cache.dtype == np.float64 else np.float32
    lengths = cache.lengths
    L = max(1, int(lengths.max()))
    start = np.maximum(lengths - n_new, 0)  # [B] position of query 0 (< 0 only before any append: no key then)
    spec = MaskSpec(causal=True, q_offset=start, key_lengths=lengths).sized(t, L, B)  # bottom-right, per sequence
    real = real_tokens(n_new, t, size="t")  # [B, t] padding queries of short appends are not real
    if abs(sc) > float(np.finfo(cdt).max):  # both paths compute in cdt: its logit factor must be finite there
        raise factor_overflow_error("scale / temperature", sc, np.dtype(cdt).name, scale=sc, temperature=1.0)
    qc = qn.astype(cdt, copy=False)
    out = np.zeros((B, h_kv, g, t, cache.head_dim_v), dtype=cdt)
    lse = np.full((B, h_kv, g, t), -np.inf, dtype=cdt)
    K = cache._k[:, :, :L].astype(cdt, copy=keep)  # [B, h_kv, L, d_k]
    V = cache._v[:, :, :L].astype(cdt, copy=keep)
    # above the dense limit (attnlab.kernels.config, 4 Mi entries), the tiled kernel instead of one dense product
    if B * h * t * L <= current_config().dense_limit:
        qg = qc.reshape(B, h_kv, g * t, d_k)  # GQA: a kv head's g query heads as rows
        with np.errstate(over="ignore", invalid="ignore"):
            s = (qg @ np.swapaxes(K, -1, -2)) * cdt(sc)  # [B, h_kv, g·t, L]
        allowed = spec.to_array((B, t, L))  # bottom-right causal, cached lengths
        allowed = np.broadcast_to(allowed[:, None, None], (B, 1, g, t, L)).reshape(B, 1, g * t, L)
        _check_logits(s, allowed, qc, K, sc, (B, h_kv, g, t, L))
        w, lse_d, empty = masked_softmax(s, allowed)
        out = _weighted_values(w, V).reshape(B, h_kv, g, t, -1)
        lse = lse_d.reshape(B, h_kv, g, t)
        empty = empty.reshape(B, h_kv, g, t)
    else:
        from .tiled import flash_attention

        empty = np.zeros((B, h_kv, g, t), dtype=bool)
        for b in range(B):
            if spec.n_keys(b) == 0:
                empty[b] = True
                continue
            r = flash_attention(
                qc[b].reshape(h_kv, g, t, d_k),
                K[b, :, None],
                V[b, :, None],
                mask=spec.sequence(b),
                scale=sc,
                masked_rows="zero",
            )
            out[b] = r.output
            lse[b] = r.lse
            empty[b] = np.isneginf(r.lse)
    empty &= real[:, None, None, :]
    saved = None
    if keep:
        saved = _Saved(qc.copy(), K, V, out, lse, spec, real, empty, sc, masked_rows, None)
    out = np.where(real[:, None, None, :, None], out, 0).astype(cdt, copy=False)  # padding queries -> 0
    if empty.any():
        rows = index_tuples(empty.reshape(B, h, t))
        if masked_rows == "raise":
            raise MaskedRowError(
                f"cache: {len(rows)} query row(s) have no cached key to attend to, at (batch, head, query) "
                f"{', '.join(map(str, rows[:8]))}; append the new tokens' k/v before attending",
                rows,
            )
        if masked_rows == "nan":
            out[empty] = np.nan
    return out.reshape(B, h, t, -1), saved


def _weighted_values(w: np.ndarray, V: np.ndarray) -> np.ndarray:
    """``w @ V`` (``w [B, h_kv, g·t, L]`` rows of weights that sum to 1, ``V [B, h_kv, L, d_v]``) that does not
    overflow when V is near its dtype's largest value: each output is a convex combination of the values, so it lies
    within ``[min V, max V]``; near the limit V is divided by a power of two (exact), the product clipped to that
    range (rounding of many tied weights could pass it, which became inf) and multiplied back (exact)."""
    v_max = float(np.abs(V).max(initial=0.0))
    room = float(np.finfo(V.dtype).max) / 4
    if v_max <= room:
        product: np.ndarray = w @ V
        return product
    shift = math.ceil(math.log2(v_max / room))
    Vs = np.ldexp(V, -shift)
    out = np.clip(w @ Vs, Vs.min(axis=-2, keepdims=True), Vs.max(axis=-2, keepdims=True))
    scaled: np.ndarray = np.ldexp(out, shift)
    return scaled


def _check_logits(
    s: np.ndarray, allowed: np.ndarray, q: np.ndarray, k: np.ndarray, sc: float, full: tuple[int, ...]
) -> None:
    """A :class:`~attnlab.errors.RangeError` if an allowed logit ``s [B, h_kv, g·t, L]`` is not finite."""
    bad = ~np.isfinite(s)
    if not bad.any():
        return
    bad &= allowed
    if not bad.any():
        return
    B, h_kv, g, t, L = full
    b, hk, row, j = (int(x) for x in np.argwhere(bad)[0])
    raise logits_overflow_error(
        (b, hk * g + row // t, row % t, j),
        float(s[b, hk, row, j]),
        int(bad.sum()),
        (B, h_kv * g, t, L),
        str(s.dtype),
        q_max=float(np.abs(q).max()),
        k_max=float(np.abs(k).max()),
        bias_max=None,
        scale=sc,
        temperature=1.0,
        index_layout="(batch, head, query, key)",
    )


def cached_attention(q: Any, cache: KVCache, *, scale: float | None = None, masked_rows: MaskedRows = "raise") -> Any:
    """Attention of the newest tokens to everything cached, bottom-right aligned (a decode or prefill step).

    The cache already holds the new tokens (call :meth:`KVCache.append` first). The t queries are the t newest
    tokens: query i of sequence b sits at position ``lengths[b] - t_b + i`` with ``t_b = min(t,
    last_appended[b])`` and sees keys ``j <=`` that position, exactly its row of a full causal forward.
    (Top-left alignment would let the first new token see only key 0: wrong.) Query rows ``i >= t_b`` are
    padding: their output is 0 (a sequence that appended fewer tokens with ``append(..., lengths=)``, down to
    ``lengths[b] = 0``: all its rows). ``t`` may not exceed the width of the last append (the ``t`` of its
    ``k_new``, padding included). Before any append (or after :meth:`KVCache.reset`) every query is real and has
    nothing to see: ``masked_rows`` decides.

    Args:
        q: ``[B, h, t, d_k]`` queries of the t newest tokens; ``h`` a multiple of the cache's ``h_kv`` (GQA:
            query head i reads kv head ``i // (h / h_kv)``). A PyTorch tensor that requires grad gets its gradient
            through attnlab's backward (:func:`~attnlab.kernels.tiled.flash_attention_backward`, per sequence).
        cache: the layer's :class:`KVCache`.
        scale: default ``1/sqrt(d_k)``.
        masked_rows: for a real query with nothing to see (an empty cache): "raise", "zero" or "nan".

    Returns:
        ``[B, h, t, d_v]`` in q's dtype (computed in float32, or float64 for float64 q and cache). Logits that
        overflow the compute dtype from finite inputs raise :class:`~attnlab.errors.RangeError`.

    >>> rng = np.random.default_rng(0)
    >>> k, v, q = (rng.standard_normal((1, 1, 5, 4)) for _ in range(3))
    >>> c = KVCache(1, 1, 4, dtype=np.float64)
    >>> c.append(k[:, :, :4], v[:, :, :4])
    >>> c.append(k[:, :, 4:], v[:, :, 4:])
    >>> import attnlab
    >>> full = attnlab.scaled_dot_product_attention(q, k, v, causal=True)
    >>> bool(np.allclose(cached_attention(q[:, :, 4:], c), full[:, :, 4:]))
    True
    """
    if not isinstance(cache, KVCache):
        raise DTypeError(f"cache: expected a KVCache, got {type(cache).__name__}")
    check_policy(masked_rows)
    if isinstance(q, (list, tuple)):
        q = np.asarray(q)
    if not hasattr(q, "shape"):
        raise DTypeError(f"q: expected an array, got {type(q).__name__}")
    xp = namespace(q)
    qn = to_numpy(q)
    qs = shape_of(qn)
    if len(qs) != 4 or qs[0] != cache.batch or qs[3] != cache.head_dim:
        raise ShapeError(
            f"q: shape {qs}, expected [B={cache.batch}, h, t, d_k={cache.head_dim}] for this cache "
            f"({cache.batch} sequences, {cache.num_kv_heads} kv heads)"
        )
    B, h, t, d_k = qs
    h_kv = cache.num_kv_heads
    if h % h_kv:
        raise ShapeError(
            f"q: {h} heads (dim 1) is not a multiple of the cache's {h_kv} kv heads (GQA needs h % h_kv == 0)"
        )
    if qn.dtype.kind not in "fiu":
        raise DTypeError(f"q: dtype {qn.dtype} is not a real number dtype")
    check_finite(np, qn, "q")
    width = cache._last_width
    if width is None:
        n_new = np.full(B, t, dtype=np.int64)  # nothing appended yet: every query is real and has nothing to see
    else:
        if t > width:
            raise ShapeError(
                f"q: {t} query tokens (dim 2), but the last append was {width} token(s) wide; pass one query per "
                f"new token, at most as many as appended (the cache must already hold them: append first)"
            )
        n_new = np.minimum(cache.last_appended, t)  # [B] real queries per sequence: the newest n_new[b] tokens
    sc = resolve_scale(scale, d_k)
    if autograd.wants_grad(q):

        def run(q_detached: Any) -> tuple[Any, _Saved]:
            out, saved = _cached(to_numpy(q_detached), cache, sc, masked_rows, n_new, keep=True)
            assert saved is not None  # keep=True
            saved.q_like = q
            return _to_caller(xp, q, out), saved

        return autograd.cached_function(q, run)
    out, _ = _cached(qn, cache, sc, masked_rows, n_new, keep=False)
    return _to_caller(xp, q, out)


def _to_caller(xp: Any, q: Any, out: np.ndarray) -> Any:
    """``out`` (compute dtype) in q's library and dtype (float64 for integer q); a finite value that the narrower
    dtype (float16, bfloat16) cannot hold is a :class:`~attnlab.errors.RangeError`, not an inf."""
    qdt = q.dtype
    if xp is np:
        dt = qdt if qdt.kind == "f" else np.dtype(np.float64)
        with np.errstate(over="ignore"):
            y = out.astype(dt, copy=False)
        lost = ~np.isfinite(y) & np.isfinite(out)
    else:
        dt = qdt if xp.isdtype(qdt, "real floating") else xp.float64
        y = xp.astype(xp.asarray(out, device=device_of(q)), dt)
        lost = ~np.isfinite(to_numpy(y)) & np.isfinite(out)
    if lost.any():
        where = tuple(int(i) for i in np.argwhere(lost)[0])
        raise RangeError(
            f"output: {float(out[where]):.7g} at index {where} does not fit in {str(dt).replace('torch.', '')}, q's "
            f"dtype it is returned in; pass float32 queries (then the result is float32) or scale the values down"
        )
    return y


def decode_step(
    cache: KVCache,
    q: Any,
    k_new: Any,
    v_new: Any,
    *,
    lengths: Any = None,
    scale: float | None = None,
    masked_rows: MaskedRows = "raise",
) -> Any:
    """One decode (or chunked-prefill) step: append the new tokens' k/v to ``cache``, then attend.

    Shapes: ``q [B, h, t, d_k]``, ``k_new [B, h_kv, t, d_k]``, ``v_new [B, h_kv, t, d_v]``; returns
    ``[B, h, t, d_v]``, the rows of a full causal forward for these t tokens. ``lengths`` as in
    :meth:`KVCache.append`; the rest as in :func:`cached_attention`.

    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((1, 2, 3, 4)) for _ in range(3))
    >>> c = KVCache(1, 2, 4, dtype=np.float64)
    >>> steps = [decode_step(c, q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1]) for i in range(3)]
    >>> import attnlab
    >>> bool(np.allclose(np.concatenate(steps, axis=2), attnlab.scaled_dot_product_attention(q, k, v, causal=True)))
    True
    """
    if not isinstance(cache, KVCache):
        raise DTypeError(f"cache: expected a KVCache, got {type(cache).__name__}")
    cache.append(k_new, v_new, lengths=lengths)
    return cached_attention(q, cache, scale=scale, masked_rows=masked_rows)
