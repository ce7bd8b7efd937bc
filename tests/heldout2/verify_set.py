"""Self-check of the second held-out set, against an independent float64 NumPy reference (not the checker).

Every correct case must equal ``softmax(Q Kᵀ · scale + mask) V`` on random inputs with masks, n_q != n_k, B > 1,
h > 1 (and GQA, causal, its own mask interface where it has one); every buggy case must differ from it in the way
its ``source`` claims (and, where possible, equal the reference recomputed under the planted bug).
``verify_all()`` runs one check per case name and raises AssertionError on the first false claim.
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch

from . import all_cases
from . import impls as m

RNG_SEED = 1234
F32_MIN = float(np.finfo(np.float32).min)


# ---------------------------------------------------------------------------------------------------------------
# the reference


def ref(q, k, v, allow=None, scale=None, empty="zeros", gqa=None):
    """softmax(q kᵀ · scale where allow) v in float64, [..., h, n, d]; empty rows: zeros, uniform or nan.
    gqa: None, "interleave" (head i reads i // g) or "tile" (i % h_kv)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if gqa is not None and k.shape[-3] != q.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        if gqa == "interleave":
            k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
        else:
            k, v = np.tile(k, (1, g, 1, 1)), np.tile(v, (1, g, 1, 1))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if allow is None:
        allow = np.ones(s.shape, dtype=bool)
    allow = np.broadcast_to(allow, s.shape)
    s = np.where(allow, s, -np.inf)
    has = allow.any(axis=-1, keepdims=True)
    s = np.where(has, s, 0.0)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    w = w / w.sum(axis=-1, keepdims=True)
    if empty == "zeros":
        w = w * has
    elif empty == "nan":
        w = np.where(has, w, np.nan)
    return w @ v


def causal(n_q, n_k, align="top_left"):
    off = 0 if align == "top_left" else n_k - n_q
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + off


def close(out, expected, tol=1e-9):
    out = np.asarray(out, dtype=np.float64)
    return out.shape == expected.shape and bool(np.allclose(out, expected, rtol=tol, atol=tol, equal_nan=True))


def differs(out, expected, tol=1e-6):
    out = np.asarray(out, dtype=np.float64)
    return out.shape != expected.shape or not np.allclose(out, expected, rtol=tol, atol=tol, equal_nan=True)


def inputs(b=2, h=4, n_q=5, n_k=7, d=8, d_v=6, h_kv=None, seed=0):
    r = np.random.default_rng(RNG_SEED + seed)
    q = r.standard_normal((b, h, n_q, d))
    k = r.standard_normal((b, h_kv or h, n_k, d))
    v = r.standard_normal((b, h_kv or h, n_k, d_v))
    return q, k, v


def full_mask(b, h, n_q, n_k, seed=0, empty_row=False):
    r = np.random.default_rng(RNG_SEED + 100 + seed)
    mask = r.random((b, h, n_q, n_k)) > 0.35
    mask[..., 0] |= ~mask.any(axis=-1)  # at least one key per row
    if empty_row:
        mask[1, 1, 2] = False
    return mask


def key_lengths(b, n_k):
    return np.array([n_k - 3, n_k][:b] if b == 2 else [max(1, n_k - i) for i in range(b)])


def T(x, dtype=torch.float64):
    t = torch.from_numpy(np.ascontiguousarray(x))
    return t.to(dtype) if t.is_floating_point() else t


def npy(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def bnhd(x):
    return np.ascontiguousarray(np.swapaxes(x, 1, 2))


def additive(allow, dtype=np.float64):
    return np.where(allow, 0.0, F32_MIN).astype(dtype)


def torch_call(fn, q, k, v, *args, **kw):
    return npy(fn(T(q), T(k), T(v), *args, **kw))


# ---------------------------------------------------------------------------------------------------------------
# correct cases


def _ok_gpt2_cross(fn):
    q, k, v = inputs()
    assert close(torch_call(fn, q, k, v), ref(q, k, v))
    allow = full_mask(2, 1, 5, 7)
    assert close(torch_call(fn, q, k, v, T(additive(allow))), ref(q, k, v, allow))


def _ok_gpt2_causal(fn):
    for n_q, n_k in ((5, 7), (6, 6), (7, 4)):
        q, k, v = inputs(n_q=n_q, n_k=n_k)
        assert close(torch_call(fn, q, k, v), ref(q, k, v, causal(n_q, n_k, "bottom_right"), empty="uniform"))


def _ok_t5_folded(fn):
    q, k, v = inputs()
    allow = full_mask(2, 4, 5, 7)
    # float64 inputs are computed in float32 by T5's softmax(scores.float())
    assert close(torch_call(fn, q, k, v, T(additive(allow))), ref(q, k, v, allow), tol=1e-5)


def _ok_distilbert(fn):
    q, k, v = inputs()
    lens = key_lengths(2, 7)
    keep = (np.arange(7)[None, :] < lens[:, None]).astype(np.int64)
    assert close(torch_call(fn, q, k, v, T(keep)), ref(q, k, v, keep[:, None, None, :].astype(bool)))


def _bug_distilbert_float64_nan(fn):
    """Correct where a sequence has a real key; a fully padded one is NaN in float64 only (the fill
    torch.tensor(finfo(float64).min) is a float32 tensor: -inf)."""
    _ok_distilbert(fn)
    q, k, v = inputs()
    keep = np.ones((2, 7), np.int64)
    keep[1] = 0
    out64 = torch_call(fn, q, k, v, T(keep))
    assert np.isnan(out64[1]).all() and np.isfinite(out64[0]).all()
    t = {n: torch.from_numpy(x).float() for n, x in (("q", q), ("k", k), ("v", v))}
    out32 = fn(t["q"], t["k"], t["v"], torch.from_numpy(keep))
    assert torch.isfinite(out32).all()


def _key_padding_cases():
    q, k, v = inputs()
    real = np.arange(7)[None, :] < np.array([4, 0])[:, None]  # the second sequence fully padded
    return q, k, v, real


def _ok_fairseq(fn):
    q, k, v, real = _key_padding_cases()
    out = torch_call(fn, q, k, v, T(~real))
    assert close(out, ref(q, k, v, real[:, None, None, :]), tol=1e-5)


def _ok_flax(fn):
    q, k, v = inputs()
    allow = full_mask(2, 4, 5, 7, empty_row=True)
    out = np.asarray(fn(jnp.asarray(bnhd(q), jnp.float32), jnp.asarray(bnhd(k)), jnp.asarray(bnhd(v)), allow))
    assert close(bnhd(out), ref(q, k, v, allow, empty="uniform"), tol=1e-4)


def _ok_equinox(fn):
    q, k, v = inputs()
    allow = full_mask(2, 4, 5, 7, empty_row=True)
    assert close(fn(q, k, v, allow), ref(q, k, v, allow, empty="uniform"))
    assert close(fn(q[0], k[0], v[0]), ref(q[0], k[0], v[0]))


def _ok_allennlp(fn):
    q, k, v, real = _key_padding_cases()
    assert close(torch_call(fn, q, k, v, T(real)), ref(q, k, v, real[:, None, None, :], empty="uniform"))


def _ok_valid_lens(fn):
    q, k, v = inputs()
    lens = np.array([3, 0])
    allow = (np.arange(7)[None, :] < lens[:, None])[:, None, None, :]
    assert close(fn(q, k, v, lens), ref(q, k, v, allow))
    assert close(fn(q, k, v), ref(q, k, v))


def _kv_ref(q, k, v, lens, causal_, gqa="interleave"):
    n_q, n_k = q.shape[2], k.shape[2]
    j = np.arange(n_k)[None, None, None, :]
    i = np.arange(n_q)[None, None, :, None]
    L = lens[:, None, None, None]
    allow = j < L
    if causal_:
        allow = allow & (j <= L - n_q + i)
    return ref(q, k, v, allow, gqa=gqa)


def _kv_call(fn, q, k, v, lens, causal_):
    return bnhd(fn(bnhd(q), bnhd(k), bnhd(v), cache_seqlens=lens, causal=causal_))


def _ok_kvcache(fn):
    q, k, v = inputs(n_q=3, n_k=9, h_kv=2)
    lens = np.array([5, 9])
    for c in (False, True):
        assert close(_kv_call(fn, q, k, v, lens, c), _kv_ref(q, k, v, lens, c))
    lens0 = np.array([2, 9])  # 2 keys for 3 new queries: the first query has no key when causal
    assert close(_kv_call(fn, q, k, v, lens0, True), _kv_ref(q, k, v, lens0, True))


def _varlen_pack(lq, lk, h=4, d=8, d_v=6, seed=0):
    r = np.random.default_rng(RNG_SEED + 7 + seed)
    qs = [r.standard_normal((h, n, d)) for n in lq]
    ks = [r.standard_normal((h, n, d)) for n in lk]
    vs = [r.standard_normal((h, n, d_v)) for n in lk]
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)

    def pack(xs):
        return np.concatenate([np.swapaxes(x, 0, 1) for x in xs], axis=0)

    return qs, ks, vs, pack(qs), pack(ks), pack(vs), cq, ck


def _varlen_call(fn, Q, K, V, cq, ck, lq, lk, causal_):
    return npy(fn(T(Q), T(K), T(V), T(cq), T(ck), max(lq), max(lk), causal=causal_))


def _ok_varlen(fn):
    lq, lk = [3, 4, 2], [5, 2, 0]
    qs, ks, vs, Q, K, V, cq, ck = _varlen_pack(lq, lk)
    for c in (False, True):
        out = _varlen_call(fn, Q, K, V, cq, ck, lq, lk, c)
        for b in range(3):
            allow = causal(lq[b], lk[b], "bottom_right") if c else None
            expected = ref(qs[b], ks[b], vs[b], allow) if lk[b] else np.zeros((4, lq[b], 6))
            assert close(np.swapaxes(out[cq[b] : cq[b + 1]], 0, 1), expected)


def _layer_ref(layer, x, allow):
    """The layer's own projections applied in float64 NumPy around the reference (GQA interleave)."""
    W = {n: (p.weight.detach().double().numpy(), p.bias) for n, p in layer.named_children() if n.endswith("proj")}

    def proj(name, inp):
        w, b = W[name]
        y = inp @ w.T
        return y + b.detach().double().numpy() if b is not None else y

    B, n, _ = x.shape
    hd = layer.head_dim
    q = proj("q_proj", x).reshape(B, n, -1, hd).transpose(0, 2, 1, 3)
    k = proj("k_proj", x).reshape(B, n, -1, hd).transpose(0, 2, 1, 3)
    v = proj("v_proj", x).reshape(B, n, -1, hd).transpose(0, 2, 1, 3)
    o = ref(q, k, v, allow, scale=layer.scaling, gqa="interleave").transpose(0, 2, 1, 3).reshape(B, n, -1)
    return proj("o_proj", o)


def _layer_call(layer, x, allow):
    B, n, _ = x.shape
    cos = torch.ones(B, n, layer.head_dim, dtype=torch.float64)
    sin = torch.zeros(B, n, layer.head_dim, dtype=torch.float64)
    mask = T(additive(allow)) if allow is not None else None
    layer = layer.double()
    try:
        out = layer(T(x), position_embeddings=(cos, sin), attention_mask=mask)[0]
    finally:
        layer.float()
    return npy(out)


def _ok_layer(layer):
    r = np.random.default_rng(RNG_SEED + 3)
    x = r.standard_normal((2, 6, 64))
    allow = np.broadcast_to(causal(6, 6), (2, 1, 6, 6)).copy()
    allow[1, :, :, 0] = False  # a padded first key in sequence 1
    allow[1, 0, 0, 0] = True
    assert close(_layer_call(layer, x, allow), _layer_ref(layer, x, allow), tol=1e-5)


class _Stand:
    training = False
    num_key_value_groups = 1


def _ok_hf_function(fn):
    q, k, v = inputs()
    allow = full_mask(2, 4, 5, 7)
    out, _ = fn(_Stand(), T(q), T(k), T(v), T(additive(allow)), scaling=8**-0.5, dropout=0.0)
    assert close(npy(out).transpose(0, 2, 1, 3), ref(q, k, v, allow), tol=1e-5)


def _ok_triton(fn):
    q, k, v = inputs(n_q=21, n_k=37)
    assert close(fn(q, k, v), ref(q, k, v))
    assert close(fn(q, k, v, causal=True), ref(q, k, v, causal(21, 37)))
    assert close(fn(q, k, v, sm_scale=0.3), ref(q, k, v, scale=0.3))
    out16 = fn(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16))
    assert out16.dtype == np.float16 and close(out16, ref(q, k, v), tol=2e-2)


