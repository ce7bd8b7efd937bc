"""Dropout on attention weights (article 001 §18): explicit generator, inverted scaling, training only, mask kept."""

from __future__ import annotations

import numpy as np
import pytest
from test_multihead import random_weights

from attnlab import attention_trace, masks
from attnlab.core.dropout import Dropout, apply_dropout, make_dropout
from attnlab.core.multihead import multi_head_attention
from attnlab.errors import OptionError, ShapeError


def _layer():
    rng = np.random.default_rng(0)
    return random_weights(rng, 8, 2), rng.standard_normal((2, 5, 8))


def test_evaluation_is_deterministic_and_ignores_dropout():
    w, x = _layer()
    plain = multi_head_attention(x, None, w, causal=True)
    for _ in range(2):
        r = multi_head_attention(x, None, w, causal=True, dropout_p=0.5, training=False)  # no rng needed
        assert r.dropout is None
        np.testing.assert_array_equal(r.output, plain.output)


def test_training_needs_a_generator_and_a_valid_p():
    w, x = _layer()
    with pytest.raises(
        OptionError, match=r"rng: dropout_p=0.5 in training mode needs an explicit numpy.random.Generator"
    ):
        multi_head_attention(x, None, w, dropout_p=0.5, training=True)
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(OptionError, match="dropout_p: expected 0 <= dropout_p < 1"):
            multi_head_attention(x, None, w, dropout_p=bad, rng=np.random.default_rng(0), training=True)
    with pytest.raises(OptionError, match="dropout_p"):
        multi_head_attention(x, None, w, dropout_p=2.0)  # refused in evaluation too
    with pytest.raises(OptionError, match="dropout_p: expected a number"):
        make_dropout((2,), "0.1", np.random.default_rng(0))
    with pytest.raises(OptionError, match="training: expected True or False"):
        multi_head_attention(x, None, w, training="yes")
    assert multi_head_attention(x, None, w, dropout_p=0.0, training=True).dropout is None  # p = 0: nothing to draw


def test_same_seed_same_mask_and_inverted_scaling():
    w, x = _layer()
    a = multi_head_attention(x, None, w, causal=True, dropout_p=0.3, rng=np.random.default_rng(5), training=True)
    b = multi_head_attention(x, None, w, causal=True, dropout_p=0.3, rng=np.random.default_rng(5), training=True)
    c = multi_head_attention(x, None, w, causal=True, dropout_p=0.3, rng=np.random.default_rng(6), training=True)
    np.testing.assert_array_equal(a.dropout.keep, b.dropout.keep)
    np.testing.assert_array_equal(a.output, b.output)
    assert (a.dropout.keep != c.dropout.keep).any()
    assert a.dropout.keep.shape == (2, 2, 5, 5)
    dropped = apply_dropout(a.trace.weights, a.dropout)
    keep = a.dropout.keep
    np.testing.assert_allclose(dropped[keep], a.trace.weights[keep] / 0.7, rtol=1e-15)
    assert (dropped[~keep] == 0).all()
    assert (dropped[:, :, masks.causal(5) == 0] == 0).all()  # masked weights stay exactly 0
    # the returned weights are the softmax's (rows sum to 1); the output uses the dropped ones
    r = multi_head_attention(
        x, None, w, causal=True, dropout_p=0.3, rng=np.random.default_rng(5), training=True, return_weights=True
    )
    np.testing.assert_allclose(r.weights.sum(-1), 1.0)
    heads = (dropped @ a.trace.v).transpose(0, 2, 1, 3).reshape(2, 5, -1)
    np.testing.assert_allclose(a.output, heads @ w.w_o + w.b_o, rtol=1e-12)


def test_keep_rate_and_unbiased_expectation():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((4, 3)), rng.standard_normal((6, 3)), rng.standard_normal((6, 2))
    t = attention_trace(q, k, v)
    p, n = 0.25, 20_000
    keep = make_dropout((n, 4, 6), p, rng).keep
    assert abs(keep.mean() - (1 - p)) < 0.01  # 480k draws: std 6e-4
    mean_out = (keep.mean(axis=0) / (1 - p) * t.weights) @ v  # E[(A ∘ keep / (1 - p)) V] = A V
    np.testing.assert_allclose(mean_out, t.output, atol=0.02)


def test_apply_dropout_errors_and_identity():
    w = np.full((2, 3), 1 / 3)
    assert apply_dropout(w, None) is w
    with pytest.raises(ShapeError, match=r"dropout: keep mask shape \(4,\) does not broadcast"):
        apply_dropout(w, Dropout(p=0.5, keep=np.ones(4, bool)))
