"""Every worked number of the two articles, to the precision they print."""

import numpy as np
import pytest

import attnlab
from attnlab import masks
from attnlab.articles import EXAMPLES, example

I2 = [[1, 0], [0, 1]]
V2 = [[10, 0], [0, 20]]


def test_weighted_average_is_6_5_3_5():
    ex = example("weighted-average")
    np.testing.assert_allclose(ex.weights @ ex.v, [[6.5, 3.5]], rtol=0, atol=1e-12)


def test_one_query_row_by_hand():
    t = attnlab.attention_trace([[1, 0]], I2, V2)
    np.testing.assert_allclose(t.logits, [[0.707, 0.0]], atol=5e-4)
    np.testing.assert_allclose(np.exp(t.logits), [[2.028, 1.0]], atol=5e-4)
    np.testing.assert_allclose(t.weights, [[0.670, 0.330]], atol=5e-4)
    np.testing.assert_allclose(t.output, [[6.70, 6.60]], atol=5e-3)


def test_two_by_two_full():
    t = attnlab.attention_trace(I2, I2, V2)
    np.testing.assert_allclose(t.scores, I2)
    np.testing.assert_allclose(t.logits, [[0.7071, 0], [0, 0.7071]], atol=5e-5)
    np.testing.assert_allclose(t.weights, [[0.6698, 0.3302], [0.3302, 0.6698]], atol=5e-5)
    # The article multiplies by the weights rounded to 4 places: 0.3302 * 20 = 6.604; exact is 6.6048.
    np.testing.assert_allclose(t.output, [[6.698, 6.604], [3.302, 13.396]], atol=1e-3)
    rounded = np.round(t.weights, 4) @ np.asarray(V2)
    np.testing.assert_allclose(rounded, [[6.698, 6.604], [3.302, 13.396]], atol=5e-4)


def test_two_by_two_causal():
    t = attnlab.attention_trace(I2, I2, V2, causal=True)
    assert t.logits[0, 1] == -np.inf
    np.testing.assert_allclose(t.weights, [[1, 0], [0.3302, 0.6698]], atol=5e-5)
    np.testing.assert_allclose(t.output, [[10, 0], [3.302, 13.396]], atol=1e-3)
    assert t.weights[0, 1] == 0.0  # exactly


def test_softmax_saturation():
    np.testing.assert_allclose(attnlab.softmax(np.array([1.0, 2.0])), [0.269, 0.731], atol=5e-4)
    np.testing.assert_allclose(attnlab.softmax(np.array([10.0, 20.0])), [0.000045, 0.999955], atol=5e-7)


def test_softmax_then_mask_leaves_row_sum_0_269():
    logits = np.array([1.0, 2.0])
    wrong = attnlab.softmax(logits) * np.array([1.0, 0.0])  # softmax first, then zero the future
    assert wrong.sum() == pytest.approx(0.269, abs=5e-4)
    right = attnlab.attention_trace([[1.0]], [[1.0], [2.0]], [[1.0], [0.0]], mask=np.array([[True, False]]), scale=1)
    np.testing.assert_array_equal(right.weights, [[1.0, 0.0]])


@pytest.mark.parametrize("temperature", [0.1, 0.5, 1.0, 3.0, 100.0])
def test_first_causal_row_is_one_hot_at_any_temperature(temperature):
    ex = example("causal-4")
    t = attnlab.attention_trace(ex.q, ex.k, ex.v, causal=True, temperature=temperature)
    np.testing.assert_array_equal(t.weights[0], [1.0, 0.0, 0.0, 0.0])


@pytest.mark.parametrize("shift", [10.0, 100.0])
def test_adding_a_constant_to_every_legal_score_changes_nothing(shift):
    ex = example("causal-4")
    base = attnlab.attention_trace(ex.q, ex.k, ex.v, causal=True)
    shifted = attnlab.attention_trace(ex.q, ex.k, ex.v, causal=True, bias=np.full((4, 4), shift))
    np.testing.assert_allclose(shifted.weights, base.weights, rtol=0, atol=1e-12)
    np.testing.assert_allclose(shifted.output, base.output, rtol=0, atol=1e-12)


def test_raising_temperature_flattens_legal_weights_only():
    ex = example("causal-4")
    hot = attnlab.attention_trace(ex.q, ex.k, ex.v, causal=True, temperature=1e6)
    for i in range(4):
        np.testing.assert_allclose(hot.weights[i, : i + 1], 1.0 / (i + 1), atol=1e-6)
        assert np.all(hot.weights[i, i + 1 :] == 0.0)


def test_changing_v1_changes_output_not_weights():
    a = attnlab.attention_trace([[1, 0]], I2, [[10, 0], [0, 20]])
    b = attnlab.attention_trace([[1, 0]], I2, [[100, 0], [0, 20]])
    np.testing.assert_array_equal(a.weights, b.weights)
    assert not np.allclose(a.output, b.output)
    np.testing.assert_allclose(b.output, [[0.670 * 100, 0.330 * 20]], atol=0.05)


def test_four_position_causal_allow_matrix():
    expected = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(masks.causal(4), expected)
    assert masks.causal(4).sum(axis=1).tolist() == [1, 2, 3, 4]
    ex = example("causal-4")
    np.testing.assert_array_equal(attnlab.attention_trace(ex.q, ex.k, ex.v, causal=True).allowed, expected)


def test_every_example_is_named_and_read_only():
    assert set(EXAMPLES) == {"weighted-average", "one-query", "2x2", "2x2-causal", "causal-4", "saturation"}
    with pytest.raises(ValueError):
        example("2x2").q[0, 0] = 5
    with pytest.raises(KeyError, match="choose one of"):
        example("3x3")