def _ok_sdpa_partial(fn):
    q, k, v = inputs(h_kv=2)
    allow = full_mask(2, 4, 5, 7, empty_row=True)
    out = torch_call(fn, q, k, v, attn_mask=T(allow), is_causal=True, scale=0.4, enable_gqa=True)
    assert close(out, ref(q, k, v, allow & causal(5, 7), scale=0.4, gqa="interleave"))


def _ok_falcon(fn):
    q, k, v = inputs()
    allow = full_mask(2, 4, 5, 7)
    assert close(torch_call(fn, q, k, v, T(additive(allow))), ref(q, k, v, allow))


def _ok_qwen2_sdpa(fn):
    q, k, v = inputs(h_kv=2)
    allow = full_mask(2, 4, 5, 7)
    assert close(torch_call(fn, q, k, v, attn_mask=T(allow)), ref(q, k, v, allow, gqa="interleave"))
    q, k, v = inputs(n_q=6, n_k=6, h_kv=2)
    assert close(torch_call(fn, q, k, v, is_causal=True), ref(q, k, v, causal(6, 6), gqa="interleave"))


def _ok_mlx(cls):
    fn = cls()
    q, k, v = inputs(h_kv=2)
    allow = full_mask(2, 4, 5, 7, empty_row=True)
    assert close(fn(q, k, v, allow, scale=0.5), ref(q, k, v, allow, scale=0.5, empty="uniform", gqa="interleave"))


