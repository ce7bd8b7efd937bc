"""Robustness of the kernels on generated inputs, extreme magnitudes included.

Every call either raises a named :class:`~attnlab.errors.AttnlabError` or returns a finite result that matches a
float64 reference within float32's (or float64's) own error bound; inputs are never modified; no internal exception
and no RuntimeWarning escapes (pytest turns those into errors); memory stays bounded whatever the block sizes.
"""

from __future__ import annotations

import os
import tracemalloc

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.errors import AttnlabError, RangeError
from attnlab.kernels import KVCache, cached_attention, decode_step, flash_attention, flash_attention_backward

#: A few seconds in the suite; ``ATTNLAB_ROBUST_EXAMPLES=500`` for a longer search by hand.
SETTINGS = settings(max_examples=int(os.environ.get("ATTNLAB_ROBUST_EXAMPLES", "25")), deadline=None)


def _ref64(q, k, v, allowed=None, bias=None, scale=None, temperature=1.0):
    """Float64 attention (rows with no allowed key: 0) and its logits' largest magnitude; vectorised, own code."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    with np.errstate(all="ignore"):
        s = (q @ np.swapaxes(k, -1, -2)) * scale
        if bias is not None:
            s = s + np.asarray(bias, np.float64)
        s = s / temperature
        allowed = np.ones(s.shape, bool) if allowed is None else np.broadcast_to(allowed, s.shape)
        finite = bool(np.isfinite(s[allowed]).all())
        s = np.where(allowed, s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isfinite(m), m, 0))
        w = e / np.where(e.sum(-1, keepdims=True) > 0, e.sum(-1, keepdims=True), 1)
        return w @ v, np.abs(np.where(np.isfinite(s), s, 0)).max(initial=0.0), finite


def _bound(q, k, v, bias, scale, temperature, dt, out_dt):
    """What float32/float64 arithmetic can promise for the output: the logits carry an absolute error of about
    ``(d + 2) · eps · (d · max|q| · max|k| · |scale| + max|bias|) / T``, which moves the weights by that relative
    amount (the output by that times max |v|, at most 2 max |v|), plus the output's own rounding."""
    eps, eps_out = float(np.finfo(dt).eps), float(np.finfo(out_dt).eps)
    d = q.shape[-1]
    big = d * float(np.abs(q).max()) * float(np.abs(k).max()) * abs(scale)
    if bias is not None:
        big += float(np.abs(bias).max())
    vmax = float(np.abs(v).max())
    return vmax * min(2.0, 4 * (d + 2) * eps * (1 + big / temperature)) + 4 * eps_out * vmax + 1e-300


def _array(data, shape, dt, log_mag):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    return (rng.standard_normal(shape) * 10.0**log_mag).astype(dt)


MAGS = {np.float16: (-3.0, 4.0), np.float32: (-30.0, 36.0), np.float64: (-150.0, 150.0)}


