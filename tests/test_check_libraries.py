"""Correct public libraries, as installed, checked forward **and** backward with default options (or only the
interface facts a user would state): clean, or a finding shown real against float64 (issue 20's acceptance).

Each test is one library; the real findings are each reproduced here on the library itself, with the float64
value it should have. flex_attention is tests/test_check_flex*.py's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnlab
from attnlab.checker import check


def _clean(r):
    assert r.ok, r.to_text()
    assert {p.name: p.status for p in r.probes}["grad-reference"] == "passed", r.to_text()  # gradients checked
    return r


def _untested(r):
    return {u.capability for u in r.unsupported}


def _under(backend):
    def sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
            )

    sdpa.__name__ = f"sdpa_{backend.name.lower()}"
    return sdpa


# ------------------------------------------------------------------------------------------------ PyTorch SDPA
@pytest.mark.parametrize(
    "backend", [None, SDPBackend.MATH, SDPBackend.FLASH_ATTENTION], ids=["default", "math", "flash"]
)
def test_sdpa_under_each_cpu_backend_is_clean_forward_and_backward(backend):
    fn = F.scaled_dot_product_attention if backend is None else _under(backend)
    r = _clean(check(fn, gqa=True, backward=True))
    if backend is SDPBackend.FLASH_ATTENTION:
        # the flash kernel takes 4-D inputs with d_v = d_k only: it raises "No available kernel" after warning
        # why, and the warning makes the refusal clean (no declaration needed)
        assert {"dv", "rank"} <= _untested(r)
        assert "4 dimensional" in next(u.reason for u in r.unsupported if u.capability == "rank")
    else:
        assert "dv" not in _untested(r) and "gqa" not in _untested(r)


def _finfo_min_row(dtype=torch.float64):
    """q [1, 1, 3, 4], k, v [1, 1, 4, 4] and an additive mask whose row 1 is finfo(float32).min on every key (the
    mask Hugging Face builds), with an upstream gradient on that row only."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 4, generator=g, dtype=dtype, requires_grad=True) for n in (3, 4, 4))
    mask = torch.zeros(1, 1, 3, 4, dtype=dtype)
    mask[..., 1, :] = torch.finfo(torch.float32).min
    d_out = torch.zeros(1, 1, 3, 4, dtype=dtype)
    d_out[..., 1, :] = 1.0
    return q, k, v, mask, d_out


def test_sdpa_flash_backward_of_a_finfo_min_row_is_n_k_times_its_forward_real_against_float64():
    """What the Hugging Face sdpa paths below are found to do, shown on SDPA itself: the row's forward is the
    uniform average of V (d out / d v_j = 1/n_k in float64), the CPU flash backward gives 1 per key (n_k times)."""
    n_k = 4
    for dtype in (torch.float64, torch.float32):
        q, k, v, mask, d_out = _finfo_min_row(dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # the default backend: flash on CPU
        assert torch.allclose(out[0, 0, 1], v[0, 0].mean(0))  # the forward: uniform
        (dv,) = torch.autograd.grad(out, (v,), d_out)
        assert torch.equal(dv[0, 0, :, 0], torch.ones(n_k, dtype=dtype))  # n_k times 1/n_k
        with sdpa_kernel(SDPBackend.MATH):
            (dv_math,) = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), (v,), d_out)
        np.testing.assert_allclose(dv_math[0, 0, :, 0].detach().numpy(), 1 / n_k)  # the float64 value


# ------------------------------------------------------------------------------------------------ nn.MultiheadAttention
def test_multihead_attention_is_clean_forward_and_backward_and_its_default_nan_row_is_real():
    layer = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    r = _clean(check(layer, backward=True))  # module mode calls it with need_weights=False (the SDPA path)
    assert "need_weights=False" in r.mode and "NaN (pytorch/pytorch#41508)" in r.mode
    # with need_weights=True, its default, a query with every key masked is NaN (pytorch/pytorch#41508), where
    # float64 attention gives a number
    x = torch.randn(1, 3, 16, dtype=torch.float64)
    blocked = torch.zeros(3, 3, dtype=torch.bool)
    blocked[1] = True
    out, _ = layer.double()(x, x, x, attn_mask=blocked)
    assert torch.isnan(out[0, 1]).all() and torch.isfinite(out[0, [0, 2]]).all()
    with torch.no_grad():
        w_in, w_out = layer.in_proj_weight.numpy(), layer.out_proj.weight.numpy()
        b_in, b_out = layer.in_proj_bias.numpy(), layer.out_proj.bias.numpy()
    qkv = x[0].numpy() @ w_in.T + b_in
    heads = [qkv[:, i * 16 : (i + 1) * 16].reshape(3, 2, 8).transpose(1, 0, 2) for i in range(3)]
    ref = attnlab.scaled_dot_product_attention(*heads, ~blocked.numpy(), masked_rows="zero")
    assert np.isfinite(ref.transpose(1, 0, 2).reshape(3, 16) @ w_out.T + b_out).all()


# ------------------------------------------------------------------------------------------------ Hugging Face
def _llama(impl):
    import transformers
    from transformers.models.llama.modeling_llama import LlamaAttention

    cfg = transformers.LlamaConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, attn_implementation=impl
    )
    return LlamaAttention(cfg, layer_idx=0)