# ---------------------------------------------------------------------------------------------------------------
# buggy cases: each asserts the planted deviation (and that it is the only one, where that can be shown)


def _bug_gpt2_value(fn):
    q, k, v = inputs(d=8, d_v=6)
    out = torch_call(fn, q, k, v)
    assert differs(out, ref(q, k, v)) and close(out, ref(q, k, v, scale=6**-0.5))
    q, k, v = inputs(d=8, d_v=8)
    assert close(torch_call(fn, q, k, v), ref(q, k, v))  # right while d_v == d_k


def _bug_gpt2_top_left(fn):
    q, k, v = inputs(n_q=3, n_k=7)
    out = torch_call(fn, q, k, v)
    assert close(out, ref(q, k, v, causal(3, 7, "top_left")))
    assert differs(out, ref(q, k, v, causal(3, 7, "bottom_right")))
    q, k, v = inputs(n_q=6, n_k=6)
    assert close(torch_call(fn, q, k, v), ref(q, k, v, causal(6, 6)))


def _bug_t5_raw(fn):
    q, k, v = inputs()
    out = torch_call(fn, q, k, v)
    assert differs(out, ref(q, k, v)) and close(out, ref(q, k, v, scale=1.0), tol=1e-5)


def _bug_bart(fn):
    q, k, v = inputs()
    allow = full_mask(2, 4, 5, 7)
    out = torch_call(fn, q, k, v, attn_mask=T(allow))
    assert differs(out, ref(q, k, v, allow)) and close(out, ref(q, k, v, allow, scale=1 / 8))