@SETTINGS
@given(data=st.data())
def test_flash_forward_and_backward_on_anything(data):
    dt = data.draw(st.sampled_from([np.float16, np.float32, np.float64]), label="dtype")
    lo, hi = MAGS[dt]
    n_q, n_k, d, d_v = (data.draw(st.integers(1, n), label=name) for name, n in zip("qkdv", (9, 9, 6, 4), strict=True))
    mags = [data.draw(st.floats(lo, hi), label=f"log10 |{x}|") for x in "qkv"]
    q, k = _array(data, (2, n_q, d), dt, mags[0]), _array(data, (2, n_k, d), dt, mags[1])
    v = _array(data, (2, n_k, d_v), dt, mags[2])
    causal = data.draw(st.sampled_from([False, "top_left", "bottom_right"]), label="causal")
    keep = data.draw(st.sampled_from([None, 0.7, 0.2]), label="mask density")
    mask = None if keep is None else np.random.default_rng(n_q * n_k).random((2, n_q, n_k)) < keep
    bias = None
    if data.draw(st.booleans(), label="bias"):
        bias = _array(data, (n_q, n_k), np.float32 if dt == np.float16 else dt, data.draw(st.floats(lo, hi)))
    scale = data.draw(st.sampled_from([None, 10.0 ** data.draw(st.floats(-30, 30)), -0.5]), label="scale")
    temperature = 10.0 ** data.draw(st.floats(-40, 40), label="log10 temperature")
    blocks = {
        "block_q": data.draw(st.sampled_from([1, 2, 3, 7, 512, 10**9])),
        "block_k": data.draw(st.sampled_from([1, 2, 5, 8, 512, 10**9])),
    }
    kw = dict(causal=causal, mask=mask, bias=bias, scale=scale, temperature=temperature, masked_rows="zero")
    copies = [None if x is None else x.copy() for x in (q, k, v, mask, bias)]
    threads = data.draw(st.sampled_from([1, 2, 5]))
    for measure in (False, True):  # the first call may compile the fused passes for these arguments: not measured
        if measure:
            tracemalloc.start()
        try:
            r = flash_attention(q, k, v, **kw, **blocks, num_threads=threads)
        except AttnlabError:
            r = None
        finally:
            if measure:
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
    assert peak < 2**22  # tiny inputs: a few tiles, whatever block sizes were asked for
    for x, c in zip((q, k, v, mask, bias), copies, strict=True):
        assert x is None or np.array_equal(x, c)  # never written
    cdt = np.float64 if dt == np.float64 else np.float32
    allowed = np.ones((2, n_q, n_k), bool) if mask is None else mask.copy()
    if causal:
        shift = n_k - n_q if causal == "bottom_right" else 0
        allowed &= np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + shift
    sc = 1 / np.sqrt(d) if scale is None else scale
    ref, _, finite = _ref64(q, k, v, allowed, bias, sc, temperature)
    if r is None:
        return  # a named error: allowed (for example a RangeError when the logits overflow the compute dtype)
    assert r.output.dtype == dt and np.isfinite(r.output).all()
    assert finite, "a result although the logits overflow even in float64"
    tol = _bound(q.astype(cdt), k.astype(cdt), v.astype(cdt), bias, sc, temperature, cdt, dt)
    assert np.abs(r.output.astype(np.float64) - ref).max() <= tol
    d_o = np.ones_like(r.output)
    try:
        g = flash_attention_backward(r, d_o)
    except AttnlabError:
        return
    for name, x in zip(("dq", "dk", "dv", "dbias"), (g.dq, g.dk, g.dv, g.dbias), strict=True):
        assert x is None or np.isfinite(x).all(), name
    # each real row's weights sum to 1, so dV (d_out = 1) sums to (real rows) · d_v; the weights are recomputed from
    # lse, whose rounding (|lse| · eps in the compute dtype) is a relative error of the weights
    rows = np.count_nonzero(allowed.any(-1))
    lse_max = float(np.abs(np.where(np.isfinite(r.lse), r.lse, 0)).max())
    tol = rows * d_v * (8 * float(np.finfo(dt).eps) + 4 * float(np.finfo(cdt).eps) * (n_k + lse_max))
    assert g.dv.shape == v.shape and abs(float(g.dv.astype(np.float64).sum()) - rows * d_v) <= tol


