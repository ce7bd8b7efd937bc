"""KV-cache decoding and chunked prefill give exactly the rows of one full causal forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import attnlab
from attnlab.cost import kv_cache_bytes
from attnlab.errors import DTypeError, MaskedRowError, ShapeError
from attnlab.kernels import kv_cache as kvmod
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


def test_tiled_path_for_long_chunks(monkeypatch):
    monkeypatch.setattr(kvmod, "_DENSE_LIMIT", 0)
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
    with pytest.raises(ShapeError, match=r"q: 2 query tokens \(dim 2\), but the last append added at most 1 token"):
        cached_attention(np.zeros((2, 2, 2, 8)), c)
    with pytest.raises(DTypeError, match="cache: expected a KVCache"):
        cached_attention(np.zeros((2, 2, 1, 8)), object())
    with pytest.raises(ShapeError, match="capacity: expected a positive int, got 0"):
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
