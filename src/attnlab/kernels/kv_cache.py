"""The KV cache (article 001 §14): keep every past token's keys and values, compute only the new token's query.

One :class:`KVCache` per layer holds ``K [B, h_kv, L, d_k]`` and ``V [B, h_kv, L, d_v]`` in preallocated buffers
that grow by doubling, a length per sequence (sequences of a batch may be at different positions), and works for
MHA, GQA and MQA (``h_kv`` may be any divisor of the query heads). A decode step appends the new token's k/v and
then runs :func:`cached_attention`: the ``t`` newest queries attend, bottom-right aligned, to everything cached
for their sequence, which gives exactly the rows of one full causal forward.

Memory is the article's formula ``B · L · layers · h_kv · d_head · 2 · bytes`` (:attr:`KVCache.nbytes` for one
layer; :func:`attnlab.cost.kv_cache_bytes` for a model).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._arrays import index_tuples, namespace, shape_of, to_numpy
from ..core.inputs import check_finite, check_policy, resolve_scale
from ..core.softmax import masked_softmax
from ..errors import DTypeError, MaskedRowError, ShapeError

__all__ = ["KVCache", "cached_attention", "decode_step"]

#: Above this many score entries per call, cached_attention runs the tiled kernel instead of one dense product.
_DENSE_LIMIT = 1 << 22


def _pos_int(name: str, x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
        raise ShapeError(f"{name}: expected a positive int, got {x!r}")
    return int(x)


class KVCache:
    """One layer's key/value cache for a batch of sequences, each with its own length.

    Args:
        batch: number of sequences B.
        num_kv_heads: key/value heads h_kv (GQA/MQA: fewer than the query heads).
        head_dim: d_k.
        head_dim_v: d_v (default d_k).
        capacity: initial room in tokens; the buffers double when a sequence outgrows them.
        dtype: storage dtype (float32 default; float16 halves the memory, attention still computes in float32).

    Shapes: :attr:`keys` ``[B, h_kv, L, d_k]``, :attr:`values` ``[B, h_kv, L, d_v]`` with ``L = max(lengths)``
    (views, no copy; positions ``>= lengths[b]`` of a shorter sequence hold zeros), :attr:`lengths` ``[B]``.

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
        self.batch = _pos_int("batch", batch)
        self.num_kv_heads = _pos_int("num_kv_heads", num_kv_heads)
        self.head_dim = _pos_int("head_dim", head_dim)
        self.head_dim_v = self.head_dim if head_dim_v is None else _pos_int("head_dim_v", head_dim_v)
        cap = _pos_int("capacity", capacity)
        try:
            self.dtype = np.dtype(dtype)
        except TypeError:
            raise DTypeError(f"dtype: {dtype!r} is not a NumPy dtype") from None
        if self.dtype.kind != "f":
            raise DTypeError(f"dtype: expected a floating dtype (float16, float32, float64), got {self.dtype}")
        self._k = np.zeros((self.batch, self.num_kv_heads, cap, self.head_dim), dtype=self.dtype)
        self._v = np.zeros((self.batch, self.num_kv_heads, cap, self.head_dim_v), dtype=self.dtype)
        self._lengths = np.zeros(self.batch, dtype=np.int64)
        self._last = np.zeros(self.batch, dtype=np.int64)

    # ---------------------------------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Tokens each sequence has room for before the buffers grow."""
        return self._k.shape[2]

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
    def _grow(self, need: int) -> None:
        cap = self.capacity
        while cap < need:
            cap *= 2
        if cap == self.capacity:
            return
        n = self.max_length
        k = np.zeros((self.batch, self.num_kv_heads, cap, self.head_dim), dtype=self.dtype)
        v = np.zeros((self.batch, self.num_kv_heads, cap, self.head_dim_v), dtype=self.dtype)
        k[:, :, :n] = self._k[:, :, :n]
        v[:, :, :n] = self._v[:, :, :n]
        self._k, self._v = k, v

    def append(self, k_new: Any, v_new: Any, *, lengths: Any = None) -> None:
        """Append new tokens' keys and values to each sequence.

        Args:
            k_new: ``[B, h_kv, t, d_k]`` keys of the t new tokens.
            v_new: ``[B, h_kv, t, d_v]`` values.
            lengths: ``[B]`` ints: sequence b appends only its first ``lengths[b]`` new tokens (the rest is
                padding); default t for all.
        """
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
            bad = np.flatnonzero((new < 0) | (new > t))
            if bad.size:
                raise ShapeError(f"lengths: entry {bad[0]} is {new[bad[0]]}; expected 0 <= length <= t={t}")
            new = new.astype(np.int64)
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

    def reset(self) -> None:
        """Forget every cached token (the buffers are kept, zeroed)."""
        self._k[...] = 0
        self._v[...] = 0
        self._lengths[:] = 0
        self._last[:] = 0


