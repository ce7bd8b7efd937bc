"""The canonical mask (True = may attend): constructors, converters at the edges, drawing."""

import re

import numpy as np
import pytest
import torch

from attnlab import DTypeError, MaskError, NonFiniteError, OptionError, ShapeError, masks


def test_causal_square_and_both_alignments():
    np.testing.assert_array_equal(masks.causal(3), np.tril(np.ones((3, 3), bool)))
    assert masks.to_string(masks.causal(2, 4, align="top_left")) == "■ ⬚ ⬚ ⬚\n■ ■ ⬚ ⬚"
    assert masks.to_string(masks.causal(2, 4, align="bottom_right")) == "■ ■ ■ ⬚\n■ ■ ■ ■"
    # more queries than keys, bottom-right: the first rows see nothing
    assert masks.to_string(masks.causal(3, 2, align="bottom_right")) == "⬚ ⬚\n■ ⬚\n■ ■"
    with pytest.raises(MaskError, match="causal: n_q=2 != n_k=4"):
        masks.causal(2, 4)
    with pytest.raises(MaskError, match="align: expected 'top_left' or 'bottom_right', got 'left'"):
        masks.causal(2, 4, align="left")
    with pytest.raises(ShapeError, match="n_q: expected a positive int, got 0"):
        masks.causal(0)


def test_window():
    w = masks.window(5, left=2)
    for i in range(5):
        for j in range(5):
            assert w[i, j] == (i - 2 <= j <= i)
    both = masks.window(5, left=1, right=1)
    assert masks.to_string(both).splitlines()[2] == "⬚ ■ ■ ■ ⬚"
    assert masks.window(3, left=None, right=None).all()
    np.testing.assert_array_equal(masks.window(4, left=None), masks.causal(4))
    with pytest.raises(MaskError, match="left: expected None or an int >= 0, got -1"):
        masks.window(3, left=-1)


def test_key_and_query_padding():
    kp = masks.key_padding([3, 1], 4)
    assert kp.shape == (2, 1, 1, 4)
    np.testing.assert_array_equal(kp[:, 0, 0], [[1, 1, 1, 0], [1, 0, 0, 0]])
    assert masks.key_padding([3, 1], 4, ndim=3).shape == (2, 1, 4)
    qp = masks.query_padding([2, 3], 3)
    assert qp.shape == (2, 1, 3, 1)
    combined = masks.key_padding([2, 3], 3) & qp  # [2, 1, 3, 3]
    assert masks.to_string(combined[0]) == "■ ■ ⬚\n■ ■ ⬚\n⬚ ⬚ ⬚"
    with pytest.raises(ShapeError, match=re.escape("lengths: entry 1 is 5; expected 0 <= length <= n_k=4")):
        masks.key_padding([1, 5], 4)
    with pytest.raises(ShapeError, match="lengths: expected a 1-D integer array"):
        masks.key_padding([[1]], 4)


def test_zero_padded_queries_copies():
    out = np.ones((2, 3, 2))
    z = masks.zero_padded_queries(out, [1, 3])
    assert z[0, 1:].sum() == 0 and z[0, 0].sum() == 2 and z[1].sum() == 6
    assert out.sum() == 12  # untouched


def test_segments_block_diagonal():
    s = masks.segments([0, 0, 1, 1, 1])
    assert s.sum() == 4 + 9
    cross = masks.segments(np.array([[0, 1]]), np.array([[0, 0, 1]]))
    assert cross.shape == (1, 2, 3)
    np.testing.assert_array_equal(cross[0], [[1, 1, 0], [0, 0, 1]])
    packed_causal = masks.segments([0, 0, 1]) & masks.causal(3)
    assert masks.to_string(packed_causal) == "■ ⬚ ⬚\n■ ■ ⬚\n⬚ ⬚ ■"


def test_combine_with_and_or():
    m = masks.causal(3) | masks.window(3, left=0, right=None)
    assert m.all()


