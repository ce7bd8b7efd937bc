"""KV-cache decoding and chunked prefill give exactly the rows of one full causal forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import attnlab
from attnlab.cost import kv_cache_bytes
from attnlab.errors import DTypeError, MaskedRowError, OptionError, RangeError, ShapeError
from attnlab.kernels.kv_cache import KVCache, cached_attention, decode_step
from tests.reference import reference_attention


def _qkv(seed, B=2, h=4, h_kv=2, n=40, d=16, d_v=12, dtype=np.float32):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, h, n, d)).astype(dtype)
    k = rng.standard_normal((B, h_kv, n, d)).astype(dtype)
    v = rng.standard_normal((B, h_kv, n, d_v)).astype(dtype)
    return q, k, v


def _full(q, k, v):
    g = q.shape[1] // k.shape[1]
    return attnlab.scaled_dot_product_attention(q, np.repeat(k, g, axis=1), np.repeat(v, g, axis=1), causal=True)


def _decode(q, k, v, chunks, capacity=4):
    cache = KVCache(q.shape[0], k.shape[1], q.shape[-1], head_dim_v=v.shape[-1], capacity=capacity, dtype=k.dtype)
    outs, s = [], 0
    for t in chunks:
        cache.append(k[:, :, s : s + t], v[:, :, s : s + t])
        outs.append(cached_attention(q[:, :, s : s + t], cache))
        s += t
    return np.concatenate(outs, axis=2), cache


def test_token_by_token_decoding_equals_full_causal_forward():
    q, k, v = _qkv(0)
    out, cache = _decode(q, k, v, [1] * 40)
    full = _full(q, k, v)
    assert out.dtype == np.float32 and out.shape == full.shape
    assert np.abs(out - full).max() <= 1e-6
    assert cache.capacity == 64 and cache.lengths.tolist() == [40, 40]  # grew 4 -> 8 -> ... -> 64
    np.testing.assert_array_equal(cache.keys, k)
    np.testing.assert_array_equal(cache.values, v)


def test_decode_step_appends_then_attends():
    q, k, v = _qkv(9, h=4, h_kv=2, n=12)
    cache = KVCache(2, 2, 16, head_dim_v=12, capacity=1)
    out = np.concatenate(
        [decode_step(cache, q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1]) for i in range(12)], 2
    )
    assert np.abs(out - _full(q, k, v)).max() <= 1e-6 and cache.lengths.tolist() == [12, 12]


def test_chunked_prefill_then_decoding_equals_full_forward():
    q, k, v = _qkv(1, h=8, h_kv=1)  # MQA
    out, _ = _decode(q, k, v, [17, 5, 1, 1, 9, 7])
    assert np.abs(out - _full(q, k, v)).max() <= 1e-6


def test_top_left_alignment_would_break_it():
    """A chunk of new queries placed top-left sees only the first keys: the rows differ from the full forward."""
    q, k, v = _qkv(2, h=2, h_kv=2)
    g = 1
    s, t = 30, 5
    new_q = q[:, :, s : s + t]
    keys, values = k[:, :, : s + t], v[:, :, : s + t]
    wrong = attnlab.scaled_dot_product_attention(new_q, keys, values, causal="top_left")
    right = attnlab.scaled_dot_product_attention(new_q, keys, values, causal="bottom_right")
    full = _full(q, k, v)[:, :, s : s + t]
    assert np.abs(right - full).max() <= 1e-6
    assert np.abs(wrong - full).max() > 0.1
    cache = KVCache(2, 2 // g, 16, head_dim_v=12)
    cache.append(keys, values)
    np.testing.assert_allclose(cached_attention(new_q, cache), right, atol=1e-6)


def test_ragged_batch_lengths_per_sequence():
    q, k, v = _qkv(3, B=3, h=4, h_kv=2, n=20)
    cache = KVCache(3, 2, 16, head_dim_v=12, capacity=2)
    lens = np.array([12, 7, 1])
    cache.append(k[:, :, :12], v[:, :, :12], lengths=lens)  # right-padded prompt batch
    assert cache.lengths.tolist() == [12, 7, 1] and cache.keys.shape == (3, 2, 12, 16)
    out = cached_attention(q[:, :, :12], cache)
    for b in range(3):
        n = lens[b]
        ref = _full(q[b : b + 1, :, :n], k[b : b + 1, :, :n], v[b : b + 1, :, :n])[0]
        assert np.abs(out[b, :, :n] - ref).max() <= 1e-6
        assert not out[b, :, n:].any()  # padding queries come out as 0
    # now one decode step each: sequence b's new token is its position lens[b]
    step_k = np.stack([k[b, :, lens[b]] for b in range(3)])[:, :, None]
    step_v = np.stack([v[b, :, lens[b]] for b in range(3)])[:, :, None]
    step_q = np.stack([q[b, :, lens[b]] for b in range(3)])[:, :, None]
    cache.append(step_k, step_v)
    out1 = cached_attention(step_q, cache)
    for b in range(3):
        n = lens[b] + 1
        ref = _full(q[b : b + 1, :, :n], k[b : b + 1, :, :n], v[b : b + 1, :, :n])[0, :, -1]
        assert np.abs(out1[b, :, 0] - ref).max() <= 1e-6


def test_tiled_path_for_long_chunks(kernel_config):
    kernel_config(dense_limit=0)
    q, k, v = _qkv(4, B=2, h=4, h_kv=2, n=50)
    out, _ = _decode(q, k, v, [20, 1, 29])
    assert np.abs(out - _full(q, k, v)).max() <= 1e-6


def test_memory_matches_the_articles_formula():
    B, h_kv, d, L = 2, 4, 32, 100
    for dtype in (np.float16, np.float32, np.float64):
        c = KVCache(B, h_kv, d, capacity=16, dtype=dtype)
        c.append(np.ones((B, h_kv, L, d)), np.ones((B, h_kv, L, d)))
        want = kv_cache_bytes(batch=B, seq_len=L, layers=1, kv_heads=h_kv, head_dim=d, dtype=dtype)
        assert c.nbytes == want == c.keys.nbytes + c.values.nbytes
        assert want == B * L * 1 * h_kv * d * 2 * np.dtype(dtype).itemsize
        assert c.allocated_nbytes == 2 * B * h_kv * 128 * d * np.dtype(dtype).itemsize  # 16 doubled to 128


def test_views_are_read_only_and_inputs_untouched():
    q, k, v = _qkv(5)
    k0, q0 = k.copy(), q.copy()
    _, cache = _decode(q, k, v, [10, 30])
    np.testing.assert_array_equal(k, k0)
    np.testing.assert_array_equal(q, q0)
    with pytest.raises(ValueError, match="read-only"):
        cache.keys[0, 0, 0, 0] = 1.0
    cache.reset()
    assert cache.lengths.tolist() == [0, 0] and cache.nbytes == 0


def test_float64_and_torch_queries():
    q, k, v = _qkv(6, dtype=np.float64)
    out, _ = _decode(q, k, v, [3] * 13 + [1])
    assert out.dtype == np.float64
    np.testing.assert_allclose(
        out, reference_attention(q, np.repeat(k, 2, 1), np.repeat(v, 2, 1), np.tri(40, dtype=bool))[0], atol=1e-12
    )
    cache = KVCache(2, 2, 16, head_dim_v=12)
    cache.append(torch.from_numpy(k.astype(np.float32)), torch.from_numpy(v.astype(np.float32)))
    r = cached_attention(torch.from_numpy(q.astype(np.float32)), cache)
    assert isinstance(r, torch.Tensor) and r.dtype == torch.float32
    assert np.abs(r.numpy() - _full(q, k, v)).max() <= 1e-6


def test_errors():
    c = KVCache(2, 2, 8)
    with pytest.raises(MaskedRowError, match="no cached key to attend to"):
        cached_attention(np.zeros((2, 4, 1, 8)), c)
    with pytest.raises(ShapeError, match=r"k_new: shape \(2, 3, 1, 8\), expected \[B=2, h_kv=2, t, d_k=8\]"):
        c.append(np.zeros((2, 3, 1, 8)), np.zeros((2, 3, 1, 8)))
    with pytest.raises(ShapeError, match="v_new: 2 new tokens"):
        c.append(np.zeros((2, 2, 1, 8)), np.zeros((2, 2, 2, 8)))
    with pytest.raises(ShapeError, match="lengths: entry 1 is 3; expected 0 <= length <= t=1"):
        c.append(np.zeros((2, 2, 1, 8)), np.zeros((2, 2, 1, 8)), lengths=[1, 3])
    with pytest.raises(attnlab.NonFiniteError, match="k_new: holds nan"):
        c.append(np.full((2, 2, 1, 8), np.nan), np.zeros((2, 2, 1, 8)))
    c.append(np.zeros((2, 2, 1, 8)), np.zeros((2, 2, 1, 8)))
    with pytest.raises(ShapeError, match=r"q: 3 heads \(dim 1\) is not a multiple of the cache's 2 kv heads"):
        cached_attention(np.zeros((2, 3, 1, 8)), c)
    with pytest.raises(ShapeError, match=r"q: shape \(1, 2, 1, 8\), expected \[B=2, h, t, d_k=8\]"):
        cached_attention(np.zeros((1, 2, 1, 8)), c)
    with pytest.raises(ShapeError, match=r"q: 2 query tokens \(dim 2\), but the last append was 1 token\(s\) wide"):
        cached_attention(np.zeros((2, 2, 2, 8)), c)
    with pytest.raises(DTypeError, match="cache: expected a KVCache"):
        cached_attention(np.zeros((2, 2, 1, 8)), object())
    with pytest.raises(OptionError, match="capacity: expected an int >= 1, got 0"):
        KVCache(1, 1, 8, capacity=0)
    with pytest.raises(DTypeError, match="dtype: expected a floating dtype"):
        KVCache(1, 1, 8, dtype=np.int32)
    assert cached_attention(np.zeros((2, 2, 1, 8)), KVCache(2, 2, 8), masked_rows="zero").shape == (2, 2, 1, 8)


@given(
    cuts=st.lists(st.integers(1, 9), min_size=1, max_size=8),
    h_kv=st.sampled_from([1, 2, 4]),
    capacity=st.integers(1, 20),
    seed=st.integers(0, 2**16),
)
def test_property_any_chunking_equals_the_full_forward(cuts, h_kv, capacity, seed):
    n = sum(cuts)
    q, k, v = _qkv(seed, B=2, h=4, h_kv=h_kv, n=n, d=8, d_v=8)
    out, cache = _decode(q, k, v, cuts, capacity=capacity)
    assert np.abs(out - _full(q, k, v)).max() <= 1e-6
    assert cache.nbytes == kv_cache_bytes(batch=2, seq_len=n, layers=1, kv_heads=h_kv, head_dim=8, dtype="float32")


def test_low_precision_storage_refuses_what_it_cannot_hold():
    """float16 would store 1e5 as inf (every later step NaN); bfloat16 has float32's range, not float64's."""
    c = KVCache(2, 1, 4, dtype=np.float16)
    k = np.ones((2, 1, 3, 4))
    k[1, 0, 2, 3] = 1e5
    with pytest.raises(RangeError, match=r"k_new: 100000 at index \(1, 0, 2, 3\) does not fit in the cache's float16"):
        c.append(k, np.ones((2, 1, 3, 4)))
    assert c.lengths.tolist() == [0, 0]  # nothing stored
    v = np.ones((2, 1, 3, 4))
    v[0, 0, 0, 0] = -7e4
    with pytest.raises(RangeError, match=r"v_new: -70000 at index \(0, 0, 0, 0\).*largest finite 65504"):
        c.append(np.ones((2, 1, 3, 4)), v)
    c.append(k, np.ones((2, 1, 3, 4)), lengths=[3, 2])  # the big value is padding: not stored, not refused
    assert c.lengths.tolist() == [3, 2] and np.isfinite(c.keys).all()
    c.append(np.full((2, 1, 1, 4), 6e4), np.full((2, 1, 1, 4), -6e4))  # within range: stored (rounded)
    out = cached_attention(np.zeros((2, 1, 1, 4), np.float32), c)
    assert np.isfinite(out).all()
    bf = KVCache(1, 1, 2, dtype="bfloat16")
    assert bf.dtype.name == "bfloat16" and bf.allocated_nbytes == 2 * 256 * 2 * 2
    with pytest.raises(RangeError, match=r"k_new: 1e\+39 at index \(0, 0, 0, 1\) does not fit in the cache's bfloat16"):
        bf.append(np.array([[[[1.0, 1e39]]]]), np.ones((1, 1, 1, 2)))
    bf.append(np.array([[[[1.0, 1e38]]]]), np.ones((1, 1, 1, 2)))
    assert float(bf.keys[0, 0, 0, 1]) == pytest.approx(1e38, rel=1e-2)
    assert KVCache(1, 1, 2, dtype=torch.bfloat16).dtype == bf.dtype
    f32 = KVCache(1, 1, 2)
    with pytest.raises(RangeError, match=r"k_new: 1e\+40 .* float32"):
        f32.append(np.full((1, 1, 1, 2), 1e40), np.ones((1, 1, 1, 2)))


def test_padding_rule_lengths_zero_and_short_appends():
    """The documented rule: query rows i >= t_b of a sequence that appended t_b tokens are padding (output 0);
    lengths=[0] appends nothing and its queries are all padding; a query block as wide as the append, longer than
    every sequence's real tokens, is accepted."""
    q, k, v = _qkv(30, B=2, h=2, h_kv=1, n=12, d=8, d_v=8, dtype=np.float64)
    c = KVCache(2, 1, 8, head_dim_v=8, dtype=np.float64)
    c.append(k[:, :, :5], v[:, :, :5])
    out = cached_attention(q[:, :, 5:6], KVCache(2, 1, 8, head_dim_v=8), masked_rows="zero")
    assert not out.any()  # nothing ever appended: real queries with nothing to see, masked_rows decides
    c.append(k[:, :, 5:6], v[:, :, 5:6], lengths=[0, 1])
    assert c.lengths.tolist() == [5, 6]
    out = cached_attention(q[:, :, 5:6], c)  # raise is the default: sequence 0 is padding, not an empty row
    assert np.array_equal(out[0], np.zeros((2, 1, 8))) and not np.signbit(out[0]).any()
    full = _full(q[:, :, :6], k[:, :, :6], v[:, :, :6])
    np.testing.assert_allclose(out[1], full[1, :, 5:6], atol=1e-12)
    c.append(k[:, :, 6:10], v[:, :, 6:10], lengths=[2, 3])  # a block 4 wide, no sequence uses all of it
    out = cached_attention(q[:, :, 6:10], c)
    assert not out[0, :, 2:].any() and not out[1, :, 3:].any()
    kk0 = np.concatenate([k[0, :, :5], k[0, :, 6:8]], axis=1)[None]
    vv0 = np.concatenate([v[0, :, :5], v[0, :, 6:8]], axis=1)[None]
    q0 = np.concatenate([q[0, :, :5], q[0, :, 6:8]], axis=1)[None]
    np.testing.assert_allclose(out[0, :, :2], _full(q0, kk0, vv0)[0, :, 5:], atol=1e-12)
    np.testing.assert_allclose(out[1, :, :3], _full(q[1:], k[1:], v[1:])[0, :, 6:9], atol=1e-12)
    with pytest.raises(ShapeError, match=r"q: 5 query tokens \(dim 2\), but the last append was 4 token\(s\) wide"):
        cached_attention(q[:, :, 6:11], c)
    c.reset()
    with pytest.raises(MaskedRowError, match="no cached key to attend to"):
        cached_attention(q[:, :, :1], c)


