"""Bad inputs: one test per class, checking the error type and its message; fully masked rows; precision."""

import re

import numpy as np
import pytest

import attnlab
from attnlab import DTypeError, MaskedRowError, MaskError, NonFiniteError, ShapeError, masks

rng = np.random.default_rng(0)
Q = rng.normal(size=(2, 4, 2))
K = rng.normal(size=(2, 5, 2))
V = rng.normal(size=(2, 5, 3))


def test_d_k_mismatch_names_both_shapes():
    k = rng.normal(size=(2, 5, 3))
    msg = "k: last dim d_k=3 does not match q's d_k=2 (q (2, 4, 2), k (2, 5, 3), v (2, 5, 3))"
    with pytest.raises(ShapeError, match=re.escape(msg)):
        attnlab.scaled_dot_product_attention(Q, k, V)


def test_n_k_mismatch_between_k_and_v():
    with pytest.raises(ShapeError, match=re.escape("v: n_k=6 (dim -2) does not match k's n_k=5")):
        attnlab.scaled_dot_product_attention(Q, K, rng.normal(size=(2, 6, 3)))


def test_batch_dims_that_do_not_broadcast():
    with pytest.raises(ShapeError, match=r"leading \(batch, head\) dims do not broadcast"):
        attnlab.scaled_dot_product_attention(Q, rng.normal(size=(3, 5, 2)), rng.normal(size=(3, 5, 3)))


def test_one_dimensional_input():
    with pytest.raises(ShapeError, match=r"q: expected at least 2 dims \[\.\.\., n_q, d_k\], got shape \(2,\)"):
        attnlab.scaled_dot_product_attention(np.ones(2), K[0], V[0])


@pytest.mark.parametrize(
    "shapes, name",
    [(((0, 2), (5, 2), (5, 3)), "q"), (((4, 2), (0, 2), (0, 3)), "k"), (((4, 0), (5, 0), (5, 3)), "q")],
)
def test_zero_length_axes(shapes, name):
    q, k, v = (np.ones(s) for s in shapes)
    with pytest.raises(ShapeError, match=rf"{name}: shape .* has a zero-length axis"):
        attnlab.scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize(
    "mask, converter",
    [(np.zeros((4, 5), np.float32), "from_additive"), (np.ones((4, 5), np.int64), "from_keep")],
)
def test_non_bool_mask_names_the_converter(mask, converter):
    with pytest.raises(DTypeError, match=rf"mask: dtype \w+ is not a boolean mask \(True = may attend\).*{converter}"):
        attnlab.scaled_dot_product_attention(Q, K, V, mask)


def test_mask_that_does_not_broadcast():
    with pytest.raises(
        ShapeError, match=re.escape("mask: shape (4, 4) does not broadcast to the scores' shape (2, 4, 5)")
    ):
        attnlab.scaled_dot_product_attention(Q, K, V, np.ones((4, 4), bool))


def test_mask_that_would_invent_batch_dims():
    # [B, 1, 1, n_k] against scores without a head axis would silently make [B, B, n_q, n_k]
    with pytest.raises(ShapeError, match=r"mask: shape \(2, 1, 1, 5\) does not broadcast"):
        attnlab.scaled_dot_product_attention(Q, K, V, masks.key_padding([5, 3], 5))
    out = attnlab.scaled_dot_product_attention(Q, K, V, masks.key_padding([5, 3], 5, ndim=3))
    assert out.shape == (2, 4, 3)


def test_ambiguous_causal_draws_both_alignments():
    with pytest.raises(MaskError) as err:
        attnlab.scaled_dot_product_attention(Q, K, V, causal=True)
    text = str(err.value)
    assert "causal=True: n_q=4 != n_k=5" in text
    assert "'top_left' (PyTorch is_causal, JAX)" in text and "'bottom_right' (FlashAttention" in text
    assert "■ ⬚ ⬚ ⬚ ⬚\n    ■ ■ ⬚ ⬚ ⬚" in text  # top-left drawing
    assert "■ ■ ⬚ ⬚ ⬚\n    ■ ■ ■ ⬚ ⬚" in text  # bottom-right drawing


def test_bad_causal_value_and_policy_and_temperature():
    with pytest.raises(MaskError, match="causal: expected False, True, 'top_left' or 'bottom_right', got 'upper'"):
        attnlab.scaled_dot_product_attention(Q, K, V, causal="upper")
    with pytest.raises(MaskError, match="masked_rows: expected one of 'raise', 'zero', 'nan', got 'ignore'"):
        attnlab.scaled_dot_product_attention(Q, K, V, masked_rows="ignore")
    with pytest.raises(ShapeError, match=r"temperature: expected a finite number > 0, got 0"):
        attnlab.scaled_dot_product_attention(Q, K, V, temperature=0)
    with pytest.raises(NonFiniteError, match="scale: expected a finite number"):
        attnlab.scaled_dot_product_attention(Q, K, V, scale=float("nan"))


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_non_finite_inputs_are_refused_with_their_location(name):
    args = {"q": Q.copy(), "k": K.copy(), "v": V.copy()}
    args[name][1, 2, 1] = np.nan
    args[name][0, 0, 0] = np.inf
    with pytest.raises(NonFiniteError, match=rf"{name}: holds inf at index \(0, 0, 0\) \(2 non-finite entries"):
        attnlab.scaled_dot_product_attention(**args)


def test_non_finite_bias_points_to_masks():
    bias = np.zeros((4, 5))
    bias[1, 1] = -np.inf
    with pytest.raises(NonFiniteError, match=r"bias: holds -inf at index \(1, 1\).*mask="):
        attnlab.scaled_dot_product_attention(Q, K, V, bias=bias)
    with pytest.raises(DTypeError, match="bias: got a bool array"):
        attnlab.scaled_dot_product_attention(Q, K, V, bias=np.ones((4, 5), bool))


