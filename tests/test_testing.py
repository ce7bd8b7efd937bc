"""attnlab.testing: assert_attention_close (the FlashAttention/PyTorch tolerance rule), assert_attention_correct."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from zoo import numpy_zoo as npz

from attnlab import scaled_dot_product_attention as sdpa
from attnlab.testing import assert_attention_close, assert_attention_correct


def _inputs(dtype, seed=0, shape=(2, 3, 17, 8)):
    rng = np.random.default_rng(seed)
    return [torch.from_numpy(rng.normal(0, 1, shape)).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_torch_sdpa_passes_the_rule_against_a_float64_golden(dtype):
    q, k, v = _inputs(dtype)
    golden = sdpa(*(x.double() for x in (q, k, v)))
    with sdpa_kernel(SDPBackend.MATH):  # the same-precision reference: math backend, no upcast
        reference = F.scaled_dot_product_attention(q, k, v)
    assert_attention_close(F.scaled_dot_product_attention(q, k, v), golden, reference=reference)


def test_an_error_beyond_the_rule_is_named_with_position_and_bound():
    q, k, v = _inputs(torch.float16)
    golden = sdpa(*(x.double() for x in (q, k, v)))
    reference = F.scaled_dot_product_attention(q, k, v)
    bad = reference.clone()
    bad[1, 2, 5, 3] += 0.5
    with pytest.raises(
        AssertionError,
        match=r"output: max \|actual - expected\| = 0\.5\d* at \(1, 2, 5, 3\) "
        r"exceeds the tolerance .* \(float16: 2 x reference error .* \+ floor 0\.001 x",
    ):
        assert_attention_close(bad, golden, reference=reference)


def test_factor_and_floor_are_honoured():
    expected = np.zeros((2, 3))
    actual = np.full((2, 3), 3e-5)
    reference = np.full((2, 3), 1e-5)
    assert_attention_close(actual, expected, reference=reference, dtype="float32", factor=2.0)  # 2e-5 + 1e-5
    with pytest.raises(AssertionError):
        assert_attention_close(actual, expected, reference=reference, dtype="float32", factor=1.0)
    assert_attention_close(actual, expected, dtype="float32", floor=1e-4)


def test_shape_and_nan_are_refused():
    with pytest.raises(AssertionError, match=r"output: shape \(2, 3\) does not match expected \(3, 2\)"):
        assert_attention_close(np.zeros((2, 3)), np.zeros((3, 2)))
    a = np.zeros((2, 3))
    a[1, 2] = np.nan
    with pytest.raises(AssertionError, match=r"1 non-finite value\(s\) where expected is finite, first at \(1, 2\)"):
        assert_attention_close(a, np.zeros((2, 3)))


def test_inputs_are_not_modified():
    actual, expected = np.ones((2, 2), np.float32), np.ones((2, 2))
    before = actual.copy(), expected.copy()
    assert_attention_close(actual, expected)
    np.testing.assert_array_equal(actual, before[0])
    np.testing.assert_array_equal(expected, before[1])


def test_assert_attention_correct_passes_clean_and_fails_with_the_report():
    report = assert_attention_correct(npz.correct)
    assert report.ok
    with pytest.raises(AssertionError, match="1 bug found: softmax-axis") as info:
        assert_attention_correct(npz.softmax_axis, probes=("reference",))
    assert "fix: take the softmax over the last axis" in str(info.value)


def test_assert_attention_correct_fails_an_incomplete_battery():
    with pytest.raises(AssertionError, match="no bug found, but not run: causal, padding, masked-rows"):
        assert_attention_correct(npz.correct, probes=("reference",))
