"""Gradients through the kernels: flash_attention and cached_attention on tensors that require grad, against torch
autograd through plain operations (float64, tight tolerance); and the places that refuse instead of dropping."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnlab.errors import DTypeError
from attnlab.kernels import KVCache, cached_attention, decode_step, flash_attention, flash_attention_backward


def _plain(q, k, v, *, allowed=None, bias=None, scale=None, temperature=1.0):
    """softmax((q kᵀ · scale + bias) / T, masked) v with torch ops only (GQA: k, v repeated per query head)."""
    if q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    if bias is not None:
        s = s + bias
    s = s / temperature
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.softmax(s, dim=-1) @ v, lse


def _leaves(rng, *shapes):
    return [torch.tensor(rng.standard_normal(s), requires_grad=True) for s in shapes]


def _grads(loss, xs):
    return torch.autograd.grad(loss, xs)


CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "bottom_right": dict(causal="bottom_right", n_q=5),
    "mask": dict(mask=True),
    "gqa": dict(h_kv=1),
    "bias": dict(bias=(1, 1, 9, 11)),
    "bias_per_head": dict(bias=(2, 3, 9, 11), causal="bottom_right"),
    "temperature": dict(temperature=0.37, causal="top_left"),
    "everything": dict(h_kv=1, mask=True, bias=(3, 1, 11), temperature=2.5, causal="bottom_right"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_flash_attention_gradients_match_torch_autograd(name):
    case = CASES[name]
    rng = np.random.default_rng(sorted(CASES).index(name))
    n_q, n_k, h, h_kv = case.get("n_q", 9), 11, 3, case.get("h_kv", 3)
    causal = case.get("causal", False)
    if causal is True:
        n_q = n_k
    q, k, v = _leaves(rng, (2, h, n_q, 6), (2, h_kv, n_k, 6), (2, h_kv, n_k, 5))
    leaves = [q, k, v]
    kw = {"temperature": case.get("temperature", 1.0)}
    allowed = None
    if causal:
        align = "top_left" if causal is True else causal
        shift = n_k - n_q if align == "bottom_right" else 0
        allowed = torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None] + shift
    if case.get("mask"):
        m = torch.tensor(rng.random((2, 1, n_q, n_k)) < 0.7)
        m[..., 0] = True  # no empty row
        kw["mask"] = m
        allowed = m if allowed is None else allowed & m
    bias = None
    if "bias" in case:
        shape = case["bias"]
        bias = torch.tensor(rng.standard_normal((*shape[:-2], n_q, n_k)) * 2, requires_grad=True)
        leaves.append(bias)
    r = flash_attention(q, k, v, causal=causal, bias=bias, block_q=4, block_k=3, **kw)
    assert r.output.requires_grad and r.lse.requires_grad
    want_out, want_lse = _plain(q, k, v, allowed=allowed, bias=bias, temperature=kw["temperature"])
    torch.testing.assert_close(r.output, want_out, atol=1e-12, rtol=0)
    torch.testing.assert_close(r.lse, want_lse, atol=1e-12, rtol=0)
    # a loss of the output and of lse: the gradient of lse goes through delta
    w_out, w_lse = torch.tensor(rng.standard_normal(r.output.shape)), torch.tensor(rng.standard_normal(r.lse.shape))
    got = _grads((r.output * w_out).sum() + (r.lse * w_lse).sum(), leaves)
    want = _grads((want_out * w_out).sum() + (want_lse * w_lse).sum(), leaves)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == torch.float64
        torch.testing.assert_close(g, w, atol=1e-11, rtol=0)


def test_backward_fills_grad_and_numpy_results_stay_plain():
    rng = np.random.default_rng(20)
    q, k, v = _leaves(rng, (2, 7, 4), (2, 7, 4), (2, 7, 4))
    flash_attention(q, k, v, causal=True).output.sum().backward()
    want = _grads(_plain(q, k, v, allowed=torch.ones(7, 7).tril().bool())[0].sum(), [q, k, v])
    for x, w in zip((q, k, v), want, strict=True):
        torch.testing.assert_close(x.grad, w, atol=1e-12, rtol=0)
    with torch.no_grad():
        assert not flash_attention(q, k, v).output.requires_grad  # grad mode off: no history, nothing refused
    assert not flash_attention(q.detach(), k.detach(), v.detach()).output.requires_grad
    assert isinstance(flash_attention(q.detach().numpy(), k.detach().numpy(), v.detach().numpy()).output, np.ndarray)


def test_float32_and_half_gradients_come_back_in_the_inputs_dtypes():
    rng = np.random.default_rng(21)
    q = torch.tensor(rng.standard_normal((2, 16, 8)), dtype=torch.float16, requires_grad=True)
    k = torch.tensor(rng.standard_normal((2, 16, 8)), dtype=torch.float32, requires_grad=True)
    v = torch.tensor(rng.standard_normal((2, 16, 8)), dtype=torch.float32, requires_grad=True)
    r = flash_attention(q, k, v, causal=True)
    r.output.float().sum().backward()
    assert q.grad.dtype == torch.float16 and k.grad.dtype == torch.float32
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    _plain(q64, k64, v64, allowed=torch.ones(16, 16).tril().bool())[0].sum().backward()
    torch.testing.assert_close(k.grad.double(), k64.grad, atol=2e-3, rtol=0)
    torch.testing.assert_close(v.grad.double(), v64.grad, atol=2e-3, rtol=0)


def test_refused_rather_than_silently_dropped():
    rng = np.random.default_rng(22)
    q, k, v = _leaves(rng, (5, 4), (5, 4), (5, 4))
    # the backward's own results carry no history: refused under grad mode
    with torch.no_grad():
        r = flash_attention(q, k, v)
    with pytest.raises(DTypeError, match=r"q, k, v: require grad, but flash_attention_backward gives results"):
        flash_attention_backward(r, torch.ones_like(r.output))
    with torch.no_grad():
        g = flash_attention_backward(r, torch.ones_like(r.output))
    assert g.dq.shape == (5, 4)
    # no double backward: torch says so (once_differentiable)
    out = flash_attention(q, k, v).output
    (gq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError):
        gq.sum().backward()
    # NumPy and torch mixed: a named error, with or without grad
    with pytest.raises(DTypeError, match="q, k, v: some require grad but not all are PyTorch tensors"):
        flash_attention(q, k.detach().numpy(), v)
    with pytest.raises(DTypeError, match=r"k: a numpy\.ndarray with q a torch\.Tensor"):
        flash_attention(q.detach(), k.detach().numpy(), v.detach())


def _decode_case(rng, B=2, h=4, h_kv=2, n=9, d=6, d_v=5):
    q = torch.tensor(rng.standard_normal((B, h, n, d)), requires_grad=True)
    k, v = rng.standard_normal((B, h_kv, n, d)), rng.standard_normal((B, h_kv, n, d_v))
    return q, k, v


@pytest.mark.parametrize("dense", [True, False])
def test_cached_attention_query_gradients(dense, kernel_config):
    """Decoding with a cache: the gradient w.r.t. every step's queries equals torch autograd through one full causal
    forward (per sequence, bottom-right aligned), through the dense path and the tiled one."""
    if not dense:
        kernel_config(dense_limit=0)
    rng = np.random.default_rng(23)
    q, k, v = _decode_case(rng)
    cache = KVCache(2, 2, 6, head_dim_v=5, dtype=np.float64)
    outs = []
    for s, t in ((0, 4), (4, 1), (5, 4)):
        outs.append(decode_step(cache, q[:, :, s : s + t], k[:, :, s : s + t], v[:, :, s : s + t]))
    out = torch.cat(outs, dim=2)
    assert out.requires_grad and out.dtype == torch.float64
    want, _ = _plain(q, torch.tensor(k), torch.tensor(v), allowed=torch.ones(9, 9).tril().bool())
    torch.testing.assert_close(out, want, atol=1e-12, rtol=0)
    w = torch.tensor(rng.standard_normal(out.shape))
    (got,) = _grads((out * w).sum(), [q])
    (ref,) = _grads((want * w).sum(), [q])
    torch.testing.assert_close(got, ref, atol=1e-11, rtol=0)


def test_cached_attention_padding_rows_get_zero_gradient():
    rng = np.random.default_rng(24)
    q, k, v = _decode_case(rng, n=6)
    cache = KVCache(2, 2, 6, head_dim_v=5, dtype=np.float64)
    cache.append(k, v, lengths=[6, 2])  # sequence 1 appends 2 real tokens, 4 of padding
    out = cached_attention(q, cache)
    (g,) = _grads(out.sum(), [q])
    assert not g[1, :, 2:].any() and not out[1, :, 2:].detach().any()
    sub = q[1:2, :, :2]
    causal = torch.ones(2, 2).tril().bool()
    want, _ = _plain(sub, torch.tensor(k[1:2, :, :2]), torch.tensor(v[1:2, :, :2]), allowed=causal)
    (ref,) = _grads(want.sum(), [q])
    torch.testing.assert_close(g[1, :, :2], ref[1, :, :2], atol=1e-12, rtol=0)


def test_cache_refuses_keys_and_values_that_require_grad():
    rng = np.random.default_rng(25)
    cache = KVCache(1, 1, 4)
    k = torch.tensor(rng.standard_normal((1, 1, 2, 4)), requires_grad=True)
    with pytest.raises(DTypeError, match=r"k_new: require grad, but KVCache.append \(the cache stores detached"):
        cache.append(k, k.detach())
    assert cache.lengths.tolist() == [0]
    with torch.no_grad():
        cache.append(k, k)  # inference: nothing needs a gradient
    cache.append(k.detach(), k.detach())
    assert cache.lengths.tolist() == [4]
