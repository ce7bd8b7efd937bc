"""Agreement with PyTorch: SDPA (bool and float masks, top-left causal, scale) and nn.MultiheadAttention's masks."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab import masks

rng = np.random.default_rng(1)


def t64(x):
    return torch.from_numpy(np.asarray(x, dtype=np.float64))


@pytest.mark.parametrize("n_q, n_k", [(5, 5), (3, 7), (7, 3)])
def test_sdpa_plain_and_scale(n_q, n_k):
    q, k, v = rng.normal(size=(2, 3, n_q, 4)), rng.normal(size=(2, 3, n_k, 4)), rng.normal(size=(2, 3, n_k, 6))
    for scale in (None, 0.3):
        ref = F.scaled_dot_product_attention(t64(q), t64(k), t64(v), scale=scale).numpy()
        np.testing.assert_allclose(attnlab.scaled_dot_product_attention(q, k, v, scale=scale), ref, rtol=1e-12)


@pytest.mark.parametrize("n_q, n_k", [(5, 5), (4, 6)])
def test_sdpa_is_causal_is_top_left(n_q, n_k):
    q, k, v = rng.normal(size=(1, 2, n_q, 4)), rng.normal(size=(1, 2, n_k, 4)), rng.normal(size=(1, 2, n_k, 4))
    ref = F.scaled_dot_product_attention(t64(q), t64(k), t64(v), is_causal=True).numpy()
    np.testing.assert_allclose(attnlab.scaled_dot_product_attention(q, k, v, causal="top_left"), ref, rtol=1e-12)


def test_sdpa_bool_mask_through_converter():
    q, k, v = rng.normal(size=(2, 2, 4, 3)), rng.normal(size=(2, 2, 6, 3)), rng.normal(size=(2, 2, 6, 5))
    m = rng.random((2, 1, 4, 6)) < 0.5
    m[..., 0] = True
    tm = torch.from_numpy(m)
    ref = F.scaled_dot_product_attention(t64(q), t64(k), t64(v), attn_mask=tm).numpy()
    got = attnlab.scaled_dot_product_attention(q, k, v, masks.from_torch_sdpa(tm).numpy())
    np.testing.assert_allclose(got, ref, rtol=1e-12)


def test_sdpa_float_mask_splits_into_mask_and_bias():
    q, k, v = rng.normal(size=(1, 2, 4, 3)), rng.normal(size=(1, 2, 5, 3)), rng.normal(size=(1, 2, 5, 3))
    block = rng.random((4, 5)) < 0.4
    block[:, 0] = False
    bias = rng.normal(size=(4, 5))
    additive = np.where(block, -np.inf, 0.0)
    ref = F.scaled_dot_product_attention(t64(q), t64(k), t64(v), attn_mask=t64(additive + bias)).numpy()
    got = attnlab.scaled_dot_product_attention(q, k, v, masks.from_torch_sdpa(t64(additive)).numpy(), bias=bias)
    np.testing.assert_allclose(got, ref, rtol=1e-12)


def test_torch_tensors_in_torch_tensors_out_with_autograd():
    q = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 5, 2, dtype=torch.float64, requires_grad=True)
    out = attnlab.scaled_dot_product_attention(q, k, v, causal="bottom_right")
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.from_numpy(masks.causal(3, 5, align="bottom_right")))
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_torch_low_precision_math_in_float32(dtype):
    q, k, v = (torch.randn(2, 4, 8).to(dtype) for _ in range(3))
    out = attnlab.scaled_dot_product_attention(q, k, v)
    assert out.dtype == dtype
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    torch.testing.assert_close(out.float(), ref.to(dtype).float(), rtol=0, atol=float(torch.finfo(dtype).eps) * 4)


def test_multihead_attention_mask_conventions():
    """nn.MultiheadAttention: True = blocked masks (key_padding_mask [B, n_k], attn_mask [B*h, n_q, n_k])."""
    B, h, n, d = 3, 2, 5, 8
    mha = torch.nn.MultiheadAttention(d, h, batch_first=True, dtype=torch.float64)
    x = torch.randn(B, n, d, dtype=torch.float64)
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    attn = torch.from_numpy(~masks.causal(n)).repeat(B * h, 1, 1)
    ref, ref_w = mha(x, x, x, key_padding_mask=kpm, attn_mask=attn, average_attn_weights=False)
    allowed = masks.from_torch_mha(key_padding_mask=kpm, attn_mask=attn, num_heads=h)
    assert tuple(allowed.shape) == (B, h, n, n)
    W = mha.in_proj_weight.detach().numpy()
    b = mha.in_proj_bias.detach().numpy()
    xn = x.numpy()
    qkv = xn @ W.T + b  # [B, n, 3d]

    def heads(t):
        return t.reshape(B, n, h, d // h).transpose(0, 2, 1, 3)  # [B, h, n, d/h]

    q, k, v = (heads(qkv[..., i * d : (i + 1) * d]) for i in range(3))
    t = attnlab.attention_trace(q, k, v, allowed.numpy())
    np.testing.assert_allclose(t.weights, ref_w.detach().numpy(), rtol=1e-10, atol=1e-12)
    merged = t.output.transpose(0, 2, 1, 3).reshape(B, n, d)
    out = merged @ mha.out_proj.weight.detach().numpy().T + mha.out_proj.bias.detach().numpy()
    np.testing.assert_allclose(out, ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    # float (additive) key_padding_mask gives the same mask
    kpm_float = torch.where(kpm, float("-inf"), 0.0).double()
    same = masks.from_torch_mha(key_padding_mask=kpm_float, attn_mask=attn, num_heads=h)
    assert torch.equal(same, allowed)