def cached_attention(q: Any, cache: KVCache, *, scale: float | None = None, masked_rows: str = "raise") -> Any:
    """Attention of the newest tokens to everything cached, bottom-right aligned (a decode or prefill step).

    The cache already holds the new tokens (call :meth:`KVCache.append` first). The t queries are the t newest
    tokens: query i of sequence b sits at position ``lengths[b] - t_b + i`` with ``t_b = min(t,
    last_appended[b])`` and sees keys ``j <=`` that position, exactly its row of a full causal forward.
    (Top-left alignment would let the first new token see only key 0: wrong.) Query rows ``i >= t_b`` of a
    sequence that appended fewer tokens (``append(..., lengths=)``) are padding: their output is 0.

    Args:
        q: ``[B, h, t, d_k]`` queries of the t newest tokens; ``h`` a multiple of the cache's ``h_kv`` (GQA:
            query head i reads kv head ``i // (h / h_kv)``).
        cache: the layer's :class:`KVCache`.
        scale: default ``1/sqrt(d_k)``.
        masked_rows: for a real query with nothing to see (an empty cache): "raise", "zero" or "nan".

    Returns:
        ``[B, h, t, d_v]`` in q's dtype (computed in float32, or float64 for float64 q and cache).

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
    xp = namespace(q)
    qn = to_numpy(q) if xp is not np else np.asarray(q)
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
    last = cache.last_appended
    if t > max(1, int(last.max())):
        raise ShapeError(
            f"q: {t} query tokens (dim 2), but the last append added at most {int(last.max())} token(s) per "
            f"sequence; pass one query per new token (the cache must already hold them: append first)"
        )
    n_new = np.minimum(last, t)  # [B] real queries per sequence: the newest n_new[b] tokens
    if not last.any():
        n_new[:] = t  # nothing appended yet: every query is real and has nothing to see
    cdt = np.float64 if qn.dtype == np.float64 and cache.dtype == np.float64 else np.float32
    out_dtype = qn.dtype if qn.dtype.kind == "f" else np.float64
    g = h // h_kv
    lengths = cache.lengths
    L = max(1, int(lengths.max()))
    sc = resolve_scale(scale, d_k)
    start = lengths - n_new  # [B] position of query 0
    qpos = start[:, None] + np.arange(t)[None, :]  # [B, t]
    real = np.arange(t)[None, :] < n_new[:, None]  # [B, t] padding queries of short appends are not real
    out = np.zeros((B, h_kv, g, t, cache.head_dim_v), dtype=cdt)
    if B * h * t * L <= _DENSE_LIMIT:
        K = cache._k[:, :, :L].astype(cdt, copy=False)  # [B, h_kv, L, d_k]
        V = cache._v[:, :, :L].astype(cdt, copy=False)
        qg = qn.astype(cdt, copy=False).reshape(B, h_kv, g * t, d_k)  # GQA: a kv head's g query heads as rows
        s = (qg @ np.swapaxes(K, -1, -2)) * cdt(sc)  # [B, h_kv, g·t, L]
        allowed = np.arange(L)[None, None, :] <= qpos[:, :, None]  # [B, t, L] bottom-right causal
        allowed &= np.arange(L)[None, None, :] < lengths[:, None, None]
        allowed = np.broadcast_to(allowed[:, None, None], (B, 1, g, t, L)).reshape(B, 1, g * t, L)
        w, _, empty = masked_softmax(s, allowed)
        out = (w @ V).reshape(B, h_kv, g, t, -1)
        empty = empty.reshape(B, h_kv, g, t)
    else:
        from .tiled import flash_attention

        empty = np.zeros((B, h_kv, g, t), dtype=bool)
        for b in range(B):
            n_b = int(lengths[b])
            if n_b == 0:
                empty[b] = True
                continue
            qb = qn[b].astype(cdt, copy=False).reshape(h_kv, g, t, d_k)
            r = flash_attention(
                qb,
                cache._k[b, :, None, :n_b].astype(cdt, copy=False),
                cache._v[b, :, None, :n_b].astype(cdt, copy=False),
                causal=True,
                q_offset=int(start[b]),
                scale=sc,
                masked_rows="zero",
            )
            out[b] = r.output
            empty[b] = np.isneginf(r.lse)
    empty &= real[:, None, None, :]
    out = out * real[:, None, None, :, None]  # padding queries -> 0
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
    result = out.reshape(B, h, t, -1).astype(out_dtype, copy=False)
    if xp is not np:
        from .._arrays import device_of

        return xp.asarray(result, device=device_of(q))
    return result


def decode_step(
    cache: KVCache,
    q: Any,
    k_new: Any,
    v_new: Any,
    *,
    lengths: Any = None,
    scale: float | None = None,
    masked_rows: str = "raise",
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
