"""Dropout on attention weights (article 001 §18): explicit generator, inverted scaling, training only, mask kept."""

from __future__ import annotations

import numpy as np
import pytest
from test_multihead import random_weights

from attnlab import attention_trace, masks
from attnlab.core.dropout import Dropout, DropoutResult, apply_dropout, dropout, make_dropout
from attnlab.core.multihead import multi_head_attention
from attnlab.errors import DTypeError, OptionError, ShapeError


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
        with pytest.raises(OptionError, match="dropout_p: expected a number with 0 <= dropout_p < 1"):
            multi_head_attention(x, None, w, dropout_p=bad, rng=np.random.default_rng(0), training=True)
    with pytest.raises(OptionError, match="dropout_p"):
        multi_head_attention(x, None, w, dropout_p=2.0)  # refused in evaluation too
    with pytest.raises(OptionError, match="dropout_p: expected a number"):
        make_dropout((2,), "0.1", np.random.default_rng(0))
    with pytest.raises(OptionError, match="training: expected one of False, True, got "):
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
    r = multi_head_attention(x, None, w, causal=True, dropout_p=0.3, rng=np.random.default_rng(5), training=True)
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


# ---------------------------------------------------------------------------------------------------------------
# attnlab.dropout: the functional entry point


def test_dropout_is_exported_and_zeroes_or_scales_each_weight():
    import attnlab

    assert attnlab.dropout is dropout and attnlab.DropoutResult is DropoutResult
    rng = np.random.default_rng(3)
    t = attention_trace(rng.standard_normal((2, 6, 4)), rng.standard_normal((2, 6, 4)), rng.standard_normal((2, 6, 3)))
    before = t.weights.copy()
    d = dropout(t.weights, 0.4, rng=np.random.default_rng(7))
    np.testing.assert_array_equal(t.weights, before)  # the input is not modified
    keep = d.dropout.keep
    assert keep.shape == (2, 6, 6) and keep.dtype == np.bool_ and d.dropout.p == 0.4
    assert (d.output[~keep] == 0).all()  # dropped weights are exactly 0
    np.testing.assert_allclose(d.output[keep], t.weights[keep] / 0.6, rtol=1e-15)
    # the draw multi_head_attention makes for the same shape and generator state
    np.testing.assert_array_equal(keep, make_dropout((2, 6, 6), 0.4, np.random.default_rng(7)).keep)
    # masked weights stay exactly 0
    q, k, v = rng.standard_normal((3, 5, 4))
    c = attention_trace(q, k, v, causal=True)
    assert (dropout(c.weights, 0.5, rng=1).output[masks.causal(5) == 0] == 0).all()


def test_dropout_keep_mask_and_seed_reproduce_exactly():
    w = np.random.default_rng(0).random((3, 4, 5))
    a = dropout(w, 0.3, rng=11)
    b = dropout(w, 0.3, rng=np.random.default_rng(11))  # an int seed is default_rng(seed)
    np.testing.assert_array_equal(a.output, b.output)
    again = dropout(w, 0.3, keep=a.dropout.keep)
    np.testing.assert_array_equal(again.output, a.output)
    reused = dropout(w, 0.3, keep=a.dropout)  # a Dropout from an earlier call
    assert reused.dropout is a.dropout
    np.testing.assert_array_equal(reused.output, a.output)
    shared = dropout(w, 0.5, keep=[True, False, True, True, False])  # broadcast over [..., n_k]
    np.testing.assert_array_equal(shared.output[..., 1], 0.0)
    np.testing.assert_array_equal(shared.output[..., 0], w[..., 0] * 2.0)
    assert dropout(w, 0.0).output is w and dropout(w, 0.0).dropout is None  # p = 0: nothing to draw


def test_dropout_preserves_the_mean_in_expectation():
    a = np.random.default_rng(2).dirichlet(np.ones(6), size=4)  # [4, 6] rows of weights summing to 1
    n, p = 20_000, 0.25
    out = dropout(np.broadcast_to(a, (n, 4, 6)), p, rng=5).output  # n independent masks at once
    # each entry's mean over n masks: std a * sqrt(p / (1 - p) / n) <= 0.0041; 0.02 is five of them
    np.testing.assert_allclose(out.mean(axis=0), a, atol=0.02)
    assert abs((out > 0).mean() - (1 - p)) < 0.005
    np.testing.assert_allclose(out.sum(-1).mean(), 1.0, atol=0.005)  # rows sum to 1 on average, not each


def test_dropout_keeps_the_library_and_promotes_integers():
    import torch

    w = torch.full((2, 3), 0.5, dtype=torch.float32)
    d = dropout(w, 0.5, rng=0)
    assert isinstance(d.output, torch.Tensor) and d.output.dtype == torch.float32
    assert set(d.output.flatten().tolist()) <= {0.0, 1.0}
    i = dropout([[1, 0], [0, 1]], 0.5, keep=np.ones((2, 2), bool))
    assert i.output.dtype == np.float64 and i.output.tolist() == [[2.0, 0.0], [0.0, 2.0]]
    half = dropout(np.full(4, 0.5, np.float16), 0.5, keep=np.ones(4, bool))
    assert half.output.dtype == np.float16


@pytest.mark.parametrize("bad", [1.0, 1, -0.1, float("nan"), float("inf"), "0.1", True, None])
def test_dropout_p_outside_0_1_is_refused_by_name(bad):
    with pytest.raises(OptionError, match=r"p: expected a number with 0 <= p < 1, got"):
        dropout(np.ones((2, 2)), bad, rng=0)


def test_dropout_errors_name_the_argument():
    w = np.full((2, 3), 1 / 3)
    with pytest.raises(OptionError, match=r"p = 1 would drop every weight"):
        dropout(w, 1.0, rng=0)
    with pytest.raises(DTypeError, match=r"rng: dropout with p=0.5 needs an explicit numpy.random.Generator"):
        dropout(w, 0.5)
    with pytest.raises(DTypeError, match=r"or an int seed >= 0, got -1"):
        dropout(w, 0.5, rng=-1)
    with pytest.raises(OptionError, match=r"rng, keep: give one of them"):
        dropout(w, 0.5, rng=0, keep=np.ones((2, 3), bool))
    with pytest.raises(DTypeError, match=r"keep: expected a boolean mask \(True = kept\), got dtype float64"):
        dropout(w, 0.5, keep=np.ones((2, 3)))
    with pytest.raises(ShapeError, match=r"keep: shape \(4,\) does not broadcast to the weights' \(2, 3\)"):
        dropout(w, 0.5, keep=np.ones(4, bool))
    with pytest.raises(OptionError, match=r"keep: a Dropout drawn with p=0.5, but p=0.2"):
        dropout(w, 0.2, keep=Dropout(p=0.5, keep=np.ones((2, 3), bool)))
    with pytest.raises(DTypeError, match=r"weights: expected an array"):
        dropout("weights", 0.5, rng=0)
    with pytest.raises(DTypeError, match=r"weights: dtype complex128 is not supported"):
        dropout(np.ones(2, complex), 0.5, rng=0)
    with pytest.raises(OptionError, match=r"p: expected a number with 0 <= p < 1, got 1"):
        Dropout(p=1, keep=np.ones(2, bool))  # a hand-made mask is checked too
    with pytest.raises(DTypeError, match=r"keep: expected a boolean NumPy array"):
        Dropout(p=0.5, keep=[True])
