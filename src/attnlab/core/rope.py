"""Rotary position embeddings (RoPE), as Hugging Face Llama applies them (the ``rotate_half`` convention).

Attention by itself does not know where a token sits: permuting the tokens permutes the outputs (article 001, §16).
RoPE fixes that by rotating each query and key by an angle proportional to its position, so that the score
``q_i · k_j`` depends on ``i - j``. Head dimension ``d`` is split into two halves ``x1 = x[..., :d/2]`` and
``x2 = x[..., d/2:]``; pair ``(x1[t], x2[t])`` is rotated by ``position · θ_t`` with ``θ_t = base^(-2t/d)``::

    rope(x) = x · cos + rotate_half(x) · sin,   rotate_half(x) = concat(-x2, x1)

llama.cpp (and therefore GGUF files) rotates *adjacent* pairs ``(x[2t], x[2t+1])`` instead, and its converter stores
W_Q and W_K with their output rows permuted to match. :func:`interleaved_to_half` undoes that permutation so that a
GGUF checkpoint gives the same scores under the ``rotate_half`` convention (:func:`apply_rope_interleaved` is the
llama.cpp convention, kept to show the two agree).

Shapes: ``x [..., n, d]`` (heads before the sequence axis, e.g. ``[B, h, n, d_head]``), ``positions [n]`` or
``[B, n]``, ``cos / sin [n, d]`` or ``[B, n, d]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DTypeError, OptionError, ShapeError
from ..validate import check_float

__all__ = [
    "RopeTables",
    "apply_rope",
    "apply_rope_interleaved",
    "check_head_dim",
    "half_to_interleaved",
    "interleaved_to_half",
    "rope_frequencies",
    "rope_tables",
    "rotate_half",
]


@dataclass(frozen=True)
class RopeTables:
    """The cosines and sines RoPE multiplies by, for given positions.

    Attributes:
        cos: ``[..., n, d]`` ``cos(position · θ)``, each frequency written twice (``concat(f, f)``, as HF).
        sin: ``[..., n, d]`` likewise.
        positions: ``[..., n]`` the integer positions the tables are for.
        base: the frequency base θ (10000 for the original RoPE, 100000 for SmolLM2).
    """

    cos: np.ndarray
    sin: np.ndarray
    positions: np.ndarray
    base: float


def check_head_dim(head_dim: Any, name: str = "head_dim") -> int:
    """``head_dim`` as an int if it is a positive even integer (RoPE rotates pairs of dims), else a
    :class:`~attnlab.errors.ShapeError` naming ``name``."""
    try:
        d = int(head_dim)
    except (TypeError, ValueError):
        raise ShapeError(f"{name}: expected a positive even integer, got {head_dim!r}") from None
    if d != head_dim or d <= 0 or d % 2:
        raise ShapeError(f"{name}: expected a positive even integer (RoPE rotates pairs of dims), got {head_dim!r}")
    return d


def rope_frequencies(head_dim: int, *, base: float = 10000.0) -> np.ndarray:
    """The rotation speeds ``θ_t = base^(-2t/d)``, ``t = 0 .. d/2 - 1`` (float64).

    Shapes: returns ``[d/2]``.

    >>> rope_frequencies(4, base=100.0).tolist()
    [1.0, 0.1]
    """
    d = check_head_dim(head_dim)
    if check_float("base", base) <= 1:
        raise OptionError(f"base: expected a finite number > 1, got {base!r}")
    return 1.0 / (float(base) ** (np.arange(0, d, 2, dtype=np.float64) / d))


def rope_tables(positions: Any, head_dim: int, *, base: float = 10000.0, dtype: Any = np.float32) -> RopeTables:
    """``cos`` and ``sin`` of ``position · θ`` for every position and dim, computed in float64 then cast to ``dtype``.

    Args:
        positions: integer positions ``[n]`` or ``[B, n]`` (e.g. ``arange(past, past + t)`` while decoding).
        head_dim: ``d``, the size of one head (even).
        base: the frequency base θ.
        dtype: dtype of the tables (float32 for a float32 model).

    Shapes: ``cos``, ``sin`` are ``[*positions.shape, d]``.

    >>> t = rope_tables([0, 1], 2, base=10000.0, dtype=np.float64)
    >>> t.cos.round(4).tolist(), t.sin.round(4).tolist()
    ([[1.0, 1.0], [0.5403, 0.5403]], [[0.0, 0.0], [0.8415, 0.8415]])
    """
    pos = np.asarray(positions)
    if pos.dtype.kind not in "iu":
        raise DTypeError(f"positions: expected integers, got dtype {pos.dtype} (shape {pos.shape})")
    if pos.ndim not in (1, 2):
        raise ShapeError(f"positions: expected shape [n] or [B, n], got {pos.shape}")
    if pos.size and pos.min() < 0:
        raise ShapeError(f"positions: expected non-negative positions, got minimum {int(pos.min())}")
    inv = rope_frequencies(head_dim, base=base)
    angles = pos.astype(np.float64)[..., None] * inv  # [..., n, d/2]
    angles = np.concatenate([angles, angles], axis=-1)  # [..., n, d]
    return RopeTables(
        cos=np.cos(angles).astype(dtype), sin=np.sin(angles).astype(dtype), positions=pos.copy(), base=float(base)
    )


def rotate_half(x: Any) -> np.ndarray:
    """``concat(-x2, x1)`` where ``x1, x2`` are the first and second halves of the last axis.

    Shapes: ``x [..., d]`` -> ``[..., d]``.

    >>> rotate_half(np.array([1.0, 2.0, 3.0, 4.0])).tolist()
    [-3.0, -4.0, 1.0, 2.0]
    """
    x = np.asarray(x)
    h = check_head_dim(x.shape[-1], "x: last dim") // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def _tables_for(x: np.ndarray, tables: RopeTables) -> tuple[np.ndarray, np.ndarray]:
    cos, sin = tables.cos, tables.sin
    n, d = x.shape[-2], x.shape[-1]
    if cos.shape[-1] != d or cos.shape[-2] != n:
        raise ShapeError(
            f"tables: cos/sin have shape {cos.shape} [..., n, d] but x has n={n}, d={d} (x {x.shape} [..., n, d])"
        )
    if cos.ndim == 3 and x.ndim == 4:  # per-sequence positions [B, n, d] against [B, h, n, d]
        cos, sin = cos[:, None], sin[:, None]
    return cos, sin


def apply_rope(x: Any, tables: RopeTables) -> np.ndarray:
    """Rotate queries or keys by their positions (HF Llama's ``x·cos + rotate_half(x)·sin``); returns a new array.

    Args:
        x: ``[..., n, d]`` queries or keys, heads before the sequence axis (e.g. ``[B, h, n, d]``).
        tables: :func:`rope_tables` for the n positions (``[n, d]``, or ``[B, n, d]`` for ``x [B, h, n, d]``).

    Shapes: returns ``[..., n, d]``, dtype of ``x`` promoted with the tables'.

    A rotation keeps lengths, and the score of two rotated vectors depends only on their distance:

    >>> rng = np.random.default_rng(0)
    >>> q, k = rng.normal(size=(1, 8)), rng.normal(size=(1, 8))
    >>> def score(i, j):
    ...     a = apply_rope(q, rope_tables([i], 8, dtype=np.float64))
    ...     b = apply_rope(k, rope_tables([j], 8, dtype=np.float64))
    ...     return (a @ b.T).item()
    >>> bool(np.isclose(score(5, 2), score(13, 10)))
    True
    """
    x = np.asarray(x)
    if x.ndim < 2:
        raise ShapeError(f"x: expected at least 2 dims [..., n, d], got shape {x.shape}")
    cos, sin = _tables_for(x, tables)
    out: np.ndarray = x * cos + rotate_half(x) * sin
    return out


def apply_rope_interleaved(x: Any, tables: RopeTables) -> np.ndarray:
    """llama.cpp's RoPE: rotate adjacent pairs ``(x[2t], x[2t+1])`` by ``position · θ_t``.

    Equal to :func:`apply_rope` on :func:`interleaved_to_half`-reordered dims (the order GGUF stores W_Q, W_K in).

    Shapes: ``x [..., n, d]`` -> ``[..., n, d]``.
    """
    x = np.asarray(x)
    if x.ndim < 2:
        raise ShapeError(f"x: expected at least 2 dims [..., n, d], got shape {x.shape}")
    cos, sin = _tables_for(x, tables)
    h = x.shape[-1] // 2
    c, s = cos[..., :h], sin[..., :h]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty(np.broadcast_shapes(x.shape, cos.shape), dtype=np.result_type(x, cos))
    out[..., 0::2] = even * c - odd * s
    out[..., 1::2] = odd * c + even * s
    return out


def _permute_rows(w: Any, num_heads: int, to_half: bool) -> np.ndarray:
    w = np.asarray(w)
    name = "w"
    if w.ndim < 1 or w.shape[0] % num_heads or (w.shape[0] // num_heads) % 2:
        raise ShapeError(
            f"{name}: dim 0 of shape {w.shape} must be num_heads={num_heads} times an even head_dim "
            f"(rows are the projection's outputs, [h*d, d_in] as stored by torch/GGUF)"
        )
    d = w.shape[0] // num_heads
    rest = w.shape[1:]
    if to_half:  # rows in order (head, pair t, member 0/1) -> (head, member, t)
        out: np.ndarray = w.reshape(num_heads, d // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)
    else:
        out = w.reshape(num_heads, 2, d // 2, *rest).swapaxes(1, 2).reshape(w.shape)
    return out


def interleaved_to_half(w: Any, num_heads: int) -> np.ndarray:
    """Reorder a W_Q/W_K stored for interleaved RoPE (llama.cpp, GGUF) to HF's ``rotate_half`` order.

    Within each head, output dim ``2t`` moves to ``t`` and ``2t+1`` to ``d/2 + t``. Works on a weight ``[h*d, d_in]``
    (output rows first, as torch and GGUF store it) or a bias ``[h*d]``.

    >>> interleaved_to_half(np.arange(4), 1).tolist()
    [0, 2, 1, 3]
    """
    return _permute_rows(w, num_heads, to_half=True)


def half_to_interleaved(w: Any, num_heads: int) -> np.ndarray:
    """The inverse of :func:`interleaved_to_half` (what llama.cpp's converter does to HF weights).

    >>> half_to_interleaved(interleaved_to_half(np.arange(8), 2), 2).tolist()
    [0, 1, 2, 3, 4, 5, 6, 7]
    """
    return _permute_rows(w, num_heads, to_half=False)
