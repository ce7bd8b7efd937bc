"""Property tests of the core against the independent float64 reference in ``reference.py``."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from reference import reference_attention

import attnlab
from attnlab import masks


@st.composite
def problems(draw, with_mask=True, with_bias=True):
    """Random shapes (n_q != n_k, d_v != d_k, broadcast leading dims), inputs, masks with >= 1 key per row, bias."""
    n_q = draw(st.integers(1, 7))
    n_k = draw(st.integers(1, 7))
    d_k = draw(st.integers(1, 5))
    d_v = draw(st.integers(1, 5))
    batch = draw(st.sampled_from([(), (2,), (2, 3)]))

    # leading dims of each of q, k, v: either the full batch or broadcast 1s
    def lead():
        return tuple(draw(st.sampled_from([b, 1])) for b in batch)

    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(*batch, n_q, d_k))
    k = rng.normal(size=(*lead(), n_k, d_k))
    v = rng.normal(size=(*lead(), n_k, d_v))
    mask = None
    if with_mask and draw(st.booleans()):
        mask = rng.random((*lead(), n_q, n_k)) < 0.6
        mask[..., rng.integers(n_k)] = True  # every row keeps at least one key
    bias = rng.normal(size=(n_q, n_k)) if with_bias and draw(st.booleans()) else None
    return q, k, v, mask, bias


@given(problems(), st.floats(0.25, 4.0))
def test_equals_reference(p, temperature):
    q, k, v, mask, bias = p
    t = attnlab.attention_trace(q, k, v, mask, bias=bias, temperature=temperature)
    out, w = reference_attention(q, k, v, mask, bias, temperature=temperature)
    np.testing.assert_allclose(t.output, out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(t.weights, w, rtol=1e-10, atol=1e-12)
    assert attnlab.invariants.check(t) == []


@given(problems())
def test_rows_sum_to_one_and_masked_weights_are_exactly_zero(p):
    q, k, v, mask, bias = p
    t = attnlab.attention_trace(q, k, v, mask, bias=bias)
    np.testing.assert_allclose(t.weights.sum(-1), 1.0, rtol=0, atol=1e-12)
    assert np.all(t.weights[~t.allowed] == 0.0)
    assert np.all(np.isneginf(t.logits[~t.allowed]))
    # absolute floor: an lse near 0 (logits near 0 over few keys) has no meaningful relative error
    np.testing.assert_allclose(t.lse, np.log(np.sum(np.exp(t.logits), axis=-1)), rtol=1e-12, atol=1e-14)


@given(problems(), st.floats(-50, 50))
def test_shifting_a_row_of_scores_changes_nothing(p, shift):
    q, k, v, mask, bias = p
    n_q, n_k = q.shape[-2], k.shape[-2]
    row_shift = np.zeros((n_q, n_k))
    row_shift[0] = shift  # one constant per row: add it to row 0 only
    base = attnlab.attention_trace(q, k, v, mask, bias=bias)
    moved = attnlab.attention_trace(q, k, v, mask, bias=row_shift if bias is None else bias + row_shift)
    np.testing.assert_allclose(moved.weights, base.weights, rtol=1e-9, atol=1e-12)


@given(problems(with_bias=False), st.randoms(use_true_random=False))
def test_permuting_keys_with_values_changes_nothing(p, random):
    q, k, v, mask, _ = p
    perm = np.array(random.sample(range(k.shape[-2]), k.shape[-2]))
    base = attnlab.scaled_dot_product_attention(q, k, v, mask)
    pm = None if mask is None else mask[..., perm]
    moved = attnlab.scaled_dot_product_attention(q, k[..., perm, :], v[..., perm, :], pm)
    np.testing.assert_allclose(moved, base, rtol=1e-10, atol=1e-12)


@given(problems(with_bias=False), st.randoms(use_true_random=False))
def test_permuting_queries_permutes_outputs(p, random):
    q, k, v, mask, _ = p
    perm = np.array(random.sample(range(q.shape[-2]), q.shape[-2]))
    base = attnlab.scaled_dot_product_attention(q, k, v, mask)
    pm = None if mask is None else mask[..., perm, :]
    moved = attnlab.scaled_dot_product_attention(q[..., perm, :], k, v, pm)
    np.testing.assert_allclose(moved, base[..., perm, :], rtol=1e-10, atol=1e-12)


@given(st.integers(2, 9), st.integers(1, 4), st.integers(0, 2**32 - 1), st.data())
def test_future_tokens_cannot_change_past_outputs(n, d, seed, data):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(2, n, d)) for _ in range(3))
    t = data.draw(st.integers(0, n - 2), label="last position kept")
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    for x in (q2, k2, v2):
        x[:, t + 1 :] = rng.normal(size=x[:, t + 1 :].shape) * 100
    a = attnlab.scaled_dot_product_attention(q, k, v, causal=True)
    b = attnlab.scaled_dot_product_attention(q2, k2, v2, causal=True)
    np.testing.assert_array_equal(a[:, : t + 1], b[:, : t + 1])


@given(st.integers(1, 6), st.integers(1, 6), st.sampled_from(["top_left", "bottom_right"]))
def test_causal_alignments_match_the_mask_constructor(n_q, n_k, align):
    rng = np.random.default_rng(n_q * 7 + n_k)
    q, k, v = rng.normal(size=(n_q, 3)), rng.normal(size=(n_k, 3)), rng.normal(size=(n_k, 2))
    m = masks.causal(n_q, n_k, align=align)
    policy = "zero"
    a = attnlab.attention_trace(q, k, v, causal=align, masked_rows=policy)
    b = attnlab.attention_trace(q, k, v, m, masked_rows=policy)
    np.testing.assert_array_equal(a.allowed, b.allowed)
    np.testing.assert_array_equal(a.output, b.output)
