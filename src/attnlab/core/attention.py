"""Exact scaled dot-product attention, ``softmax(Q Kᵀ · scale + bias + M) V``, and its full trace."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._arrays import index_tuples
from ..errors import masked_rows_error
from .inputs import Causal, MaskedRows, Prepared, prepare
from .softmax import masked_softmax

__all__ = ["AttentionTrace", "attention_trace", "scaled_dot_product_attention"]


@dataclass(frozen=True)
class AttentionTrace:
    """Every intermediate value of one attention computation (arrays of the caller's library).

    Shapes (``...`` is the broadcast of the inputs' leading dims):

    * ``q [..., n_q, d_k]``, ``k [..., n_k, d_k]``, ``v [..., n_k, d_v]``: the inputs, in the compute dtype;
    * ``scores [..., n_q, n_k]``: ``Q Kᵀ``, unscaled;
    * ``logits [..., n_q, n_k]``: ``(scale · scores + bias) / temperature``, ``-inf`` where not allowed;
    * ``allowed [..., n_q, n_k]``: the boolean mask actually applied (``mask`` AND causal);
    * ``weights [..., n_q, n_k]``: the softmax of each row of ``logits``;
    * ``output [..., n_q, d_v]``: ``weights @ v`` in the output dtype;
    * ``lse [..., n_q]``: the row log-sum-exp of ``logits`` (``-inf`` on fully masked rows).

    ``masked_rows`` lists each fully masked row as ``(*batch_index, query_index)``; ``policy`` says what was done
    with them. Everything except ``output`` is in the compute dtype (float64, or float32 for lower precisions).
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


def _forward(p: Prepared) -> AttentionTrace:
    xp = p.xp
    scores = p.q @ xp.matrix_transpose(p.k)  # [..., n_q, n_k]
    s = scores * p.scale
    if p.bias is not None:
        s = s + p.bias
    if p.temperature != 1.0:
        s = s / p.temperature
    allowed = p.allowed()  # [..., n_q, n_k]
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
    output = xp.astype(weights @ p.v, p.out_dtype)  # [..., n_q, d_v]
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


def attention_trace(
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
) -> AttentionTrace:
    """Scaled dot-product attention with every intermediate value kept; arguments as in
    :func:`scaled_dot_product_attention`.

    >>> t = attention_trace([[1, 0], [0, 1]], [[1, 0], [0, 1]], [[10, 0], [0, 20]], causal=True)
    >>> t.logits.round(4).tolist()
    [[0.7071, -inf], [0.0, 0.7071]]
    >>> t.weights.round(4).tolist()
    [[1.0, 0.0], [0.3302, 0.6698]]
    """
    return _forward(
        prepare(q, k, v, mask, bias=bias, causal=causal, scale=scale, temperature=temperature, masked_rows=masked_rows)
    )


def scaled_dot_product_attention(
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

    Returns:
        ``[..., n_q, d_v]`` in the caller's library, in the input dtype (float64 for integer inputs). float64
        inputs are computed in float64, float32/float16/bfloat16 in float32, with the row maximum subtracted.

    The articles' 2×2 example (Q = K = I, V = [[10, 0], [0, 20]]):

    >>> scaled_dot_product_attention([[1, 0], [0, 1]], [[1, 0], [0, 1]], [[10, 0], [0, 20]]).round(4).tolist()
    [[6.6976, 6.6048], [3.3024, 13.3952]]

    (The article prints 6.604 and 13.396: it multiplies by the weights rounded to 0.3302 and 0.6698.)
    """
    p = prepare(q, k, v, mask, bias=bias, causal=causal, scale=scale, temperature=temperature, masked_rows=masked_rows)
    return _forward(p).output