def _gpt2(impl):
    import transformers
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    return GPT2Attention(transformers.GPT2Config(n_embd=32, n_head=4, attn_implementation=impl), layer_idx=0).eval()


def _bert(impl, block):
    import transformers
    from transformers.models.bert.modeling_bert import BertAttention, BertSelfAttention

    cfg = transformers.BertConfig(hidden_size=32, num_attention_heads=4, attn_implementation=impl)
    return (BertAttention if block else BertSelfAttention)(cfg).eval()  # eval(): dropout 0.1 in training


LAYERS = {
    "LlamaAttention": _llama,
    "GPT2Attention": _gpt2,
    "BertSelfAttention": lambda impl: _bert(impl, False),
    "BertAttention": lambda impl: _bert(impl, True),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_hugging_face_eager_layers_are_clean_forward_and_backward(name):
    r = _clean(check(LAYERS[name]("eager"), backward=True))
    assert name in r.mode and "mask" not in _untested(r)
    if name == "LlamaAttention":  # float32 softmax: float64 outputs and gradients judged under float32's rule
        assert "gqa" not in _untested(r) and "lower-precision" in {n.code for n in r.notes}
    assert "masked-row-additive" in {n.code for n in r.notes}  # the finfo.min rows' gradients, as the forward


@pytest.mark.parametrize("name", list(LAYERS))
def test_hugging_face_sdpa_layers_have_only_the_flash_backwards_finfo_min_row(name):
    r = check(LAYERS[name]("sdpa"), backward=True)
    assert r.codes == ("grad-masked-row",), r.to_text()  # real: see the SDPA test above
    assert "(n_k) times those of the forward's uniform weights" in r.findings[0].message
    assert {p.name: p.status for p in r.probes}["grad-reference"] == "passed"


def test_hugging_face_eager_attention_function_is_clean_forward_and_backward():
    from transformers.models.llama.modeling_llama import eager_attention_forward

    r = _clean(check(eager_attention_forward, backward=True))
    assert "gqa" not in _untested(r) and "scale" not in _untested(r)


def test_hugging_face_sdpa_attention_function_has_only_the_flash_backwards_finfo_min_row():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    r = check(sdpa_attention_forward, backward=True)
    assert r.codes == ("grad-masked-row",), r.to_text()
    assert "(n_k) times those of the forward's uniform weights" in r.findings[0].message
    # real, through the function itself (float64 inputs, the additive mask it is given)
    q, k, v, mask, d_out = _finfo_min_row()
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 1, False
    out, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.5, dropout=0.0)  # [B, n, h, d]
    (dv,) = torch.autograd.grad(out, (v,), d_out.transpose(1, 2))
    assert torch.equal(dv[0, 0, :, 0], torch.ones(4, dtype=torch.float64))  # float64's is 1/4


# ------------------------------------------------------------------------------------------------ x-transformers
def test_x_transformers_attend_has_only_a_nan_gradient_of_a_fully_masked_row_in_float64():
    from x_transformers.attend import Attend

    r = check(Attend(), backward=True)
    assert r.codes == ("grad-masked-row",), r.to_text()
    assert "NaN/inf gradients (dv)" in r.findings[0].message
    assert {p.name: p.status for p in r.probes}["grad-reference"] == "passed"  # bias included
    assert "bias" not in _untested(r)
    # real: the row is filled with -finfo(float64).max, which the float32 softmax makes -inf (NaN weights); the
    # output row is then set to 0, so its gradient is 0 in float64 arithmetic, but dv = weights^T d_out is NaN
    for dtype, finite in ((torch.float64, False), (torch.float32, True)):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 1, 3, 4, generator=g, dtype=dtype, requires_grad=True) for _ in range(3))
        mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
        mask[..., 1, :] = False
        out, _ = Attend()(q, k, v, mask=mask)
        assert torch.equal(out[0, 0, 1], torch.zeros(4, dtype=dtype))
        (dv,) = torch.autograd.grad(out, (v,), torch.ones_like(out))
        assert bool(torch.isfinite(dv).all()) is finite
    trace = attnlab.attention_trace(*(x.detach().double().numpy() for x in (q, k, v)), mask.numpy(), masked_rows="zero")
    assert np.isfinite(attnlab.attention_backward(trace, np.ones((1, 1, 3, 4))).dv).all()  # float64's is finite


# ------------------------------------------------------------------------------------------------ JAX
def test_jax_dot_product_attention_is_clean_forward_and_backward():
    import jax

    fn = jax.jit(jax.nn.dot_product_attention, static_argnames=("is_causal", "scale"))
    # float32 only: float64 needs jax_enable_x64, float16 is refused by XLA on CPU (F16_F16_F32 dot), and every
    # further dtype costs a compilation per shape, forward and gradient
    r = _clean(check(fn, layout="bnhd", gqa=True, dtypes=("float32",), backward=True))
    assert r.framework == "jax" and "gqa" not in _untested(r)


def test_jax_float16_is_a_clean_refusal_not_a_crash():
    import jax

    fn = jax.jit(jax.nn.dot_product_attention, static_argnames=("is_causal", "scale"))
    r = check(fn, layout="bnhd", dtypes=("float16",), probes=("reference",))
    assert r.findings == () and r.verdict == "incomplete", r.to_text()
    assert "F16_F16_F32" in next(u.reason for u in r.unsupported if u.capability == "float16")
