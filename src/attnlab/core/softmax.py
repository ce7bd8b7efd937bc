"""Numerically stable softmax and its masked form, written against the array API standard."""

from __future__ import annotations

from typing import Any

from .._arrays import namespace

__all__ = ["log_softmax", "masked_softmax", "softmax"]


def softmax(x: Any, axis: int = -1) -> Any:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``: the row maximum is subtracted so nothing overflows.

    >>> import numpy as np
    >>> softmax(np.array([1.0, 2.0])).round(3)
    array([0.269, 0.731])
    >>> softmax(np.array([1e4, 0.0])).tolist()  # naive exp(1e4) would overflow
    [1.0, 0.0]
    """
    xp = namespace(x)
    x = xp.asarray(x)
    e = xp.exp(x - xp.max(x, axis=axis, keepdims=True))
    return e / xp.sum(e, axis=axis, keepdims=True)


def log_softmax(x: Any, axis: int = -1) -> Any:
    """``x - logsumexp(x)`` along ``axis``, stably."""
    xp = namespace(x)
    x = xp.asarray(x)
    m = xp.max(x, axis=axis, keepdims=True)
    return x - m - xp.log(xp.sum(xp.exp(x - m), axis=axis, keepdims=True))


def masked_softmax(logits: Any, allowed: Any) -> tuple[Any, Any, Any]:
    """Softmax over the last axis restricted to ``allowed`` entries; rows with nothing allowed come out as 0.

    Args:
        logits: ``[..., n_k]`` real scores (their values at disallowed entries are ignored).
        allowed: ``[..., n_k]`` boolean, True = may attend.

    Returns:
        ``(weights, lse, empty)``: weights ``[..., n_k]`` (exactly 0 where not allowed, all 0 on empty rows),
        the row log-sum-exp ``lse [...]`` over allowed entries (``-inf`` on empty rows), and ``empty [...]``,
        True for rows with no allowed entry. What empty rows finally become is the caller's policy.
    """
    xp = namespace(logits, allowed)
    neg_inf = xp.asarray(-float("inf"), dtype=logits.dtype)
    masked = xp.where(allowed, logits, neg_inf)  # [..., n_k]
    m = xp.max(masked, axis=-1, keepdims=True)  # [..., 1]
    empty = m == neg_inf  # [..., 1]
    zero = xp.zeros_like(m)
    m = xp.where(empty, zero, m)
    e = xp.exp(masked - m)  # exp(-inf) = 0 exactly at disallowed entries
    l = xp.sum(e, axis=-1, keepdims=True)
    safe_l = xp.where(empty, xp.ones_like(l), l)
    weights = e / safe_l
    lse = xp.where(empty, xp.full_like(m, -float("inf")), m + xp.log(safe_l))
    return weights, lse[..., 0], empty[..., 0]