@pytest.mark.parametrize("fill", [-np.inf, -1e9, -1e4, np.finfo(np.float16).min, np.finfo(np.float32).min])
def test_from_additive_accepts_every_blocking_value(fill):
    m = np.array([[0.0, fill]])
    np.testing.assert_array_equal(masks.from_additive(m), [[True, False]])


def test_from_additive_refuses_a_bias():
    with pytest.raises(MaskError, match=r"holds -0.5 at \(0, 1\), neither 0 nor a blocking value.*pass it as bias="):
        masks.from_additive(np.array([[0.0, -0.5]]))
    with pytest.raises(DTypeError, match="already canonical"):
        masks.from_additive(np.array([True]))


def test_from_keep_and_blocked():
    np.testing.assert_array_equal(masks.from_keep(np.array([1, 0, 1])), [True, False, True])
    with pytest.raises(MaskError, match=r"only 0 and 1, but entry \(1,\) is 2"):
        masks.from_keep(np.array([1, 2]))
    np.testing.assert_array_equal(masks.from_blocked(np.array([True, False])), [False, True])
    with pytest.raises(DTypeError, match="a True = blocked mask is boolean"):
        masks.from_blocked(np.array([1, 0]))


def test_from_hf_two_and_four_dims():
    am = torch.tensor([[1, 1, 0], [1, 1, 1]])
    m = masks.from_hf(am)
    assert tuple(m.shape) == (2, 1, 1, 3) and m.dtype == torch.bool
    assert m[0, 0, 0].tolist() == [True, True, False]
    ext = (1.0 - am[:, None, None, :].float()) * torch.finfo(torch.float32).min  # HF's "extended" mask
    assert torch.equal(masks.from_hf(ext), m)
    with pytest.raises(ShapeError, match="attention_mask: expected"):
        masks.from_hf(torch.ones(3, dtype=torch.long))


def test_from_torch_mha_needs_num_heads_for_3d():
    with pytest.raises(ShapeError, match="pass num_heads="):
        masks.from_torch_mha(attn_mask=torch.zeros(4, 2, 2, dtype=torch.bool))
    with pytest.raises(MaskError, match="pass key_padding_mask=, attn_mask= or both"):
        masks.from_torch_mha()


def test_from_jax():
    import jax.numpy as jnp

    m = masks.from_jax(jnp.array([[True, False]]))
    assert np.asarray(m).tolist() == [[True, False]]
    with pytest.raises(DTypeError, match="JAX masks are boolean"):
        masks.from_jax(jnp.array([[0.0, 1.0]]))


def test_to_additive_float16_does_not_overflow():
    add = masks.to_additive(masks.causal(3), np.float16)
    assert add.dtype == np.float16 and np.isfinite(add).all()
    assert add[0, 1] == np.finfo(np.float16).min
    assert np.isneginf(masks.to_additive(masks.causal(3), fill="-inf")[0, 2])
    # and the round trip
    np.testing.assert_array_equal(masks.from_additive(add), masks.causal(3))
    np.testing.assert_array_equal(masks.to_blocked(masks.causal(2)), [[False, True], [False, False]])


def test_to_string_refuses_what_it_cannot_draw():
    with pytest.raises(DTypeError, match="expected bool"):
        masks.to_string(np.zeros((2, 2)))
    with pytest.raises(ShapeError, match="index it down"):
        masks.to_string(np.ones((2, 2, 2), bool))
    assert masks.to_string(np.ones((1, 1, 2, 2), bool)) == "■ ■\n■ ■"


def test_from_additive_threshold_must_be_negative():
    with pytest.raises(OptionError) as err:
        masks.from_additive(np.zeros((2, 2)), threshold=5)
    assert str(err.value) == (
        "threshold: expected a negative number (an entry <= threshold blocks its key, 0 keeps it; default -10000), "
        "got 5"
    )
    for bad in (0, 0.0, float("nan"), "low", True):
        with pytest.raises(OptionError, match=r"^threshold: expected"):
            masks.from_additive(np.zeros((2, 2)), threshold=bad)
    m = np.array([[0.0, -1.0, -np.inf]])
    assert masks.from_additive(m, threshold=-0.5).tolist() == [[True, False, False]]
    assert masks.from_additive(np.array([[0.0, -np.inf]]), threshold=-np.inf).tolist() == [[True, False]]


