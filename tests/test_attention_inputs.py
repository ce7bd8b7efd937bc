"""Bad inputs: one test per class, checking the error type and its message; fully masked rows; precision."""

import re

import numpy as np
import pytest
from reference import reference_attention

import attnlab
from attnlab import (
    DTypeError,
    MaskedRowError,
    MaskError,
    MemoryLimitError,
    NonFiniteError,
    OptionError,
    RangeError,
    ShapeError,
    masks,
)
from attnlab.core.attention import dense_bytes

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
    with pytest.raises(OptionError, match=r"temperature: expected a finite number > 0, got 0"):
        attnlab.scaled_dot_product_attention(Q, K, V, temperature=0)
    with pytest.raises(OptionError, match="scale: expected a finite number, got nan"):
        attnlab.scaled_dot_product_attention(Q, K, V, scale=float("nan"))
    with pytest.raises(OptionError, match="scale: expected a finite number, got 'big'"):
        attnlab.scaled_dot_product_attention(Q, K, V, scale="big")


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


# --------------------------------------------------------------------------------------------------------------
# logits that overflow: float32 is recomputed in float64 (exact), float64 overflow is a named RangeError


def _overflow_message(dtype, index, count, shape, q_max, k_max, bias, scale, temperature, note=""):
    limit = {"float32": "3.402823e+38", "float64": "1.797693e+308"}[dtype]
    fix = "a smaller scale or smaller q/k/bias, a larger temperature" + (
        ", or float64 inputs" if dtype != "float64" else ""
    )
    return (
        f"logits: (scale · Q Kᵀ + bias) / temperature overflow {dtype} (largest finite {limit}) from finite inputs; "
        f"inf at (*batch, query, key) index {index} ({count} of {int(np.prod(shape))} entries, logits {shape}); "
        f"inputs: max |q| {q_max}, max |k| {k_max}, {bias}, scale {scale}, temperature {temperature}.{note} Fix: {fix}"
    )


def test_float32_logits_that_overflow_are_recomputed_in_float64_exactly():
    q = np.full((3, 4), 1e20, np.float32)  # Q Kᵀ = 4e40 > float32's 3.4e38: NaN before
    out = attnlab.scaled_dot_product_attention(q, q, q)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, q)  # equal logits: uniform weights over equal values
    t = attnlab.attention_trace(q, q, q)
    assert t.logits.dtype == np.float64 and t.weights.dtype == np.float64  # the trace says how it was computed
    np.testing.assert_array_equal(t.weights, np.full((3, 3), 1 / 3))
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(2, 5, 3)).astype(np.float32) for _ in range(3))
    ref, _ = reference_attention(q, k, v, scale=1e39)  # float32 cannot hold the scale itself
    got = attnlab.scaled_dot_product_attention(q, k, v, scale=1e39)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    bias = rng.normal(size=(5, 5)) * 1e300  # a float64 bias float32 cannot hold
    ref, _ = reference_attention(q, k, v, bias=bias)
    np.testing.assert_allclose(attnlab.scaled_dot_product_attention(q, k, v, bias=bias), ref, rtol=1e-6, atol=1e-6)


def test_float32_temperature_below_its_range_is_computed_in_float64():
    q = np.eye(3, 4, dtype=np.float32)
    ref, _ = reference_attention(q, q, q, temperature=1e-300)
    got = attnlab.scaled_dot_product_attention(q, q, q, temperature=1e-300)
    np.testing.assert_array_equal(got, ref.astype(np.float32))  # one-hot weights


def test_float64_logits_that_overflow_name_what_overflowed():
    x = np.ones((3, 4))
    with pytest.raises(RangeError) as err:
        attnlab.scaled_dot_product_attention(2 * x, x, x, scale=1e308)
    assert str(err.value) == _overflow_message("float64", (0, 0), 9, (3, 3), "2", "1", "no bias", "1e+308", "1")
    with pytest.raises(RangeError) as err:
        attnlab.scaled_dot_product_attention(x, x, x, bias=np.full((3, 3), 1e308), temperature=0.1)
    assert str(err.value) == _overflow_message(
        "float64", (0, 0), 9, (3, 3), "1", "1", "max |bias| 1e+308", "0.5", "0.1"
    )


