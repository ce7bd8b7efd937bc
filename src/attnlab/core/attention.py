"""Exact scaled dot-product attention, ``softmax(Q Kᵀ · scale + bias + M) V``, and its full trace."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._arrays import index_tuples, shape_of, to_numpy
from .._signatures import same_arguments
from ..errors import MemoryLimitError, RangeError, logits_overflow_error, masked_rows_error
from ..validate import check_int
from .inputs import Causal, CoreOptions, MaskedRows, Prepared, cast_checked, in_float64, max_abs, prepare
from .softmax import masked_softmax

__all__ = [
    "DEFAULT_MAX_BYTES",
    "AttentionTrace",
    "attention_trace",
    "check_dense_size",
    "dense_bytes",
    "scaled_dot_product_attention",
]


@dataclass(frozen=True)
class AttentionTrace:
    """Every intermediate value of one attention computation (arrays of the caller's library).

    Shapes (``...`` is the broadcast of the inputs' leading dims):

    * ``q [..., n_q, d_k]``, ``k [..., n_k, d_k]``, ``v [..., n_k, d_v]``: the inputs, in the compute dtype;
    * ``scores [..., n_q, n_k]``: ``Q Kᵀ``, unscaled (``±inf`` where it overflows float64 although the logits do
      not: a tiny scale; the logits are then computed from q and k rescaled by powers of two, exactly);
    * ``logits [..., n_q, n_k]``: ``(scale · scores + bias) / temperature``, ``-inf`` where not allowed;
    * ``allowed [..., n_q, n_k]``: the boolean mask actually applied (``mask`` AND causal);
    * ``weights [..., n_q, n_k]``: the softmax of each row of ``logits``;
    * ``output [..., n_q, d_v]``: ``weights @ v`` in the output dtype;
    * ``lse [..., n_q]``: the row log-sum-exp of ``logits`` (``-inf`` on fully masked rows).

    ``masked_rows`` lists each fully masked row as ``(*batch_index, query_index)``; ``policy`` says what was done
    with them. Everything except ``output`` is in the compute dtype: float64, or float32 for lower precisions, or
    float64 again when float32 logits would overflow (see :func:`scaled_dot_product_attention`).
    """

    q: Any
    k: Any
    v: Any
    scores: Any
    scale: float
    temperature: float
    bias: Any | None
    logits: Any
    allowed: Any
    weights: Any
    output: Any
    lse: Any
    masked_rows: tuple[tuple[int, ...], ...]
    policy: str


#: The default ``max_bytes`` of the dense path: 16 GiB (beyond it, :func:`attnlab.flash_attention` is the tool).
DEFAULT_MAX_BYTES = 16 * 2**30

#: Arrays of the scores' shape the dense path holds at its peak, in the compute dtype: ``Q Kᵀ``, the logits and
#: one temporary of forming them (bias, temperature), their masked copy, the exponentials, the weights, the trace's
#: ``-inf``-filled logits (measured with tracemalloc: 49-56 bytes per score entry in float64, 25-28 in float32).
DENSE_FLOAT_ARRAYS = 7
#: Boolean arrays of the scores' shape at the same time: the allowed mask and the overflow check.
DENSE_BOOL_ARRAYS = 2


def dense_bytes(scores_shape: tuple[int, ...], dtype: Any) -> int:
    """An estimate of the peak memory of the dense path, in bytes, for scores ``[*batch, n_q, n_k]`` in ``dtype``.

    ``DENSE_FLOAT_ARRAYS`` (7) arrays of the scores' shape in the compute dtype plus ``DENSE_BOOL_ARRAYS`` (2)
    boolean ones; inputs (a dense mask or bias among them), outputs and ``[..., n_q]`` row statistics are not
    counted.

    >>> round(dense_bytes((200_000, 200_000), "float64") / 2**40, 2)  # TiB; the scores alone would be 298 GiB
    2.11
    """
    n = math.prod(int(d) for d in scores_shape)
    itemsize = 4 if "32" in str(dtype) else 8
    return n * (DENSE_FLOAT_ARRAYS * itemsize + DENSE_BOOL_ARRAYS)


def _gib(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} bytes"


def _memory_error(p: Prepared, max_bytes: int | None) -> MemoryLimitError:
    dtype = str(p.q.dtype).replace("torch.", "")
    need = dense_bytes(p.scores_shape, dtype)
    limit = "the memory available" if max_bytes is None else f"max_bytes={max_bytes} ({_gib(max_bytes)})"
    return MemoryLimitError(
        f"q, k, v: the dense path needs about {_gib(need)} for scores {p.scores_shape} [..., n_q, n_k] in {dtype} "
        f"({DENSE_FLOAT_ARRAYS} {dtype} arrays of that shape: Q Kᵀ, logits, a temporary, masked logits, exp, "
        f"weights, the trace's logits; and {DENSE_BOOL_ARRAYS} bool ones), more than {limit}. Use "
        f"attnlab.flash_attention (exact, O(n) memory: the scores are never formed), or pass a larger "
        f"max_bytes= (None: no limit)"
    )


def check_dense_size(p: Prepared, max_bytes: int | None) -> None:
    """Raise :class:`~attnlab.errors.MemoryLimitError` when :func:`dense_bytes` of ``p`` exceeds ``max_bytes``."""
    if max_bytes is None:
        return
    if dense_bytes(p.scores_shape, str(p.q.dtype)) > max_bytes:
        raise _memory_error(p, max_bytes)


def _overflow(p: Prepared, s: Any, bad: Any, note: str = "") -> Exception:
    xp = p.xp
    where = np.argwhere(to_numpy(bad))
    index = tuple(int(i) for i in where[0])
    value = float(to_numpy(xp.broadcast_to(s, shape_of(bad)))[index])
    return logits_overflow_error(
        index,
        value,
        len(where),
        p.scores_shape,
        str(p.q.dtype).replace("torch.", ""),
        q_max=max_abs(xp, p.q),
        k_max=max_abs(xp, p.k),
        bias_max=None if p.bias_source is None else max_abs(xp, p.bias_source),
        scale=p.scale,
        temperature=p.temperature,
        note=note,
    )


def _forward(p: Prepared, max_bytes: int | None) -> AttentionTrace:
    check_dense_size(p, max_bytes)
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked for below, and explained
            return _forward_dense(p, max_bytes)
    except MemoryError as err:
        if isinstance(err, MemoryLimitError):
            raise
        raise _memory_error(p, None) from err


def _power_of_two(m: float) -> int:
    """The exponent e with ``m = f · 2**e``, 0.5 <= f < 1, kept where ``2.0**±e`` is a normal float64."""
    return 0 if m == 0 else max(-1021, min(1021, math.frexp(m)[1]))


def _rescaled_scores(p: Prepared) -> tuple[Any, float] | None:
    """``(Q' K'ᵀ, factor')`` with ``Q' = Q · 2**-a``, ``K' = K · 2**-b`` (exact) and ``factor' = scale / temperature ·
    2**(a + b)``: the logits ``Q Kᵀ · scale / temperature`` without forming ``Q Kᵀ``, which may overflow when the
    factor is small, nor ``scale · 2**(a + b)``, which may overflow when a huge temperature brings it back (the
    powers of two of scale and temperature are combined before ``ldexp``). ``None`` when ``factor'`` overflows."""
    xp = p.xp
    a, b = _power_of_two(max_abs(xp, p.q)), _power_of_two(max_abs(xp, p.k))
    (ms, es), (mt, et) = math.frexp(p.scale), math.frexp(p.temperature)
    try:
        factor = math.ldexp(ms / mt, es - et + a + b)
    except OverflowError:
        return None
    return (p.q * 2.0**-a) @ xp.matrix_transpose(p.k * 2.0**-b), factor


def _forward_dense(p: Prepared, max_bytes: int | None, rescale: bool = False) -> AttentionTrace:
    xp = p.xp
    float32 = p.q.dtype != xp.float64
    scores = p.q @ xp.matrix_transpose(p.k)  # [..., n_q, n_k]; may hold inf if rescale
    if rescale:
        rescaled = _rescaled_scores(p)  # the temperature is in the factor: scale · 2**(a + b) may overflow
        assert rescaled is not None  # rescale=True only where the caller checked that the factor does not overflow
        unit, factor = rescaled
        s = unit * factor
        if p.bias is not None:
            s = s + (p.bias / p.temperature if p.temperature != 1.0 else p.bias)
    else:
        s = scores * p.scale
        if p.bias is not None:
            s = s + p.bias
        if p.temperature != 1.0:
            s = s / p.temperature
    allowed = p.allowed()  # [..., n_q, n_k]
    bad = None
    total = xp.sum(s)
    total = total.detach() if hasattr(total, "detach") else total  # a check, not part of the autograd graph
    if not math.isfinite(float(total)):  # one cheap pass; the exact check only when something is off
        bad = xp.logical_and(allowed, xp.logical_not(xp.isfinite(s)))  # overflow at an entry that counts
    if bad is not None and bool(xp.any(bad)):
        if float32:
            return _forward(in_float64(p), max_bytes)
        if not rescale and _rescaled_scores(p) is not None:  # Q Kᵀ may overflow where scale · Q Kᵀ does not
            return _forward_dense(p, max_bytes, rescale=True)
        note = "The inputs were already recomputed in float64." if p.out_dtype != xp.float64 else ""
        raise _overflow(p, s, bad, note)
    del bad
    weights, lse, empty = masked_softmax(s, allowed)  # [..., n_q, n_k], [..., n_q], [..., n_q]
    rows: tuple[tuple[int, ...], ...] = ()
    if bool(xp.any(empty)):
        rows = index_tuples(empty)
        if p.masked_rows == "raise":
            raise masked_rows_error(rows, p.scores_shape)
        if p.masked_rows == "nan":
            weights = xp.where(empty[..., None], xp.full_like(weights, float("nan")), weights)
    neg_inf = xp.asarray(-float("inf"), dtype=s.dtype)
    logits = xp.where(allowed, s, neg_inf)
    out = weights @ p.v  # [..., n_q, d_v]
    live = xp.logical_not(empty)[..., None]  # rows made NaN on purpose are not an overflow
    if not bool(xp.all(xp.logical_or(xp.isfinite(out), xp.logical_not(live)))):
        if float32:
            return _forward(in_float64(p), max_bytes)
        raise RangeError(
            f"output: weights @ v overflows float64 (largest finite {np.finfo(np.float64).max:.7g}) although "
            f"max |v| is {max_abs(xp, p.v):.7g}; scale v down"
        )
    output = cast_checked(xp, out, p.out_dtype, "output")
    return AttentionTrace(
        q=p.q,
        k=p.k,
        v=p.v,
        scores=scores,
        scale=p.scale,
        temperature=p.temperature,
        bias=p.bias,
        logits=logits,
        allowed=allowed,
        weights=weights,
        output=output,
        lse=lse,
        masked_rows=rows,
        policy=p.masked_rows,
    )


def _check_max_bytes(max_bytes: Any) -> int | None:
    return None if max_bytes is None else check_int("max_bytes", max_bytes, minimum=1)


def scaled_dot_product_attention(  # 10 parameters: the public keywords (CoreOptions)
    q: Any,
    k: Any,
    v: Any,
    mask: Any = None,
    *,
    bias: Any = None,
    causal: Causal = False,
    scale: float | None = None,
    temperature: float = 1.0,
    masked_rows: MaskedRows = "raise",
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> Any:
    """Exact attention: ``softmax((Q Kᵀ · scale + bias) / temperature, masked) V``, row by row.

    Args:
        q: queries ``[..., n_q, d_k]`` (NumPy array, PyTorch tensor, any array-API array, or nested lists).
        k: keys ``[..., n_k, d_k]``.
        v: values ``[..., n_k, d_v]``. Leading (batch, head) dims of q, k, v broadcast.
        mask: boolean, True = this query may attend to this key, broadcastable to ``[..., n_q, n_k]``. Other
            conventions are converted first with :mod:`attnlab.masks` (a non-bool mask is refused).
        bias: additive float scores (ALiBi, relative position), broadcastable to ``[..., n_q, n_k]``.
        causal: ``True`` (query i sees keys j <= i; needs n_q == n_k), ``"top_left"`` (as PyTorch ``is_causal``)
            or ``"bottom_right"`` (as FlashAttention and KV-cache decoding). ANDed with ``mask``.
        scale: multiplies ``Q Kᵀ``; default ``1/sqrt(d_k)``.
        temperature: divides the logits (> 1 flattens the weights, < 1 sharpens them).
        masked_rows: what a query row with no allowed key becomes: ``"raise"`` (default, a
            :class:`~attnlab.errors.MaskedRowError` naming the rows), ``"zero"`` (weights and output 0, as
            FlashAttention) or ``"nan"`` (what naive code gives). Never anything else, whatever the mask.
        max_bytes: the most memory the dense ``[..., n_q, n_k]`` arrays may take (:func:`dense_bytes`: 7 of them
            in the compute dtype, 2 boolean), default 16 GiB; above it a :class:`~attnlab.errors.MemoryLimitError`
            says how much is needed and points to :func:`attnlab.flash_attention` (exact, O(n) memory). ``None``:
            no limit (NumPy's own out-of-memory is still reported that way).

    Returns:
        ``[..., n_q, d_v]`` in the caller's library, in the input dtype (float64 for integer and long double
        inputs). float64 inputs are computed in float64, float32/float16/bfloat16 in float32, with the row maximum
        subtracted.

    Precision policy (finite inputs never give NaN or inf):

    * float32 compute is used only when it is exact enough: a scale, temperature or float64 bias outside
      float32's normal range, or logits ``(scale · Q Kᵀ + bias) / temperature`` that overflow float32 at an
      allowed entry, make the whole call recompute in float64 (which holds every float32/float16/bfloat16 value
      exactly); the result is still returned in the input dtype;
    * in float64, ``Q Kᵀ`` overflowing under a small scale is recomputed from q and k rescaled by powers of two
      (exactly); logits that still overflow raise :class:`~attnlab.errors.RangeError`
      (:func:`~attnlab.errors.logits_overflow_error`) naming the first entry, the inputs' largest magnitudes,
      the scale, the temperature and the fix. An underflowing temperature (``1e-310``) is such an overflow,
      never a fully masked row;
    * an output the input dtype cannot hold (float16) is a :class:`~attnlab.errors.RangeError`, not ``inf``.
      Values below the compute dtype's smallest normal number are rounded as in any floating-point code.

    The articles' 2×2 example (Q = K = I, V = [[10, 0], [0, 20]]):

    >>> scaled_dot_product_attention([[1, 0], [0, 1]], [[1, 0], [0, 1]], [[10, 0], [0, 20]]).round(4).tolist()
    [[6.6976, 6.6048], [3.3024, 13.3952]]

    (The article prints 6.604 and 13.396: it multiplies by the weights rounded to 0.3302 and 0.6698.)
    """
    p = prepare(q, k, v, mask, bias, CoreOptions(causal, scale, temperature, masked_rows))
    return _forward(p, _check_max_bytes(max_bytes)).output


@same_arguments(scaled_dot_product_attention)
def attention_trace(q: Any, k: Any, v: Any, mask: Any, bias: Any, max_bytes: Any, **options: Any) -> AttentionTrace:
    """Scaled dot-product attention with every intermediate value kept; arguments (the same signature) as in
    :func:`scaled_dot_product_attention`.

    >>> t = attention_trace([[1, 0], [0, 1]], [[1, 0], [0, 1]], [[10, 0], [0, 20]], causal=True)
    >>> t.logits.round(4).tolist()
    [[0.7071, -inf], [0.0, 0.7071]]
    >>> t.weights.round(4).tolist()
    [[1.0, 0.0], [0.3302, 0.6698]]
    """
    return _forward(prepare(q, k, v, mask, bias, CoreOptions(**options)), _check_max_bytes(max_bytes))