@SETTINGS
@given(data=st.data())
def test_cache_append_and_decode_on_anything(data):
    dt = data.draw(st.sampled_from(["float16", "bfloat16", "float32", "float64"]), label="storage")
    B, h_kv, g, d = 2, data.draw(st.sampled_from([1, 2])), data.draw(st.sampled_from([1, 2])), 4
    cache = KVCache(B, h_kv, d, capacity=data.draw(st.integers(1, 4)), dtype=dt)
    stored_k = [[] for _ in range(B)]
    stored_v = [[] for _ in range(B)]
    q_dt = np.float64 if dt == "float64" else np.float32
    for _ in range(data.draw(st.integers(1, 3), label="steps")):
        t = data.draw(st.integers(1, 4), label="t")
        k_new = _array(data, (B, h_kv, t, d), np.float64, data.draw(st.floats(-3, 40), label="log10 |k|"))
        v_new = _array(data, (B, h_kv, t, d), np.float64, data.draw(st.floats(-3, 40), label="log10 |v|"))
        q = _array(data, (B, h_kv * g, t, d), q_dt, data.draw(st.floats(-3, 3), label="log10 |q|"))
        lengths = np.array([data.draw(st.integers(0, t)) for _ in range(B)])
        before = cache.lengths
        copies = (k_new.copy(), v_new.copy(), q.copy())
        try:
            out = decode_step(cache, q, k_new, v_new, lengths=lengths)
        except RangeError:
            if (cache.lengths == before).all():
                continue  # refused on append: nothing stored
            out = None  # stored, then the logits overflowed: a named error from cached_attention
        except AttnlabError:
            assert (cache.lengths == before + lengths).all()  # stored; attention refused (an empty row, say)
            out = None
        for x, c in zip((k_new, v_new, q), copies, strict=True):
            assert np.array_equal(x, c)
        assert (cache.lengths == before + lengths).all()
        for b in range(B):
            stored_k[b].append(k_new[b, :, : lengths[b]])
            stored_v[b].append(v_new[b, :, : lengths[b]])
        keys = cache.keys.astype(np.float64)
        for b in range(B):
            kb = np.concatenate(stored_k[b], axis=1)
            assert np.array_equal(keys[b, :, : kb.shape[1]], kb.astype(cache.dtype).astype(np.float64))
        if out is None:
            continue
        assert out.shape == (B, h_kv * g, t, d) and np.isfinite(out).all()
        for b in range(B):
            n_b, real = int(cache.lengths[b]), int(lengths[b])
            assert not out[b, :, real:].any()  # padding queries: exactly 0
            if real == 0:
                continue
            kb = np.repeat(keys[b, :, :n_b], g, axis=0)
            vb = np.repeat(cache.values.astype(np.float64)[b, :, :n_b], g, axis=0)
            allowed = np.arange(n_b)[None, :] <= np.arange(real)[:, None] + n_b - real
            ref, _, _ = _ref64(q[b, :, :real], kb, vb, allowed)
            tol = _bound(q[b, :, :real].astype(np.float32), kb, vb, None, 1 / np.sqrt(d), 1.0, np.float32, q_dt)
            assert np.abs(out[b, :, :real] - ref).max() <= tol


@SETTINGS
@given(n=st.integers(1, 40), block_q=st.integers(1, 50), block_k=st.integers(1, 50), log_mag=st.floats(-20, 20))
def test_cached_attention_equals_one_full_forward_at_any_magnitude(n, block_q, block_k, log_mag):
    """Decoding token by token equals the tiled forward (itself checked against float64 above) at any magnitude,
    or both refuse with the same kind of named error."""
    rng = np.random.default_rng(n)
    q, k, v = (rng.standard_normal((1, 2, n, 4)) * 10.0**log_mag for _ in range(3))
    cache = KVCache(1, 2, 4, dtype=np.float64)
    try:
        steps = np.concatenate([decode_step(cache, q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1])
                                for i in range(n)], axis=2)  # fmt: skip
    except RangeError:
        steps = None
    try:
        full = flash_attention(q, k, v, causal=True, block_q=block_q, block_k=block_k).output
    except RangeError:
        full = None
    assert (steps is None) == (full is None)
    if full is not None:
        np.testing.assert_allclose(steps, full, rtol=1e-9, atol=1e-300 + 1e-9 * np.abs(v).max())


@SETTINGS
@given(
    n=st.integers(1, 120),
    dt=st.sampled_from(["float32", "float64"]),
    sign=st.sampled_from([1.0, -1.0]),
    tiled=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_cached_attention_at_the_largest_value_with_tied_keys_stays_finite(n, dt, sign, tiled, seed):
    """Values at the dtype's largest magnitude and keys that tie (equal weights 1/n, whose rounded sum passes 1):
    each output is an average of the values, so it stays within them; the dense path returned inf."""
    from attnlab.kernels.config import override

    big = sign * float(np.finfo(dt).max)
    rng = np.random.default_rng(seed)
    v = np.full((1, 1, n, 2), big, dtype=dt)
    v[..., 1] = rng.choice([big, big / 2], size=n)  # some ties, some not
    cache = KVCache(1, 1, 2, dtype=dt)
    cache.append(np.zeros((1, 1, n, 2), dtype=dt), v)
    with override(dense_limit=0 if tiled else 1 << 22):
        out = cached_attention(np.zeros((1, 1, 1, 2), dtype=dt), cache)
    assert np.isfinite(out).all()
    if not tiled:  # the dense path's convex combination is clipped to the values' range
        assert (v.min(axis=2) <= out[:, :, 0]).all() and (out[:, :, 0] <= v.max(axis=2)).all()
    mean = (v[0, 0].astype(np.float64) / n).sum(axis=0, dtype=np.longdouble)  # x86-64: a wider exponent
    np.testing.assert_allclose(out[0, 0, 0].astype(np.longdouble), mean, rtol=1e-5)