def test_float32_that_overflows_in_float64_too_says_so():
    q = np.full((2, 2), 1e30, np.float32)
    with pytest.raises(RangeError) as err:
        attnlab.scaled_dot_product_attention(q, q, q, scale=1e300)
    note = " The inputs were already recomputed in float64."
    assert str(err.value) == _overflow_message(
        "float64", (0, 0), 4, (2, 2), "1.000000e+30", "1.000000e+30", "no bias", "1e+300", "1", note
    ).replace("1.000000e+30", "1e+30")


@pytest.mark.parametrize("masked_rows", ["raise", "zero", "nan"])
def test_underflowing_temperature_is_an_overflow_not_a_masked_row(masked_rows):
    x = np.ones((3, 4))
    with pytest.raises(RangeError, match=r"overflow float64 .* temperature 1e-310\. Fix"):
        attnlab.scaled_dot_product_attention(x, x, x, temperature=1e-310, masked_rows=masked_rows)
    z = np.zeros((3, 4))  # logits 0 / 1e-310 = 0: nothing overflows, the exact answer is uniform
    np.testing.assert_array_equal(attnlab.scaled_dot_product_attention(z, z, x, temperature=1e-310), x[:, :4])


def test_overflow_at_a_masked_entry_does_not_count():
    q = np.array([[1.0, 0.0], [0.0, 1.0]])
    k = np.array([[1.0, 0.0], [1e200, 0.0]])
    v = np.array([[1.0], [2.0]])
    mask = np.array([[True, False], [True, True]])
    out = attnlab.scaled_dot_product_attention(q, k, v, mask, scale=1e200)  # q0·k1 = 1e400 is blocked
    np.testing.assert_allclose(out, reference_attention(q, k, v, mask, scale=1e200)[0])


# --------------------------------------------------------------------------------------------------------------
# memory: the dense path says what it needs before allocating it


def test_dense_size_check_names_the_bytes_and_flash_attention():
    x = np.ones((200_000, 1))
    with pytest.raises(MemoryLimitError) as err:
        attnlab.scaled_dot_product_attention(x, x, x)
    assert isinstance(err.value, MemoryError)
    assert str(err.value) == (
        "q, k, v: the dense path needs about 2.11 TiB for scores (200000, 200000) [..., n_q, n_k] in float64 "
        "(7 float64 arrays of that shape: Q Kᵀ, logits, a temporary, masked logits, exp, weights, the trace's logits; "
        "and 2 bool ones), more than max_bytes=17179869184 (16 GiB). Use attnlab.flash_attention (exact, O(n) "
        "memory: the scores are never formed), or pass a larger max_bytes= (None: no limit)"
    )
    q = np.ones((2, 10, 3), np.float32)
    need = dense_bytes((2, 10, 10), "float32")
    assert need == 200 * (7 * 4 + 2)
    attnlab.attention_trace(q, q, q, max_bytes=need)  # exactly at the limit: fine
    with pytest.raises(MemoryLimitError, match=r"needs about 5.86 KiB .* more than max_bytes=5999 \(5.86 KiB\)"):
        attnlab.attention_trace(q, q, q, max_bytes=need - 1)
    with pytest.raises(OptionError, match="max_bytes: expected an int >= 1, got 0"):
        attnlab.scaled_dot_product_attention(q, q, q, max_bytes=0)
    r = attnlab.multi_head_attention(
        np.ones((1, 10, 4)), None, attnlab.init_multi_head(4, 2, rng=np.random.default_rng(0)), max_bytes=None
    )
    assert r.output.shape == (1, 10, 4)


# --------------------------------------------------------------------------------------------------------------
# arguments of the wrong kind: named errors, never an internal exception


def test_numpy_and_torch_arguments_mixed_name_each_library():
    import torch

    x = np.ones((3, 4))
    with pytest.raises(DTypeError) as err:
        attnlab.scaled_dot_product_attention(x, torch.ones(3, 4, dtype=torch.float64), x)
    assert str(err.value) == (
        "arrays of different libraries cannot be mixed in one call: q, v are numpy.ndarray; k is a torch.Tensor; "
        "convert them to one library first (torch.as_tensor(x), x.numpy(), np.asarray(x))"
    )
    t = torch.ones(3, 4, dtype=torch.float64)
    with pytest.raises(DTypeError, match=r"q is a numpy.ndarray; mask is a torch.Tensor"):
        attnlab.scaled_dot_product_attention(x, x, x, mask=torch.ones(3, 3, dtype=torch.bool))
    out = attnlab.scaled_dot_product_attention(t, t, t, mask=np.ones((3, 3), bool), bias=np.zeros((3, 3)))
    assert isinstance(out, torch.Tensor)  # NumPy masks and biases go with any library (the masks module's output)