@pytest.mark.parametrize("dense", [True, False])
def test_overflowing_logits_are_a_named_error(dense, kernel_config):
    if not dense:
        kernel_config(dense_limit=0)
    c = KVCache(1, 1, 4)
    c.append(np.full((1, 1, 3, 4), 1e20), np.ones((1, 1, 3, 4)))
    big = np.full((1, 1, 1, 4), 1e20, np.float32)
    with pytest.raises(RangeError, match=r"logits: \(scale · Q Kᵀ \+ bias\) / temperature overflow float32"):
        cached_attention(big, c)
    small = np.ones((1, 1, 1, 4), np.float32)
    with pytest.raises(RangeError, match=r"1e\+39 .*overflows? float32"):
        cached_attention(small, c, scale=1e39)
    c64 = KVCache(1, 1, 4, dtype=np.float64)
    c64.append(np.ones((1, 1, 2, 4)), np.ones((1, 1, 2, 4)))
    with pytest.raises(RangeError, match="overflow float64"):
        cached_attention(np.ones((1, 1, 1, 4)), c64, scale=1e308)


def test_impossible_capacity_is_a_named_error():
    with pytest.raises(OptionError, match=r"capacity: room for 4611686018427387904 tokens needs .* GiB"):
        KVCache(1, 1, 8, capacity=2**62)


def test_results_come_back_in_the_queries_dtype():
    c = KVCache(1, 1, 4)
    c.append(np.ones((1, 1, 2, 4)), np.full((1, 1, 2, 4), 1e5))
    with pytest.raises(RangeError, match=r"output: 100000 at index \(0, 0, 0, 0\) does not fit in float16"):
        cached_attention(np.ones((1, 1, 1, 4), np.float16), c)
    r = cached_attention(torch.ones((1, 1, 1, 4), dtype=torch.bfloat16), c)
    assert r.dtype == torch.bfloat16 and torch.allclose(r.float(), torch.full((1, 1, 1, 4), 1e5), rtol=1e-2)
    assert cached_attention(np.ones((1, 1, 1, 4), np.int32), c).dtype == np.float64