def _softmax_queries_ref(q, k, v, allow=None, fill=F32_MIN):
    s = np.asarray(q, np.float64) @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if allow is not None:
        s = np.where(allow, s, fill)
    w = np.exp(s - s.max(axis=-2, keepdims=True))
    return (w / w.sum(axis=-2, keepdims=True)) @ v


def _bug_flax_axis(fn):
    q, k, v = inputs()
    allow = full_mask(2, 4, 5, 7)
    out = bnhd(np.asarray(fn(jnp.asarray(bnhd(q), jnp.float32), jnp.asarray(bnhd(k)), jnp.asarray(bnhd(v)), allow)))
    assert differs(out, ref(q, k, v, allow)) and close(out, _softmax_queries_ref(q, k, v, allow), tol=1e-4)


def _bug_flax_rescaled(fn):
    q, k, v = inputs()
    allow = full_mask(2, 4, 5, 7)
    out = bnhd(np.asarray(fn(jnp.asarray(bnhd(q), jnp.float32), jnp.asarray(bnhd(k)), jnp.asarray(bnhd(v)), allow)))
    assert close(out, ref(q, k, v, allow) / math.sqrt(8), tol=1e-4)


def _bug_flax_numpy(fn):
    q, k, v = inputs()
    out = fn(jnp.asarray(bnhd(q), jnp.float32), jnp.asarray(bnhd(k)), jnp.asarray(bnhd(v)))
    assert isinstance(out, np.ndarray) and not isinstance(out, jax.Array)
    assert close(bnhd(out), ref(q, k, v), tol=1e-4)


def _bug_haiku(fn):
    q, k, v = inputs()
    allow = full_mask(2, 4, 5, 7, empty_row=True)
    out32 = np.asarray(fn(*(jnp.asarray(x, jnp.float32) for x in (q, k, v)), allow), dtype=np.float64)
    assert close(out32, ref(q, k, v, allow, empty="uniform"), tol=1e-4)  # float32: right, uniform empty row
    out16 = np.asarray(fn(*(jnp.asarray(x, jnp.float16) for x in (q, k, v)), allow), dtype=np.float64)
    bad = ~np.isfinite(out16)
    assert bad[1, 1, 2].all() and bad.sum() == bad[1, 1, 2].size  # NaN on the empty row only
    ok = np.isfinite(out16)
    assert np.allclose(out16[ok], ref(q, k, v, allow)[ok], atol=2e-2)


def _bug_dim2(fn):
    q, k, v = inputs()
    allow = full_mask(2, 4, 5, 7)
    out = torch_call(fn, q, k, v, T(allow))
    expected = _softmax_queries_ref(q, k, v, allow, fill=-np.inf)
    expected_cols = np.nan_to_num(expected)
    assert differs(out, ref(q, k, v, allow)) and close(out, expected_cols)
    assert close(torch_call(fn, q[0], k[0], v[0], T(allow[0])), ref(q[0], k[0], v[0], allow[0]))  # right on 3-D


def _bug_elif(fn):
    q, k, v = inputs(n_q=6, n_k=6)
    allow = full_mask(2, 4, 6, 6)
    out = torch_call(fn, q, k, v, attn_mask=T(allow), is_causal=True)
    assert close(out, ref(q, k, v, allow)) and differs(out, ref(q, k, v, allow & causal(6, 6)))
    assert close(torch_call(fn, q, k, v, is_causal=True), ref(q, k, v, causal(6, 6)))
    assert close(torch_call(fn, q, k, v, attn_mask=T(allow)), ref(q, k, v, allow))


def _bug_tinygrad(fn):
    q, k, v = inputs(n_q=6, n_k=6)
    allow = full_mask(2, 4, 6, 6)
    out = torch_call(fn, q, k, v, attn_mask=T(allow), is_causal=True)
    assert close(out, ref(q, k, v, causal(6, 6))) and differs(out, ref(q, k, v, allow & causal(6, 6)))
    allow = full_mask(2, 4, 6, 6, empty_row=True)
    out = torch_call(fn, q, k, v, attn_mask=T(allow))
    assert np.isnan(out[1, 1, 2]).all() and np.isfinite(np.delete(out.reshape(-1, 6), 1 * 24 + 1 * 6 + 2, 0)).all()


