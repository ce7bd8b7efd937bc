"""Weight import/export: torch nn.MultiheadAttention both ways (parity within 1e-6 float32), BERT and Llama names."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_multihead import random_weights

from attnlab import masks
from attnlab.core import weights_io
from attnlab.core.multihead import multi_head_attention
from attnlab.errors import ShapeError


def _masks(rng, b, n_q, n_k):
    """A torch key_padding_mask (True = padding) and a float attn_mask (0 / -inf) that leave no row empty."""
    lengths = rng.integers(max(1, n_k - 3), n_k + 1, size=b)
    lengths[0] = n_k
    pad = np.arange(n_k)[None, :] >= lengths[:, None]  # [B, n_k] True = padding
    kpm = torch.from_numpy(np.where(pad, -np.inf, 0.0).astype(np.float32))  # additive, as the float attn_mask
    am = np.where(rng.random((n_q, n_k)) < 0.3, -np.inf, 0.0).astype(np.float32)
    am[:, 0] = 0.0  # key 0 is never padding, so no row is empty
    return kpm, torch.from_numpy(am)


def _torch_run(mha, x_q, x_kv, kpm, am):
    mha.eval()
    with torch.no_grad():
        out, w = mha(x_q, x_kv, x_kv, key_padding_mask=kpm, attn_mask=am, need_weights=True, average_attn_weights=False)
    return out.numpy(), w.numpy()


@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_mha_parity(bias):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    mha = torch.nn.MultiheadAttention(16, 4, bias=bias, batch_first=True)
    if bias:  # PyTorch initialises biases to 0; make them matter
        with torch.no_grad():
            mha.in_proj_bias.normal_()
            mha.out_proj.bias.normal_()
    x = torch.from_numpy(rng.standard_normal((3, 6, 16)).astype(np.float32))
    kpm, am = _masks(rng, 3, 6, 6)
    out_t, w_t = _torch_run(mha, x, x, kpm, am)

    w = weights_io.from_torch_mha(mha)
    assert w.w_q.dtype == np.float32 and w.num_heads == 4 and (w.b_q is None) == (not bias)
    mask = masks.from_torch_mha(key_padding_mask=kpm.numpy(), attn_mask=am.numpy())
    r = multi_head_attention(x.numpy(), None, w, mask, return_weights=True)
    np.testing.assert_allclose(r.output, out_t, atol=1e-6, rtol=0)
    np.testing.assert_allclose(r.weights, w_t, atol=1e-6, rtol=0)
    assert r.output.dtype == np.float32


def test_from_torch_mha_cross_attention_with_kdim():
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    mha = torch.nn.MultiheadAttention(8, 2, kdim=5, vdim=5, batch_first=True)
    with torch.no_grad():
        mha.in_proj_bias.normal_()
    x_q = torch.from_numpy(rng.standard_normal((2, 3, 8)).astype(np.float32))
    x_kv = torch.from_numpy(rng.standard_normal((2, 7, 5)).astype(np.float32))
    kpm, am = _masks(rng, 2, 3, 7)
    out_t, w_t = _torch_run(mha, x_q, x_kv, kpm, am)
    w = weights_io.from_torch_mha(mha.state_dict(), num_heads=2)
    mask = masks.from_torch_mha(key_padding_mask=kpm, attn_mask=am)  # torch tensors in, torch mask out
    assert isinstance(mask, torch.Tensor)
    r = multi_head_attention(x_q.numpy(), x_kv.numpy(), w, mask.numpy(), return_weights=True)
    np.testing.assert_allclose(r.output, out_t, atol=1e-6, rtol=0)
    np.testing.assert_allclose(r.weights, w_t, atol=1e-6, rtol=0)


@pytest.mark.parametrize("d_kv", [16, 7])
def test_to_torch_mha_parity(d_kv):
    rng = np.random.default_rng(2)
    w = random_weights(rng, 16, 4, d_kv=d_kv).astype(np.float32)
    sd = weights_io.to_torch_mha(w)
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True, kdim=d_kv, vdim=d_kv)
    mha.load_state_dict(sd)  # strict: every name and shape must fit
    x_q = rng.standard_normal((2, 5, 16)).astype(np.float32)
    x_kv = rng.standard_normal((2, 4, d_kv)).astype(np.float32)
    kpm, am = _masks(rng, 2, 5, 4)
    am_bool, kpm = torch.isinf(am), torch.isinf(kpm)  # the bool forms: True = blocked
    out_t, w_t = _torch_run(mha, torch.from_numpy(x_q), torch.from_numpy(x_kv), kpm, am_bool)
    mask = masks.from_torch_mha(key_padding_mask=kpm.numpy(), attn_mask=am_bool.numpy())
    r = multi_head_attention(x_q, x_kv, w, mask, return_weights=True)
    np.testing.assert_allclose(r.output, out_t, atol=1e-6, rtol=0)
    np.testing.assert_allclose(r.weights, w_t, atol=1e-6, rtol=0)
    back = weights_io.from_torch_mha(sd, num_heads=4)
    for name, a in w.arrays().items():
        np.testing.assert_array_equal(getattr(back, name), a)


def test_to_torch_mha_without_bias_and_errors():
    rng = np.random.default_rng(3)
    w = random_weights(rng, 8, 2, bias=False)
    sd = weights_io.to_torch_mha(w)
    assert set(sd) == {"in_proj_weight", "out_proj.weight"}
    torch.nn.MultiheadAttention(8, 2, bias=False).load_state_dict(sd)
    with pytest.raises(ShapeError, match=r"num_kv_heads=1 != num_heads=2; nn\.MultiheadAttention has no GQA"):
        weights_io.to_torch_mha(random_weights(rng, 8, 2, 1))
    with pytest.raises(ShapeError, match="num_heads \\* head_dim = 6 != d_model=8"):
        weights_io.to_torch_mha(random_weights(rng, 8, 2, d=3))
    with pytest.raises(ShapeError, match="num_heads: required with a state dict"):
        weights_io.from_torch_mha(sd)
    with pytest.raises(ShapeError, match="add_bias_kv"):
        weights_io.from_torch_mha(torch.nn.MultiheadAttention(8, 2, add_bias_kv=True))


def test_imported_weights_are_copies():
    mha = torch.nn.MultiheadAttention(8, 2)
    w = weights_io.from_torch_mha(mha)
    before = w.w_q.copy()
    with torch.no_grad():
        mha.in_proj_weight.add_(1.0)
    np.testing.assert_array_equal(w.w_q, before)


def test_bert_names_match_hf_bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30, hidden_size=12, num_hidden_layers=2, num_attention_heads=3, intermediate_size=8)
    model = BertModel(cfg).eval()
    sd = {"bert." + k: v for k, v in model.state_dict().items()}  # as inside BertForX: prefix found by itself
    w = weights_io.from_bert(sd, 1, num_heads=3)
    att = model.encoder.layer[1].attention
    x = torch.randn(2, 5, 12)
    with torch.no_grad():
        np.testing.assert_allclose(x.numpy() @ w.w_q + w.b_q, att.self.query(x).numpy(), atol=1e-6)
        np.testing.assert_allclose(x.numpy() @ w.w_k + w.b_k, att.self.key(x).numpy(), atol=1e-6)
        np.testing.assert_allclose(x.numpy() @ w.w_v + w.b_v, att.self.value(x).numpy(), atol=1e-6)
        np.testing.assert_allclose(x.numpy() @ w.w_o + w.b_o, att.output.dense(x).numpy(), atol=1e-6)
    out = weights_io.to_bert(w, 1, prefix="bert.")
    for k, v in out.items():
        np.testing.assert_array_equal(v, sd[k].numpy())
    with pytest.raises(ShapeError, match=r"no key ends with 'encoder\.layer\.7\.attention\.self\.query\.weight'"):
        weights_io.from_bert(sd, 7, num_heads=3)


def test_llama_names_match_hf_llama_gqa():
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=30,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=8,
        head_dim=6,
    )
    model = LlamaModel(cfg).eval()
    sd = {"model." + k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    w = weights_io.from_llama(sd, 1, num_heads=4, num_kv_heads=2, head_dim=6)
    assert w.w_q.shape == (16, 24) and w.w_k.shape == (16, 12) and w.w_o.shape == (24, 16)
    assert w.w_q.dtype == np.float32 and w.b_q is None
    att = model.layers[1].self_attn
    x = torch.randn(1, 3, 16)
    with torch.no_grad():
        for mine, theirs in ((w.w_q, att.q_proj), (w.w_k, att.k_proj), (w.w_v, att.v_proj)):
            ref = (x.to(torch.bfloat16).float() @ theirs.weight.to(torch.bfloat16).float().T).numpy()
            np.testing.assert_allclose(x.to(torch.bfloat16).float().numpy() @ mine, ref, atol=1e-5)
    out = weights_io.to_llama(w, 1)
    assert set(out) == {f"model.layers.1.self_attn.{n}_proj.weight" for n in "qkvo"}
    np.testing.assert_array_equal(
        out["model.layers.1.self_attn.k_proj.weight"], sd["model.layers.1.self_attn.k_proj.weight"].float().numpy()
    )


def test_llama_import_from_numpy_dict_with_biases():
    rng = np.random.default_rng(0)
    w = random_weights(rng, 8, 4, 2)
    sd = weights_io.to_llama(w, 0, prefix="")
    back = weights_io.from_llama(sd, 0, num_heads=4, num_kv_heads=2)
    for name, a in w.arrays().items():
        np.testing.assert_array_equal(getattr(back, name), a)
    with pytest.raises(ShapeError, match="num_kv_heads=3 must divide num_heads=4"):
        weights_io.from_llama(sd, 0, num_heads=4, num_kv_heads=3)