def test_masked_arrays_are_refused_as_ambiguous():
    x = np.ones((3, 4))
    m = np.ma.masked_array(x, mask=x > 0)
    with pytest.raises(DTypeError, match=r"^k: a numpy.ma.MaskedArray is refused \(whether its masked entries"):
        attnlab.scaled_dot_product_attention(x, m, x)
    with pytest.raises(DTypeError, match=r"^mask: a numpy.ma.MaskedArray is refused"):
        attnlab.scaled_dot_product_attention(x, x, x, mask=np.ma.masked_array(np.ones((3, 3), bool)))

    class Sub(np.ndarray):
        pass

    assert type(attnlab.scaled_dot_product_attention(x.view(Sub), x, x)) is np.ndarray  # other subclasses: viewed


@pytest.mark.parametrize(
    ("dtype", "shown"),
    [
        ("datetime64[s]", "datetime64[s]"),
        ("timedelta64[s]", "timedelta64[s]"),
        (object, "object"),
        (str, "<U32"),
        (complex, "complex128"),
        ("S3", "|S3"),
    ],
)
def test_unsupported_dtypes_name_the_argument_and_dtype(dtype, shown):
    x = np.ones((3, 4))
    with pytest.raises(DTypeError) as err:
        attnlab.scaled_dot_product_attention(x, np.ones((3, 4)).astype(dtype), x)
    assert str(err.value) == f"k: dtype {shown} is not supported; expected a real floating or integer dtype"


def test_non_arrays_and_ragged_lists_are_named():
    x = np.ones((3, 4))
    with pytest.raises(
        DTypeError,
        match=r"^v: expected an array \(NumPy, PyTorch, any array-API library\) or "
        r"nested lists, got dict$",
    ):
        attnlab.scaled_dot_product_attention(x, x, {"a": 1})
    with pytest.raises(ShapeError, match=r"^q: nested lists of unequal lengths do not form an array$"):
        attnlab.scaled_dot_product_attention([[1.0, 2.0], [3.0]], x, x)
    with pytest.raises(DTypeError, match=r"^q: expected an array"):
        attnlab.scaled_dot_product_attention("abc", x, x)


def test_meta_tensors_are_refused_naming_the_device():
    import torch

    m = torch.ones(3, 4, device="meta")
    with pytest.raises(DTypeError) as err:
        attnlab.scaled_dot_product_attention(m, m, m)
    assert str(err.value) == (
        "q: a tensor on device 'meta' holds no values to compute with (shape (3, 4)); create or move it on a real "
        "device (.to('cpu'))"
    )


def test_long_double_is_computed_in_float64_never_float32():
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=(4, 3)) for _ in range(3))
    t = attnlab.attention_trace(q.astype(np.longdouble), k.astype(np.longdouble), v.astype(np.longdouble))
    assert t.weights.dtype == np.float64 and t.output.dtype == np.float64
    np.testing.assert_allclose(t.output, reference_attention(q, k, v)[0], rtol=1e-13)


def test_scale_and_temperature_are_options():
    x = np.ones((3, 4))
    with pytest.raises(OptionError, match=r"^temperature: expected a finite number > 0, got -1$"):
        attnlab.scaled_dot_product_attention(x, x, x, temperature=-1)
    with pytest.raises(OptionError, match=r"^scale: expected a finite number, got inf$"):
        attnlab.scaled_dot_product_attention(x, x, x, scale=np.inf)
    np.testing.assert_array_equal(attnlab.scaled_dot_product_attention(x, x, x, scale=np.array(0.5)), x)


# --------------------------------------------------------------------------------------------------------------
# softmax, log_softmax, masked_softmax