def _bug_inplace(fn):
    q, k, v = inputs()
    allow = full_mask(2, 4, 5, 7, empty_row=True)
    m_t = T(allow.copy())
    out = torch_call(fn, q, k, v, attn_mask=m_t)
    assert not np.array_equal(m_t.numpy(), allow) and m_t.numpy()[1, 1, 2].all()
    has = allow.any(-1)
    assert close(out[has], ref(q, k, v, allow)[has])


def _bug_float32(fn):
    q, k, v = inputs()
    out = fn(q, k, v)
    assert out.dtype == np.float32 and close(out, ref(q, k, v), tol=1e-5)
    assert fn(*(x.astype(np.float16) for x in (q, k, v))).dtype == np.float32


def _bug_dropout(fn):
    torch.manual_seed(0)
    q, k, v = inputs(n_q=9, n_k=9)
    a, b = torch_call(fn, q, k, v), torch_call(fn, q, k, v)
    assert differs(a, b)
    assert fn(T(q), T(k), T(v)).dtype == torch.float32


def _bug_triton_alpha(fn):
    q, k, v = inputs(n_q=5, n_k=40)
    ones = np.ones_like(v)
    out = fn(q, k, ones)
    assert differs(out, np.ones_like(out), tol=1e-3)  # rows do not sum to 1
    q, k, v = inputs(n_q=5, n_k=16)
    assert close(fn(q, k, v), ref(q, k, v))  # right with one key block


def _bug_bmm(fn):
    q, k, v = inputs(b=2, h=4)
    out = torch_call(fn, q, k, v)
    k2 = k.copy()
    k2[1] = np.random.default_rng(RNG_SEED + 9).standard_normal(k2[1].shape)
    assert differs(torch_call(fn, q, k2, v)[0], out[0])  # batch element 0 moves when element 1's K changes
    assert differs(out, ref(q, k, v))


def _bug_keep_inverted(fn):
    q, k, v = inputs()
    allow = full_mask(2, 4, 5, 7)
    out = fn(q, k, v, allow.astype(np.int64))
    mixed = allow.any(-1) & (~allow).any(-1)
    assert mixed.any() and close(out[mixed], ref(q, k, v, ~allow)[mixed])


def _bug_fp16_min(fn):
    q, k, v = inputs()
    allow = full_mask(2, 4, 5, 7)
    assert close(torch_call(fn, q, k, v, T(allow)), ref(q, k, v, allow))  # ordinary scores: right
    big = -3e5 * np.ones_like(q)  # with k > 0 every score is about -1e6: below the -65504 fill
    k = np.abs(k) + 0.5
    out = torch_call(fn, big, k, v, T(allow))
    v2 = v + np.where(allow[..., 0, :], 0.0, 1.0)[..., None]  # change V of the keys query 0 may not see
    out2 = torch_call(fn, big, k, v2, T(allow))
    assert differs(out, ref(big, k, v, allow), tol=1e-3) and differs(out[..., 0, :], out2[..., 0, :])


def _bug_bf16(fn):
    q, k, v = inputs()
    out = torch_call(fn, q, k, v)
    err = np.abs(out - ref(q, k, v)).max()
    assert 1e-5 < err < 5e-2, err


def _bug_unpack(fn):
    q, k, v = inputs()
    assert close(torch_call(fn, q, k, v), ref(q, k, v))
    try:
        torch_call(fn, q[0], k[0], v[0])
    except ValueError as e:
        assert "unpack" in str(e)
    else:
        raise AssertionError("expected a ValueError on 3-D inputs")


def _bug_raise(fn):
    q, k, v = inputs()
    allow = full_mask(2, 4, 5, 7, empty_row=True)
    out = fn(q, k, v, allow)  # no raise
    assert close(out, ref(q, k, v, allow, empty="uniform"))
    try:
        fn(q, k, v, np.zeros_like(allow))
    except ValueError:
        pass
    else:
        raise AssertionError("documented raise missing")


def _bug_gqa_outer(fn):
    q, k, v = inputs(h_kv=2)
    out = torch_call(fn, q, k, v)
    assert close(out, ref(q, k, v, gqa="tile")) and differs(out, ref(q, k, v, gqa="interleave"))


def _bug_mlx_tile(obj):
    q, k, v = inputs(h_kv=2)
    allow = full_mask(2, 4, 5, 7)
    out = obj(q, k, v, allow)
    assert close(out, ref(q, k, v, allow, gqa="tile")) and differs(out, ref(q, k, v, allow, gqa="interleave"))