def test_from_additive_refuses_nan_and_non_float():
    with pytest.raises(NonFiniteError, match=r"^mask: additive mask \(1, 2\) holds NaN at \(0, 1\)"):
        masks.from_additive(np.array([[0.0, np.nan]]))
    with pytest.raises(MaskError, match=r"^attn_mask: additive mask \(1, 2\) holds inf at \(0, 1\)"):
        masks.from_torch_sdpa(np.array([[0.0, np.inf]]))
    with pytest.raises(DTypeError, match=r"^mask: expected an additive float mask, got dtype int64"):
        masks.from_additive(np.array([[0, -10_000]]))


def test_to_additive_needs_a_floating_dtype():
    for dtype in (np.int32, "int8", bool, "not a dtype"):
        with pytest.raises(DTypeError, match=r"^dtype: expected a floating dtype for an additive mask"):
            masks.to_additive(masks.causal(2), dtype)
    with pytest.raises(DTypeError) as err:
        masks.to_additive(masks.causal(2), np.int32)
    assert str(err.value) == (
        "dtype: expected a floating dtype for an additive mask (float32, float16, bfloat16, float64), got "
        "dtype('int32'); an integer dtype cannot hold -inf, and a bool mask is attnlab's own"
    )
    t = masks.to_additive(torch.tensor([[True, False]]), torch.bfloat16)
    assert t.dtype == torch.bfloat16 and t[0, 1] == torch.finfo(torch.bfloat16).min
    assert masks.to_additive([[True, False]], np.float64).tolist() == [[0.0, np.finfo(np.float64).min]]


def test_from_torch_mha_mismatched_shapes_name_both():
    with pytest.raises(ShapeError) as err:
        masks.from_torch_mha(key_padding_mask=np.zeros((2, 5), bool), attn_mask=np.zeros((3, 4), bool))
    assert str(err.value) == (
        "attn_mask: shape (3, 4) does not fit key_padding_mask's (2, 5) (as [B, 1, 1, n_k] (2, 1, 1, 5) against "
        "(3, 4) [B, h, n_q, n_k]): n_k and B must agree"
    )
    with pytest.raises(ShapeError, match=r"^attn_mask: shape \(6, 3, 5\) does not fit key_padding_mask's \(2, 5\)"):
        masks.from_torch_mha(
            key_padding_mask=np.zeros((2, 5), bool), attn_mask=np.zeros((6, 3, 5), bool), num_heads=2
        )  # B = 3 from attn_mask, 2 from key_padding_mask
    with pytest.raises(OptionError, match=r"^num_heads: expected an int >= 1, got 0"):
        masks.from_torch_mha(attn_mask=np.zeros((2, 2), bool), num_heads=0)
    with pytest.raises(DTypeError, match=r"key_padding_mask is a torch\.Tensor; attn_mask is a numpy\.ndarray"):
        masks.from_torch_mha(key_padding_mask=torch.zeros(2, 5, dtype=torch.bool), attn_mask=np.zeros((3, 5), bool))
    m = masks.from_torch_mha(key_padding_mask=np.array([[False, True]]), attn_mask=np.array([[False, False]]))
    assert m.shape == (1, 1, 1, 2) and m.tolist() == [[[[True, False]]]]


def test_converters_refuse_non_arrays_and_masked_arrays_by_name():
    with pytest.raises(DTypeError, match=r"^mask: expected an array"):
        masks.from_blocked("yes")
    with pytest.raises(DTypeError, match=r"^attention_mask: a numpy.ma.MaskedArray is refused"):
        masks.from_hf(np.ma.masked_array(np.ones((2, 3))))
    with pytest.raises(DTypeError, match=r"^mask: dtype <U1 is not a 0/1 keep mask"):
        masks.from_keep(np.array([["a", "b"]]))
    with pytest.raises(ShapeError, match=r"^mask: nested lists of unequal lengths"):
        masks.from_keep([[1, 0], [1]])
