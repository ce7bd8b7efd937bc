"""The §21 invariants: kept by attnlab, and each one caught when an implementation breaks it."""

import numpy as np

import attnlab
from attnlab.invariants import check, check_arrays

rng = np.random.default_rng(3)
q, k, v = rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 5, 2))
allowed = np.broadcast_to(attnlab.masks.causal(4, 5, align="bottom_right"), (2, 4, 5))
good = attnlab.attention_trace(q, k, v, allowed)


def names(violations):
    return [x.name for x in violations]


def test_attnlab_keeps_every_invariant():
    assert check(good) == []
    assert check_arrays(q, k, v, good.weights, good.output, allowed) == []


def test_masked_weight_not_zero():
    w = good.weights.copy()
    w[1, 0, 4] = 1e-9
    found = check_arrays(q, k, v, w, w @ v, allowed)
    assert "masked-weight" in names(found)
    leak = next(x for x in found if x.name == "masked-weight")
    assert leak.positions == ((1, 0, 4),)


def test_softmax_then_mask_breaks_row_sums():
    from attnlab import softmax

    w = softmax(q @ k.swapaxes(-1, -2) / np.sqrt(3)) * allowed  # mask after softmax, no renormalisation
    found = check_arrays(q, k, v, w, w @ v, allowed)
    assert names(found) == ["row-sum"]
    assert found[0].positions[0] == (0, 0)


def test_output_is_not_av():
    out = good.output.copy()
    out[0, 2, 1] += 0.01
    found = check_arrays(q, k, v, good.weights, out, allowed)
    assert names(found) == ["output-av"] and found[0].positions == ((0, 2, 1),)


def test_shape_invariants():
    found = check_arrays(q, rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 6, 2)), good.weights, good.output)
    assert names(found)[:2] == ["d_k-match", "n_k-match"]
    found = check_arrays(q, k, v, good.weights.swapaxes(-1, -2), good.output)
    assert "scores-shape" in names(found)


def test_fully_masked_rows_are_exempt_from_row_sum():
    m = np.ones((2, 4, 5), bool)
    m[0, 1] = False
    t = attnlab.attention_trace(q, k, v, m, masked_rows="zero")
    assert check(t) == []


def test_wrong_types_are_named_errors():
    import pytest

    from attnlab.errors import DTypeError, NonFiniteError, ShapeError

    with pytest.raises(DTypeError) as err:
        check(None)
    assert str(err.value) == (
        "trace: expected an AttentionTrace (from attnlab.attention_trace), got NoneType; for the arrays of another "
        "implementation use invariants.check_arrays(q, k, v, weights, output, allowed)"
    )
    with pytest.raises(DTypeError, match=r"^weights: expected an array, got None$"):
        check_arrays(q, k, v, None, good.output)
    with pytest.raises(DTypeError, match=r"^output: dtype <U1 is not supported"):
        check_arrays(q, k, v, good.weights, np.array([["a"]]))
    with pytest.raises(ShapeError, match=r"^v: expected at least 2 dims \[..., rows, cols\], got shape \(5,\)$"):
        check_arrays(q, k, np.ones(5), good.weights, good.output)
    with pytest.raises(NonFiniteError, match=r"^q: holds inf at index \(0, 0, 0\)"):
        check_arrays(np.where(q == q[0, 0, 0], np.inf, q), k, v, good.weights, good.output)
    with pytest.raises(DTypeError, match=r"^allowed: dtype float64; expected a bool mask"):
        check_arrays(q, k, v, good.weights, good.output, allowed.astype(float))
    with pytest.raises(ShapeError, match=r"^allowed: shape \(3, 3\) does not broadcast to the weights' shape"):
        check_arrays(q, k, v, good.weights, good.output, np.ones((3, 3), bool))
    with pytest.raises(DTypeError, match=r"^q: a numpy.ma.MaskedArray is refused"):
        check_arrays(np.ma.masked_array(q), k, v, good.weights, good.output)


def test_nan_weights_are_violations_not_crashes():
    w = good.weights.copy()
    w[0, 1, 0] = np.nan
    found = check_arrays(q, k, v, w, w @ v, allowed)
    assert {"row-sum", "output-av"} <= set(names(found))


def test_bfloat16_outputs_get_a_bfloat16_tolerance():
    import torch

    x = torch.tensor(np.random.default_rng(0).normal(size=(2, 5, 3)), dtype=torch.bfloat16)
    t = attnlab.attention_trace(x, x, x)
    assert t.output.dtype == torch.bfloat16
    assert check(t) == []