def _bug_naive_lse(fn):
    q, k, v = inputs(h_kv=None)
    allow = full_mask(2, 4, 5, 7)
    assert close(torch_call(fn, q, k, v, attn_mask=T(allow)), ref(q, k, v, allow))  # ordinary logits: right
    assert close(torch_call(fn, q, k, v, is_causal=True, scale=0.3), ref(q, k, v, causal(5, 7), scale=0.3))
    big = np.ones_like(q) * 30.0
    kk = np.abs(k) * 30.0  # logits of several thousand
    out = torch_call(fn, big, kk, v)
    assert not np.isfinite(out).all() or differs(out, ref(big, kk, v))
    low = torch_call(fn, -big, kk, v)  # exp underflows to 0 everywhere: lse = -inf, the rows come back 0
    assert np.all(low == 0) and differs(low, ref(-big, kk, v))


def _bug_equinox_two(fn):
    q, k, v = inputs()
    allow = full_mask(2, 4, 5, 7, empty_row=True)
    out = fn(q, k, v, allow)
    has = allow.any(-1)
    assert close(out[has], ref(q, k, v, allow, scale=1.0)[has]) and np.isnan(out[1, 1, 2]).all()


def _bug_batch_after(fn):
    q, k, v = inputs()
    allow = full_mask(2, 1, 5, 7)
    out = fn(q, k, v, allow.astype(np.int64))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(8)
    w = np.exp(s - s.max(-1, keepdims=True))
    expected = (w / w.sum(-1, keepdims=True) * allow) @ v
    assert close(out, expected) and differs(out, ref(q, k, v, allow))
    assert close(fn(q, k, v, np.ones_like(allow, dtype=np.int64)), ref(q, k, v))  # right when nothing is masked


def _bug_distilbert_inverted(fn):
    q, k, v = inputs()
    keep = (np.arange(7)[None, :] < np.array([4, 6])[:, None]).astype(np.int64)
    out = torch_call(fn, q, k, v, T(keep))
    assert close(out, ref(q, k, v, (keep == 0)[:, None, None, :]))


def _bug_fairseq_published(fn):
    q, k, v, real = _key_padding_cases()
    out = torch_call(fn, q, k, v, T(~real))
    assert np.isnan(out[1]).all() and close(out[0], ref(q, k, v, real[:, None, None, :])[0], tol=1e-5)


def _bug_fairseq_head_major(fn):
    q, k, v = inputs(b=2, h=4)
    real = np.arange(7)[None, :] < np.array([4, 6])[:, None]
    out = torch_call(fn, q, k, v, T(~real))
    slot = (np.arange(2)[:, None] * 4 + np.arange(4)[None, :]) % 2  # slot b*h + i reads mask[(b*h + i) % B]
    wrong = real[slot][:, :, None, :]
    assert close(out, ref(q, k, v, wrong), tol=1e-5) and differs(out, ref(q, k, v, real[:, None, None, :]))


def _bug_fairseq_two(fn):
    q, k, v, real = _key_padding_cases()
    out = torch_call(fn, q, k, v, T(~real))
    assert np.isnan(out[1]).all()
    assert close(out[0], ref(q, k, v, real[:, None, None, :], scale=1.0)[0], tol=1e-5)


def _bug_valid_lens_queries(fn):
    q, k, v = inputs()
    lens = np.array([3, 6])
    out = fn(q, k, v, lens)
    v2 = v.copy()
    v2[0, :, 3:] += 5.0  # padded keys of sequence 0
    out2 = fn(q, k, v2, lens)
    assert differs(out[0, :, :3], out2[0, :, :3])  # its real queries move


def _bug_kv_global(fn):
    q, k, v = inputs(n_q=3, n_k=9, h_kv=2)
    lens = np.array([5, 9])
    out = _kv_call(fn, q, k, v, lens, True)
    assert differs(out, _kv_ref(q, k, v, lens, True))
    assert close(out[1], _kv_ref(q, k, v, lens, True)[1])  # the full-length sequence is right
    k2 = k.copy()
    k2[0, :, 4] += 3.0  # key 4 = the last new token of sequence 0: the future of its queries 0 and 1
    out2 = _kv_call(fn, q, k2, v, lens, True)
    assert differs(out[0, :, 0], out2[0, :, 0])
    assert close(_kv_call(fn, q, k, v, lens, False), _kv_ref(q, k, v, lens, False))


def _bug_kv_inclusive(fn):
    q, k, v = inputs(n_q=3, n_k=9, h_kv=2)
    lens = np.array([5, 9])
    out = _kv_call(fn, q, k, v, lens, False)
    v2 = v.copy()
    v2[0, :, 5] += 3.0  # the slot after sequence 0's cache
    assert differs(out[0], _kv_call(fn, q, k, v2, lens, False)[0])
    assert close(out[1], _kv_ref(q, k, v, lens, False)[1])


