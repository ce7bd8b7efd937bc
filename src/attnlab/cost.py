"""The cost model of attention (article 001 §13–15, 19): FLOPs, score-matrix memory and KV-cache bytes.

With batch B, n_q queries, n_k keys, model width d_model, h heads of d_head = d_model / h and h_kv key/value heads
(h_kv = h is MHA, 1 < h_kv < h GQA, h_kv = 1 MQA), counting a multiply-add as 2 FLOPs:

* projections ``O(B n d_model²)``: Q and the output ``2·B·n_q·d_model²`` each, K and V
  ``2·B·n_k·d_model·(h_kv·d_head)`` each;
* scores ``Q Kᵀ`` and the weighted sum ``A V``: ``2·B·h·n_q·n_k·d_head = 2·B·n_q·n_k·d_model`` each (for causal
  attention only the allowed pairs count);
* the explicit score matrix: ``B·h·n_q·n_k`` elements, ``O(B h n²)`` memory;
* the KV cache: ``B · L · layers · h_kv · d_head · 2 · bytes`` (the 2 is K and V).

The articles' figures:

>>> score_elements(4096) // score_elements(1024)
16
>>> head_dim(512, 8)
64
>>> crossover_length(512)  # MHA self-attention: QKᵀ + AV outweigh the projections beyond n = 2 · d_model
1024

Every count is an exact Python int computed in closed form (no array of n), so any size works:

>>> causal_pairs(10**18)
500000000000000000500000000000000000
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import DTypeError, ShapeError
from .validate import check_choice, check_int

__all__ = [
    "AttentionCost",
    "attention_cost",
    "bytes_per_element",
    "causal_pairs",
    "crossover_length",
    "head_dim",
    "kv_cache_bytes",
    "score_elements",
    "window_pairs",
]


def _pos(name: str, x: Any) -> int:
    return check_int(name, x, minimum=1)


def bytes_per_element(dtype: Any) -> int:
    """Bytes of one element of ``dtype`` (a numeric NumPy dtype or name; ``"bfloat16"`` is 2, ``"int8"`` 1), or an
    int (a byte count >= 1)."""
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        return _pos("bytes_per_element", dtype)
    if str(dtype).split(".")[-1] == "bfloat16":
        return 2
    hint = "try 'float16', 'bfloat16', 'float32', 'int8' or a byte count"
    try:
        with warnings.catch_warnings():  # NumPy 2 deprecates some aliases ('a'); the answer is the same
            warnings.simplefilter("ignore", DeprecationWarning)
            dt = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError):
        raise DTypeError(f"dtype: {dtype!r} is not a dtype ({hint})") from None
    if dt.kind not in "biufc" or dt.itemsize < 1:
        raise DTypeError(f"dtype: {dtype!r} is {dt}, not a numeric dtype ({hint})")
    return int(dt.itemsize)


def _kv_heads(heads: int, kv_heads: int | None) -> int:
    kv = heads if kv_heads is None else _pos("kv_heads", kv_heads)
    if heads % kv:
        raise ShapeError(f"kv_heads: {kv} does not divide heads={heads} (GQA needs h % h_kv == 0)")
    return kv


def head_dim(d_model: int, heads: int) -> int:
    """``d_head = d_model / h``; the heads must divide d_model."""
    d_model, heads = _pos("d_model", d_model), _pos("heads", heads)
    if d_model % heads:
        raise ShapeError(f"heads: {heads} heads do not divide d_model={d_model} (d_head = d_model / h must be an int)")
    return d_model // heads


def causal_pairs(n_q: int, n_k: int | None = None) -> int:
    """Allowed (query, key) pairs of a bottom-right causal mask (top-left is the same when n_q == n_k).

    Query ``i`` sees ``i + n_k - n_q + 1`` keys, clipped to ``[0, n_k]``: when ``n_q <= n_k`` that is
    ``n_k - n_q + 1 .. n_k``, when ``n_q > n_k`` the first ``n_q - n_k`` rows see nothing and the last ``n_k``
    see ``1 .. n_k``. With ``m = min(n_q, n_k)`` both sums are ``m·n_k - m(m-1)/2`` (``n(n+1)/2`` for ``n_q = n_k
    = n``), an exact int for any size.

    >>> causal_pairs(4), causal_pairs(1, 8), causal_pairs(8, 3)
    (10, 8, 6)
    """
    n_q = _pos("n_q", n_q)
    n_k = n_q if n_k is None else _pos("n_k", n_k)
    m = min(n_q, n_k)
    return m * n_k - m * (m - 1) // 2


def window_pairs(n: int, window: int) -> int:
    """Causal pairs with a sliding window of ``window`` keys (query ``i`` sees keys ``i - window + 1 .. i``): the sum
    of ``min(i + 1, window)`` over ``n`` queries, an exact int.

    >>> window_pairs(4, 2), window_pairs(4, 8) == causal_pairs(4)
    (7, True)
    """
    n, w = _pos("n", n), _pos("window", window)
    w = min(w, n)
    return w * (w + 1) // 2 + (n - w) * w


def score_elements(n_q: int, n_k: int | None = None, *, batch: int = 1, heads: int = 1) -> int:
    """Elements of the explicit score matrix ``[B, h, n_q, n_k]`` (the same for its weights)."""
    n_q = _pos("n_q", n_q)
    n_k = n_q if n_k is None else _pos("n_k", n_k)
    return _pos("batch", batch) * _pos("heads", heads) * n_q * n_k


def kv_cache_bytes(
    *, batch: int, seq_len: int, layers: int, kv_heads: int, head_dim: int, dtype: Any = "float16"
) -> int:
    """The article's KV-cache size ``B · L · layers · h_kv · d_head · 2 · bytes``.

    >>> kv_cache_bytes(batch=1, seq_len=4096, layers=32, kv_heads=8, head_dim=128, dtype="bfloat16") / 2**20
    512.0
    """
    return (
        _pos("batch", batch)
        * _pos("seq_len", seq_len)
        * _pos("layers", layers)
        * _pos("kv_heads", kv_heads)
        * _pos("head_dim", head_dim)
        * 2
        * bytes_per_element(dtype)
    )


@dataclass(frozen=True)
class AttentionCost:
    """FLOPs and memory of ``layers`` attention layers for the given sizes (every count an exact int).

    FLOP fields are per forward pass over all layers; ``score_bytes`` is one layer's explicit score matrix;
    ``kv_cache_bytes`` covers every layer for ``L = n_k`` cached tokens.
    """

    batch: int
    n_q: int
    n_k: int
    d_model: int
    heads: int
    kv_heads: int
    d_head: int
    layers: int
    bytes_per_element: int
    causal: bool
    pairs: int
    projection_flops: int
    score_flops: int
    av_flops: int
    score_elements: int
    score_bytes: int
    kv_cache_bytes: int

    @property
    def attention_flops(self) -> int:
        """``Q Kᵀ`` plus ``A V``."""
        return self.score_flops + self.av_flops

    @property
    def total_flops(self) -> int:
        """Projection plus attention FLOPs."""
        return self.projection_flops + self.attention_flops

    @property
    def kind(self) -> str:
        """MHA, GQA or MQA."""
        if self.kv_heads == self.heads:
            return "MHA"
        return "MQA" if self.kv_heads == 1 else "GQA"


def attention_cost(
    n_q: int,
    n_k: int | None = None,
    *,
    batch: int = 1,
    d_model: int = 512,
    heads: int = 8,
    kv_heads: int | None = None,
    layers: int = 1,
    dtype: Any = "float16",
    causal: bool = False,
) -> AttentionCost:
    """The cost of attention for the sizes given (defaults: the articles' d_model 512 with 8 heads).

    Args:
        n_q: queries per sequence (the sequence length for self-attention).
        n_k: keys per sequence (default n_q); also the cached length L of the KV cache.
        batch: B.
        d_model: model width; ``d_head = d_model / heads``.
        heads: query heads h.
        kv_heads: key/value heads (default h; must divide h).
        layers: attention layers.
        dtype: element type of activations and cache (bytes per element).
        causal: count only the allowed pairs of a (bottom-right) causal mask in the FLOPs.

    >>> c = attention_cost(1024)
    >>> c.d_head, c.score_elements, c.projection_flops == c.attention_flops
    (64, 8388608, True)
    """
    n_q = _pos("n_q", n_q)
    n_k = n_q if n_k is None else _pos("n_k", n_k)
    batch, layers = _pos("batch", batch), _pos("layers", layers)
    d_model, heads = _pos("d_model", d_model), _pos("heads", heads)  # Python ints: no int64 overflow below
    d_h = head_dim(d_model, heads)
    kv = _kv_heads(heads, kv_heads)
    causal = check_choice("causal", bool(causal) if isinstance(causal, np.bool_) else causal, (False, True))
    nbytes = bytes_per_element(dtype)
    pairs = causal_pairs(n_q, n_k) if causal else n_q * n_k
    proj = 2 * batch * n_q * d_model * d_model * 2 + 2 * batch * n_k * d_model * kv * d_h * 2  # Q, O + K, V
    score = 2 * batch * heads * pairs * d_h
    elements = score_elements(n_q, n_k, batch=batch, heads=heads)
    return AttentionCost(
        batch=batch,
        n_q=n_q,
        n_k=n_k,
        d_model=d_model,
        heads=heads,
        kv_heads=kv,
        d_head=d_h,
        layers=layers,
        bytes_per_element=nbytes,
        causal=causal,
        pairs=pairs,
        projection_flops=proj * layers,
        score_flops=score * layers,
        av_flops=score * layers,
        score_elements=elements,
        score_bytes=elements * nbytes,
        kv_cache_bytes=kv_cache_bytes(batch=batch, seq_len=n_k, layers=layers, kv_heads=kv, head_dim=d_h, dtype=nbytes),
    )


def crossover_length(d_model: int, *, heads: int = 8, kv_heads: int | None = None) -> int:
    """The self-attention length n at which ``Q Kᵀ + A V`` cost as many FLOPs as the four projections.

    Projections grow like ``n`` (``(4 + 4·h_kv/h)·n·d_model²``), the scores like ``n²`` (``4·n²·d_model``): below
    this n the projections dominate, above it the n² term does. The ratio is the exact int
    ``d_model + h_kv·d_head``: ``2·d_model`` for MHA.
    """
    d_model, heads = _pos("d_model", d_model), _pos("heads", heads)
    d_h = head_dim(d_model, heads)
    kv = _kv_heads(heads, kv_heads)
    # FLOPs per token of the projections, 4·d_model² + 4·d_model·h_kv·d_head, over FLOPs per (query, key) pair,
    # 4·d_model (2·d_model for Q Kᵀ, 2·d_model for A V)
    return d_model + kv * d_h