def test_softmax_family_with_huge_inputs():
    assert attnlab.softmax([1e308, -1e308]).tolist() == [1.0, 0.0]
    assert attnlab.softmax(np.array([-1e308, 1e308, 1e308])).tolist() == [0.0, 0.5, 0.5]
    assert attnlab.softmax(np.array([0.0, -np.inf])).tolist() == [1.0, 0.0]
    with pytest.raises(RangeError) as err:
        attnlab.log_softmax(np.array([1e308, -1e308]))
    assert str(err.value) == (
        "x: log_softmax at index (1,) is below the most negative float64 (-1.797693e+308): x there is -1e+308 and "
        "its row's largest entry 1e+308, further apart than float64 can hold; scale x down"
    )
    with pytest.raises(RangeError, match="does not fit in float16"):
        attnlab.log_softmax(np.array([60000.0, -60000.0], np.float16))
    w, lse, empty = attnlab.masked_softmax(
        np.array([[1e308, -1e308], [5.0, 1.0]]), np.array([[True, True], [False, False]])
    )
    assert w.tolist() == [[1.0, 0.0], [0.0, 0.0]] and empty.tolist() == [False, True] and lse[1] == -np.inf


def test_softmax_family_refuses_what_has_no_softmax():
    with pytest.raises(NonFiniteError, match=r"^x: the row at index \(0, 0\) .* holds NaN"):
        attnlab.softmax(np.array([[np.nan, 1.0]]))
    with pytest.raises(NonFiniteError, match=r"^x: the row at index \(1, 0\) .* has -inf at every entry"):
        attnlab.softmax(np.array([[0.0, 1.0], [-np.inf, -np.inf]]))
    with pytest.raises(NonFiniteError, match=r"holds \+inf"):
        attnlab.log_softmax(np.array([np.inf, 1.0]))
    with pytest.raises(NonFiniteError, match=r"^logits: the row at index \(0, 0\) .* has -inf at every allowed entry"):
        attnlab.masked_softmax(np.array([[-np.inf, 3.0]]), np.array([[True, False]]))
    with pytest.raises(OptionError, match=r"^axis: expected an int in \[-1, 0\] for x of shape \(2,\), got 1$"):
        attnlab.softmax([1.0, 2.0], axis=1)
    with pytest.raises(ShapeError, match=r"^x: a 0-d array"):
        attnlab.softmax(3.0)
    with pytest.raises(DTypeError, match=r"^x: dtype <U1 is not supported"):
        attnlab.softmax(np.array(["a", "b"]))
    with pytest.raises(DTypeError, match=r"^allowed: dtype int64; expected a bool mask"):
        attnlab.masked_softmax(np.zeros((1, 2)), np.ones((1, 2), int))
    with pytest.raises(ShapeError, match=r"^allowed: shape \(3,\) does not broadcast to the logits' shape \(1, 2\)"):
        attnlab.masked_softmax(np.zeros((1, 2)), np.ones(3, bool))
    # values at disallowed entries are ignored, even NaN
    w, _, _ = attnlab.masked_softmax(np.array([[np.nan, 0.0]]), np.array([[False, True]]))
    assert w.tolist() == [[0.0, 1.0]]


def test_softmax_low_precision_computes_in_float32():
    x = np.array([1.0, 2.0, 3.0], np.float16)
    y = attnlab.softmax(x)
    assert y.dtype == np.float16
    ref = np.exp(np.array([1.0, 2.0, 3.0]) - 3) / np.exp(np.array([1.0, 2.0, 3.0]) - 3).sum()
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=1e-3)
    assert attnlab.softmax([1, 2]).dtype == np.float64  # integers: float64


def test_q_k_that_overflow_under_a_tiny_scale_are_rescaled_exactly():
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(3, 2)) * 1e200, rng.normal(size=(4, 2)) * 1e200, rng.normal(size=(4, 2))
    t = attnlab.attention_trace(q, k, v, scale=1e-300)  # Q Kᵀ ~ 1e400 overflows, scale · Q Kᵀ ~ 1e100 does not
    assert np.isinf(t.scores).any() and np.isfinite(t.logits).all()
    ref, _ = reference_attention(q * 1e-200, k * 1e-200, v, scale=1e100)  # the same logits, formed without overflow
    np.testing.assert_allclose(t.output, ref, rtol=1e-12, atol=1e-12)
    g = attnlab.attention_backward(t, np.ones((3, 2)))
    assert all(np.isfinite(x).all() for x in (g.dq, g.dk, g.dv))