def _bug_varlen_packed(fn):
    lq, lk = [3, 4], [5, 4]
    _, _, _, Q, K, V, cq, ck = _varlen_pack(lq, lk)
    out = _varlen_call(fn, Q, K, V, cq, ck, lq, lk, False)
    V2 = V.copy()
    V2[5:] += 2.0  # sequence 1's values
    assert differs(out[:3], _varlen_call(fn, Q, K, V2, cq, ck, lq, lk, False)[:3])


def _module_parts(layer):
    return layer.config._attn_implementation


def _bug_module_mask_dropped(layer):
    fn = m.HF_FUNCTIONS[_module_parts(layer)]
    q, k, v = inputs(h_kv=2)
    allow = full_mask(2, 4, 5, 7)
    out, _ = fn(layer, T(q), T(k), T(v), T(additive(allow)), scaling=8**-0.5)
    out = npy(out).transpose(0, 2, 1, 3)
    assert close(out, ref(q, k, v, gqa="interleave"), tol=1e-5) and differs(out, ref(q, k, v, allow, gqa="interleave"))


def _bug_module_dropout(layer):
    fn = m.HF_FUNCTIONS[_module_parts(layer)]
    assert not layer.training and layer.config.attention_dropout == 0.1
    torch.manual_seed(0)
    q, k, v = inputs(n_q=9, n_k=9, h_kv=2)
    a = npy(fn(layer, T(q), T(k), T(v), None, scaling=8**-0.5, dropout=0.0)[0])
    b = npy(fn(layer, T(q), T(k), T(v), None, scaling=8**-0.5, dropout=0.0)[0])
    assert differs(a, b)


def _bug_module_neox(layer):
    fn = m.HF_FUNCTIONS[_module_parts(layer)]
    q, k, v = inputs(d=16, h_kv=2)
    out = npy(fn(layer, T(q), T(k), T(v), None, scaling=layer.scaling)[0]).transpose(0, 2, 1, 3)
    assert close(out, ref(q, k, v, scale=64**-0.5, gqa="interleave"), tol=1e-5)
    assert differs(out, ref(q, k, v, gqa="interleave"))


# every dtype, logits of ordinary size and of about a thousand, 3-D inputs: the correct q, k, v functions
SWEEP = {
    "h2-ok-gpt2-cross-attn": "torch",
    "h2-ok-gpt2-causal-bottom-right": "torch",
    "h2-ok-t5-folded-scale-lambda": "torch",
    "h2-ok-equinox-numpy": "numpy",
    "h2-ok-triton-tutorial-numpy": "numpy",
    "h2-ok-sdpa-docs-reference-partial": "torch",
    "h2-ok-falcon-additive": "torch",
    "h2-ok-qwen2-repeat-kv-sdpa": "torch",
    "h2-ok-mlx-style-class": "class",
    "h2-ok-flax-dot-product-attention": "jax",
    "h2-ok-fairseq-key-padding-guarded": "torch",
    "h2-distilbert-key-padding-finfo-float32-tensor": "torch",
    "h2-ok-allennlp-masked-softmax": "torch",
    "h2-ok-valid-lens-numpy": "numpy",
}
RANK4_ONLY = {"h2-ok-t5-folded-scale-lambda", "h2-ok-qwen2-repeat-kv-sdpa", "h2-ok-mlx-style-class"}
TOLS = {"float64": 1e-6, "float32": 1e-4, "float16": 3e-2, "bfloat16": 2e-1}


def _run(fn, kind, q, k, v, dtype):
    if kind == "torch":
        return npy(fn(*(torch.from_numpy(np.ascontiguousarray(x)).to(getattr(torch, dtype)) for x in (q, k, v))))
    if kind == "jax":
        out = fn(*(jnp.asarray(np.swapaxes(x, -3, -2)).astype(dtype) for x in (q, k, v)))
        return np.swapaxes(np.asarray(out.astype(jnp.float32), dtype=np.float64), -3, -2)
    out = fn(*(x.astype(dtype) for x in (q, k, v)))
    assert out.dtype == np.dtype(dtype), (out.dtype, dtype)
    return out.astype(np.float64)


def sweep(name, fn):
    """Correct in every dtype its library has, with logits of about 1e3 too, and on 3-D inputs."""
    kind = SWEEP[name]
    if kind == "class":
        fn, kind = fn(), "numpy"
    dtypes = {"torch": TOLS, "numpy": ("float64", "float32", "float16"), "jax": ("float32", "float16", "bfloat16")}
    q, k, v = inputs()
    align = causal(5, 7, "bottom_right") if "causal" in name else None
    for dtype in dtypes[kind]:
        for mag in (1.0, 40.0):
            qq, kk = q * mag, k * mag
            err = np.abs(_run(fn, kind, qq, kk, v, dtype) - ref(qq, kk, v, align)).max()
            assert err < TOLS[dtype] * max(1.0, mag / 4), (name, dtype, mag, err)
    if name not in RANK4_ONLY and "key-padding" not in name and "masked-softmax" not in name and "valid" not in name:
        out = _run(fn, kind, q[0], k[0], v[0], "float32")
        assert np.abs(out - ref(q[0], k[0], v[0], align)).max() < 1e-4, name