def _all_masked_rows():
    m = np.ones((2, 4, 5), bool)
    m[1, 2] = False
    m[0, 0] = False
    return m


def test_all_masked_rows_raise_by_default_naming_the_rows():
    with pytest.raises(MaskedRowError) as err:
        attnlab.scaled_dot_product_attention(Q, K, V, _all_masked_rows())
    assert err.value.rows == ((0, 0), (1, 2))
    assert "2 query row(s) may attend to no key at all, at (*batch, query) index (0, 0), (1, 2)" in str(err.value)


def test_all_masked_rows_zero_policy():
    t = attnlab.attention_trace(Q, K, V, _all_masked_rows(), masked_rows="zero")
    assert t.masked_rows == ((0, 0), (1, 2))
    assert np.all(t.output[0, 0] == 0) and np.all(t.output[1, 2] == 0)
    assert np.all(t.weights[0, 0] == 0)
    assert t.lse[0, 0] == -np.inf
    ref = attnlab.scaled_dot_product_attention(Q[:, 1:], K, V)
    np.testing.assert_allclose(t.output[0, 1:], ref[0], rtol=1e-13)
    assert attnlab.invariants.check(t) == []


def test_all_masked_rows_nan_policy_is_what_naive_code_gives():
    t = attnlab.attention_trace(Q, K, V, _all_masked_rows(), masked_rows="nan")
    assert np.all(np.isnan(t.output[0, 0])) and np.all(np.isnan(t.weights[1, 2]))
    assert np.isfinite(t.output[0, 1:]).all()


@pytest.mark.parametrize("fill", [-np.inf, -1e9, np.finfo(np.float32).min, -1e4])
def test_policy_not_the_fill_value_decides_fully_masked_rows(fill):
    additive = np.zeros((4, 5), np.float32)
    additive[2] = fill
    allowed = masks.from_additive(additive)
    t = attnlab.attention_trace(Q, K, V, allowed, masked_rows="zero")
    assert np.all(t.output[:, 2] == 0)


def test_inputs_are_never_modified():
    q, k, v = Q.copy(), K.copy(), V.copy()
    m = _all_masked_rows()
    m0 = m.copy()
    attnlab.attention_trace(q, k, v, m, bias=np.ones((4, 5)), masked_rows="zero")
    for a, b in ((q, Q), (k, K), (v, V), (m, m0)):
        np.testing.assert_array_equal(a, b)


def test_integer_inputs_are_promoted_to_float64():
    out = attnlab.scaled_dot_product_attention([[1, 0]], [[1, 0], [0, 1]], [[10, 0], [0, 20]])
    assert out.dtype == np.float64


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_low_precision_in_float32_math_and_input_dtype_out(dtype):
    t = attnlab.attention_trace(Q.astype(dtype), K.astype(dtype), V.astype(dtype))
    assert t.output.dtype == dtype and t.weights.dtype == np.float32
    ref = attnlab.scaled_dot_product_attention(
        Q.astype(dtype).astype(np.float64), K.astype(dtype).astype(np.float64), V.astype(dtype).astype(np.float64)
    )
    tol = 2e-3 if dtype == np.float16 else 1e-6
    np.testing.assert_allclose(t.output.astype(np.float64), ref, atol=tol)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("big", [1e4, -1e4])
def test_no_overflow_with_huge_logits(dtype, big):
    # logits of about +-1e4: naive exp would overflow to inf (float32 max exp argument is ~88)
    q = np.array([[1.0, 0.0]], dtype)
    k = np.array([[big, 0.0], [0.0, 0.0], [big / 2, 0.0]], dtype)
    v = np.array([[1.0], [2.0], [3.0]], dtype)
    out = attnlab.scaled_dot_product_attention(q, k, v, scale=1.0)
    assert np.isfinite(out).all()
    assert out[0, 0] == (1.0 if big > 0 else 2.0)


def test_lists_are_accepted():
    out = attnlab.scaled_dot_product_attention([[1.0, 0.0]], [[1.0, 0.0]], [[3.0]])
    np.testing.assert_array_equal(out, [[3.0]])


def test_logits_overflow_error_builder_names_everything():
    from attnlab.errors import RangeError, logits_overflow_error

    err = logits_overflow_error(
        (0, 1, 2),
        float("inf"),
        5,
        (2, 3, 3),
        "float32",
        q_max=1e20,
        k_max=3.0,
        bias_max=None,
        scale=0.5,
        temperature=1.0,
    )
    assert isinstance(err, RangeError) and isinstance(err, ValueError)
    assert str(err) == (
        "logits: (scale · Q Kᵀ + bias) / temperature overflow float32 (largest finite 3.402823e+38) from finite "
        "inputs; inf at (*batch, query, key) index (0, 1, 2) (5 of 18 entries, logits (2, 3, 3)); inputs: max |q| "
        "1e+20, max |k| 3, no bias, scale 0.5, temperature 1. Fix: a smaller scale or smaller q/k/bias, a larger "
        "temperature, or float64 inputs"
    )
    err = logits_overflow_error(
        (1, 0),
        float("nan"),
        -1,
        (4, 4),
        "float64",
        q_max=1.0,
        k_max=1.0,
        bias_max=1e308,
        scale=1.0,
        temperature=0.1,
        index_layout="(query, key)",
        note="Recomputed in float64.",
    )
    assert "nan at (query, key) index (1, 0) (logits (4, 4))" in str(err)
    assert "max |bias| 1e+308" in str(err) and "Recomputed in float64. Fix:" in str(err)
    assert not str(err).endswith("float64 inputs")
