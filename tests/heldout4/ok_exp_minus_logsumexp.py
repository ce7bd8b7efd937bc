"""Attention weights as ``exp(s - logsumexp(s))`` with the max-shifted log-sum-exp of an SSD loss helper.

Source: https://github.com/lzx1413/PytorchSSD/issues/22 ("why use the x_max in function log_sum_exp()?": to handle
overflow, ``log(sum(exp(x - x_max))) + x_max``).
Correct: the weights are ``exp(s - lse)`` with ``lse = m + log(sum(exp(s - m)))``; a query with no allowed key has
``lse = -inf`` and gets zero weights (zeros policy).
"""

import math

import numpy as np

SOURCE = "https://github.com/lzx1413/PytorchSSD/issues/22"
KIND = "forward"
EXPECTED = None
ALSO_OK = ()
CHECK = {"mask_convention": "allow"}
TARGET = "attention"


def log_sum_exp(x):
    """``log(sum(exp(x)))`` over the last axis, stable for large |x|; ``-inf`` for a row of ``-inf``."""
    x_max = x.max(axis=-1, keepdims=True)
    x_max = np.where(np.isfinite(x_max), x_max, 0)
    with np.errstate(divide="ignore"):
        return np.log(np.exp(x - x_max).sum(axis=-1, keepdims=True)) + x_max


def attention(q, k, v, mask=None):
    """q [..., n_q, d], k [..., n_k, d], v [..., n_k, d_v], mask bool [..., n_q, n_k] (True = may attend)."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    lse = log_sum_exp(s)  # [..., n_q, 1]
    weights = np.exp(s - np.where(np.isfinite(lse), lse, np.inf))  # empty rows: exp(-inf) = 0
    return weights @ v