CHECKS = {
    "h2-ok-gpt2-cross-attn": _ok_gpt2_cross,
    "h2-ok-gpt2-causal-bottom-right": _ok_gpt2_causal,
    "h2-ok-t5-folded-scale-lambda": _ok_t5_folded,
    "h2-distilbert-key-padding-finfo-float32-tensor": _bug_distilbert_float64_nan,
    "h2-ok-fairseq-key-padding-guarded": _ok_fairseq,
    "h2-ok-flax-dot-product-attention": _ok_flax,
    "h2-ok-equinox-numpy": _ok_equinox,
    "h2-ok-allennlp-masked-softmax": _ok_allennlp,
    "h2-ok-valid-lens-numpy": _ok_valid_lens,
    "h2-ok-kvcache-decode-numpy": _ok_kvcache,
    "h2-ok-varlen-torch-loop": _ok_varlen,
    "h2-ok-qwen2-attention-eager": _ok_layer,
    "h2-ok-mistral-attention-sdpa": _ok_layer,
    "h2-ok-whisper-eager-function": _ok_hf_function,
    "h2-ok-gpt-neox-eager-function": _ok_hf_function,
    "h2-ok-triton-tutorial-numpy": _ok_triton,
    "h2-ok-sdpa-docs-reference-partial": _ok_sdpa_partial,
    "h2-ok-falcon-additive": _ok_falcon,
    "h2-ok-qwen2-repeat-kv-sdpa": _ok_qwen2_sdpa,
    "h2-ok-mlx-style-class": _ok_mlx,
    "h2-gpt2-value-size-scale": _bug_gpt2_value,
    "h2-gpt2-causal-slice-top-left": _bug_gpt2_top_left,
    "h2-t5-unscaled-raw": _bug_t5_raw,
    "h2-bart-sdpa-double-scale": _bug_bart,
    "h2-flax-softmax-over-queries": _bug_flax_axis,
    "h2-flax-returns-numpy": _bug_flax_numpy,
    "h2-flax-weights-rescaled": _bug_flax_rescaled,
    "h2-haiku-1e30-float16": _bug_haiku,
    "h2-softmax-dim2-from-3d": _bug_dim2,
    "h2-sdpa-mask-elif-causal": _bug_elif,
    "h2-tinygrad-causal-replaces-mask": _bug_tinygrad,
    "h2-unmask-empty-rows-inplace": _bug_inplace,
    "h2-numpy-returns-float32": _bug_float32,
    "h2-f-dropout-default-training": _bug_dropout,
    "h2-triton-tutorial-acc-not-rescaled": _bug_triton_alpha,
    "h2-bmm-head-major-keys": _bug_bmm,
    "h2-keep-to-additive-inverted": _bug_keep_inverted,
    "h2-fp16-min-fill-every-dtype": _bug_fp16_min,
    "h2-qk-bfloat16": _bug_bf16,
    "h2-unpack-four-dims": _bug_unpack,
    "h2-documented-raise-whole-mask": _bug_raise,
    "h2-qwen2-repeat-kv-outer-axis": _bug_gqa_outer,
    "h2-mlx-style-grouped-tile": _bug_mlx_tile,
    "h2-equinox-unscaled-neg-inf": _bug_equinox_two,
    "h2-naive-logsumexp": _bug_naive_lse,
    "h2-distilbert-keep-inverted": _bug_distilbert_inverted,
    "h2-batch-keep-multiplied-after-softmax": _bug_batch_after,
    "h2-fairseq-key-padding-as-published": _bug_fairseq_published,
    "h2-fairseq-key-padding-head-major": _bug_fairseq_head_major,
    "h2-fairseq-unscaled-nan": _bug_fairseq_two,
    "h2-valid-lens-on-queries": _bug_valid_lens_queries,
    "h2-kvcache-causal-global-offset": _bug_kv_global,
    "h2-kvcache-seqlens-inclusive": _bug_kv_inclusive,
    "h2-varlen-no-block-diagonal": _bug_varlen_packed,
    "h2-module-qwen2-mask-dropped": _bug_module_mask_dropped,
    "h2-module-mistral-own-dropout": _bug_module_dropout,
    "h2-module-qwen2-neox-hidden-norm": _bug_module_neox,
}


def verify_all() -> list[str]:
    """Runs the self-check of every case; returns the names verified. AssertionError names the failing case."""
    cases = all_cases()
    names = {c.name for c in cases}
    missing = names - CHECKS.keys()
    extra = CHECKS.keys() - names
    assert not missing and not extra, f"checks missing for {sorted(missing)}, extra {sorted(extra)}"
    done = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            for case in cases:
                try:
                    CHECKS[case.name](case.fn)
                    if case.name in SWEEP:
                        sweep(case.name, case.fn)
                except Exception as e:
                    raise AssertionError(f"{case.name}: {type(e).__name__}: {e}") from e
                done.append(case.name)
    return done
