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
    with pytest.raises(ShapeError, match="n_q: expected an int >= 1, got 0"):
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


# --------------------------------------------------------------------------------------------------------------
# MaskSpec: the structured mask every variant reads

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import attnlab  # noqa: E402
from attnlab.masks import MaskSpec  # noqa: E402


def _reference(n_q, n_k, causal, window, key_lengths, segments, B):
    """The same mask from the dense constructors, ``[B, n_q, n_k]``."""
    ok = np.ones((B, n_q, n_k), bool)
    if causal:
        ok &= masks.causal(n_q, n_k, align=causal)
    if window is not None:
        ok &= masks.window(n_q, n_k, left=window[0], right=window[1], align=causal or "top_left")
    if key_lengths is not None:
        ok &= masks.key_padding(key_lengths, n_k, ndim=3)
    if segments is not None:
        ok &= masks.segments(segments[0], segments[1])
    return ok


@given(
    n_q=st.integers(1, 12),
    n_k=st.integers(1, 12),
    causal=st.sampled_from([False, "top_left", "bottom_right"]),
    window=st.sampled_from([None, (0, 0), (2, 0), (None, 1), (1, None)]),
    lengths=st.booleans(),
    seg=st.booleans(),
    data=st.data(),
)
def test_maskspec_equals_the_dense_constructors(n_q, n_k, causal, window, lengths, seg, data):
    """Every operation of a MaskSpec (the array, a block, the key and query ranges, empty rows) agrees with the mask
    built from masks.causal / window / key_padding / segments."""
    B = 2
    kl = data.draw(st.lists(st.integers(0, n_k), min_size=B, max_size=B)) if lengths else None
    segs = None
    if seg:
        segs = (np.sort(data.draw(st.lists(st.integers(0, 2), min_size=n_q, max_size=n_q))), None)
        segs = (
            np.array(segs[0]),
            np.sort(np.array(data.draw(st.lists(st.integers(0, 2), min_size=n_k, max_size=n_k)))),
        )
    if window is not None and not causal and n_q != n_k:
        with pytest.raises(MaskError, match=r"(?s)window: n_q=.*pass q_offset="):
            MaskSpec(window=window).sized(n_q, n_k)
        return
    spec = MaskSpec(causal=causal, window=window, key_lengths=kl, segments=segs).sized(n_q, n_k, B)
    want = _reference(n_q, n_k, causal, window, kl, segs, B)
    np.testing.assert_array_equal(spec.to_array((B, n_q, n_k)), want)
    np.testing.assert_array_equal(spec.empty_rows() if spec.empty_rows().shape[0] == B else
                                  np.broadcast_to(spec.empty_rows(), (B, n_q)), ~want.any(-1))  # fmt: skip
    i0, i1 = data.draw(st.integers(0, n_q - 1)), n_q
    j0 = data.draw(st.integers(0, n_k - 1))
    j1 = data.draw(st.integers(j0 + 1, n_k))
    blk = spec.block(i0, i1, j0, j1)
    part = want[:, i0:i1, j0:j1]
    if blk is None:
        assert part.all()
    elif blk is False:
        assert not part.any()
    else:
        np.testing.assert_array_equal(np.broadcast_to(blk, part.shape), part)
    for b in range(B):
        lo, hi = spec.key_range(i0, i1, b)
        seen = np.flatnonzero(want[b, i0:i1].any(0))
        assert seen.size == 0 or (lo <= seen.min() and seen.max() < hi)
        qlo, qhi = spec.query_range(j0, j1, b)
        rows = np.flatnonzero(want[b, :, j0:j1].any(1))
        assert rows.size == 0 or (qlo <= rows.min() and rows.max() < qhi)
        one = spec.sequence(b).sized(n_q, n_k)
        np.testing.assert_array_equal(one.to_array((n_q, n_k)), want[b])


def test_maskspec_offsets_per_sequence_and_drawing():
    """q_offset per sequence (a KV cache's sequences at different positions): query i of sequence b sits at key
    position q_offset[b] + i."""
    spec = MaskSpec(causal=True, q_offset=[2, 0], key_lengths=[4, 2]).sized(2, 4, 2)
    assert spec.to_string(0) == "■ ■ ■ ⬚\n■ ■ ■ ■"
    assert spec.to_string(1) == "■ ⬚ ⬚ ⬚\n■ ■ ⬚ ⬚"
    assert spec.shift(0) == 2 and spec.n_keys(1) == 2 and spec.align is None
    assert MaskSpec(causal="bottom_right").sized(2, 4).align == "bottom_right"


def test_maskspec_errors_name_the_part():
    with pytest.raises(MaskError, match=r"causal: expected False, True, 'top_left' or 'bottom_right', got 'left'"):
        MaskSpec(causal="left")
    with pytest.raises(MaskError, match=r"(?s)causal=True: n_q=2 != n_k=3.*pass causal='top_left'"):
        MaskSpec(causal=True).sized(2, 3)
    with pytest.raises(MaskError, match="window right: expected None or an int >= 0, got -1"):
        MaskSpec(window=(1, -1))
    with pytest.raises(MaskError, match=r"q_offset=1 already places the queries.*not causal='bottom_right'"):
        MaskSpec(causal="bottom_right", q_offset=1)
    with pytest.raises(ShapeError, match=r"key_lengths: 3 entries, expected one per sequence \(B=2"):
        MaskSpec(key_lengths=[1, 2, 3]).sized(4, 4, 2)
    with pytest.raises(ShapeError, match="key_lengths: entry 0 is -1; expected 0 <= length <= n_k=4"):
        MaskSpec(key_lengths=[-1]).sized(4, 4)
    with pytest.raises(ShapeError, match="segments: k_segments has 3 ids, expected 4"):
        MaskSpec(segments=(np.zeros(4, int), np.zeros(3, int))).sized(4, 4)
    with pytest.raises(MaskError, match=r"sizes unknown; call spec.sized\(n_q, n_k\) first"):
        MaskSpec(causal=True).key_range(0, 1)
    with pytest.raises(MaskError, match=r"mask: a MaskSpec already says.*pass causal in it"):
        attnlab.scaled_dot_product_attention(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)),
                                             mask=MaskSpec(window=1), causal=True)  # fmt: skip


def test_every_variant_takes_a_maskspec():
    """The core and the tiled kernel read the same MaskSpec as their keywords build (and as the dense mask)."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 2, 9, 4)) for _ in range(3))
    spec = MaskSpec(causal="top_left", window=(3, 0), key_lengths=[9, 6], segments=np.array([0] * 5 + [1] * 4))
    dense = spec.sized(9, 9, 2).to_array((2, 2, 9, 9))
    want = attnlab.scaled_dot_product_attention(q, k, v, mask=dense)
    np.testing.assert_allclose(attnlab.scaled_dot_product_attention(q, k, v, mask=spec), want, atol=1e-12)
    r = attnlab.flash_attention(q, k, v, mask=spec, block_q=4, block_k=3)
    np.testing.assert_allclose(r.output, want, atol=1e-12)
    kw = attnlab.flash_attention(
        q, k, v, causal="top_left", window=3, key_lengths=[9, 6], segments=np.array([0] * 5 + [1] * 4)
    )
    np.testing.assert_allclose(kw.output, want, atol=1e-12)


def test_docs_kernels_examples_run():
    """docs/kernels.md shows real output: its examples are doctests."""
    import doctest
    from pathlib import Path

    doc = Path(__file__).resolve().parents[1] / "docs" / "kernels.md"
    result = doctest.testfile(str(doc), module_relative=False, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted >= 5
