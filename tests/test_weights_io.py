"""Weight import/export: torch nn.MultiheadAttention both ways (parity within 1e-6 float32), BERT and Llama names."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_multihead import random_weights

from attnlab import masks, weights_io
from attnlab.core.multihead import multi_head_attention
from attnlab.errors import OptionError, ShapeError


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
    r = multi_head_attention(x.numpy(), None, w, mask)
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
    r = multi_head_attention(x_q.numpy(), x_kv.numpy(), w, mask.numpy())
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
    r = multi_head_attention(x_q, x_kv, w, mask)
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
    with pytest.raises(OptionError, match="num_heads: required with a state dict"):
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


# ---------------------------------------------------------------------------------------------------------------
# GQA, MQA, any head width: to_torch_attention (and expand_kv for nn.MultiheadAttention)

LAYOUTS = {  # name: (d_model, num_heads, num_kv_heads, head_dim, d_kv)
    "mha": (16, 4, 4, None, None),
    "gqa": (16, 4, 2, None, None),
    "mqa": (12, 6, 1, None, None),
    "head_width": (10, 4, 2, 3, None),  # 4 * 3 != 10
    "wide_heads": (8, 2, 1, 7, None),  # 2 * 7 > 8
    "cross_gqa": (8, 4, 2, 5, 6),
}


def _bool_mask(rng, b, n_q, n_k):
    m = rng.random((b, 1, n_q, n_k)) < 0.7
    m[..., 0] = True  # no empty row
    return m


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("bias", [True, False])
def test_to_torch_attention_equals_attnlab(layout, bias):
    d_model, h, h_kv, d, d_kv = LAYOUTS[layout]
    rng = np.random.default_rng(len(layout))
    w = random_weights(rng, d_model, h, h_kv, d=d, d_kv=d_kv, bias=bias)
    m = weights_io.to_torch_attention(w)
    assert not m.training and m.q_proj.weight.dtype == torch.float64
    assert (m.num_heads, m.num_kv_heads, m.head_dim) == (w.num_heads, w.num_kv_heads, w.head_dim)
    x_q = rng.standard_normal((2, 5, d_model))
    x_kv = None if d_kv is None else rng.standard_normal((2, 7, d_kv))
    n_k = 5 if x_kv is None else 7
    mask = _bool_mask(rng, 2, 5, n_k)
    ours = multi_head_attention(x_q, x_kv, w, mask).output
    with torch.no_grad():
        kv = None if x_kv is None else torch.from_numpy(x_kv)
        theirs = m(torch.from_numpy(x_q), kv, torch.from_numpy(mask)).numpy()
        if x_kv is None:
            causal = m(torch.from_numpy(x_q), is_causal=True).numpy()
            np.testing.assert_allclose(causal, multi_head_attention(x_q, None, w, causal=True).output, atol=1e-12)
    np.testing.assert_allclose(theirs, ours, atol=1e-12, rtol=0)
    back = weights_io.from_torch_attention(m)
    assert (back.num_heads, back.num_kv_heads, back.head_dim) == (w.num_heads, w.num_kv_heads, w.head_dim)
    assert set(back.arrays()) == set(w.arrays())
    for name, a in w.arrays().items():
        np.testing.assert_array_equal(getattr(back, name), a)  # exact: a copy, transposed twice


def test_to_torch_attention_loads_into_hf_llama_attention():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    rng = np.random.default_rng(0)
    w = random_weights(rng, 16, 4, 2, d=6)  # GQA, 4 * 6 != 16, all four biases
    cfg = LlamaConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=6, attention_bias=True)
    cfg._attn_implementation = "sdpa"  # eager's softmax runs in float32 even for float64 inputs
    att = LlamaAttention(cfg, layer_idx=0).to(torch.float64).eval()
    att.load_state_dict(weights_io.to_torch_attention(w).state_dict())  # strict: every name and shape fits
    x = rng.standard_normal((2, 5, 16))
    no_rope = (torch.ones(2, 5, 6, dtype=torch.float64), torch.zeros(2, 5, 6, dtype=torch.float64))
    with torch.no_grad():
        out, _ = att(torch.from_numpy(x), position_embeddings=no_rope, attention_mask=None)  # causal
    np.testing.assert_allclose(out.numpy(), multi_head_attention(x, None, w, causal=True).output, atol=1e-12)
    back = weights_io.from_torch_attention(att)  # heads from its config
    for name, a in w.arrays().items():
        np.testing.assert_array_equal(getattr(back, name), a)
    half = weights_io.from_torch_attention(att.to(torch.bfloat16))
    assert half.w_q.dtype == np.float32 and half.num_kv_heads == 2  # bfloat16 comes back as float32


def test_to_torch_attention_dtype_and_state_dict_import():
    rng = np.random.default_rng(1)
    w = random_weights(rng, 8, 4, 1, d=3, bias=False).astype(np.float32)
    m = weights_io.to_torch_attention(w)
    assert m.q_proj.weight.dtype == torch.float32 and m.q_proj.bias is None
    assert weights_io.to_torch_attention(w, dtype=torch.float64).o_proj.weight.dtype == torch.float64
    sd = {"attn." + k: v for k, v in m.state_dict().items()}
    back = weights_io.from_torch_attention(sd, num_heads=4, prefix="attn.")  # head_dim and kv heads from the shapes
    assert (back.num_kv_heads, back.head_dim, back.b_q) == (1, 3, None)
    np.testing.assert_array_equal(back.w_k, w.w_k)


@pytest.mark.parametrize(("h_kv", "bias"), [(2, True), (1, False)])
def test_to_torch_mha_expand_kv_is_the_equivalent_mha(h_kv, bias):
    rng = np.random.default_rng(4)
    w = random_weights(rng, 16, 4, h_kv, bias=bias)
    sd = weights_io.to_torch_mha(w, expand_kv=True)
    mha = torch.nn.MultiheadAttention(16, 4, bias=bias, batch_first=True, dtype=torch.float64)
    mha.load_state_dict(sd)
    x = rng.standard_normal((2, 5, 16))
    mask = _bool_mask(rng, 1, 5, 5)[0, 0]
    with torch.no_grad():
        t = torch.from_numpy(x)
        out, _ = mha(t, t, t, attn_mask=torch.from_numpy(~mask), need_weights=False)  # torch: True = blocked
    np.testing.assert_allclose(out.numpy(), multi_head_attention(x, None, w, mask).output, atol=1e-12)
    wide = weights_io.from_torch_mha(sd, num_heads=4)  # an MHA layer now: each kv head's columns repeated
    np.testing.assert_array_equal(wide.w_k[:, :4], w.w_k[:, :4])
    np.testing.assert_array_equal(wide.w_k.reshape(16, h_kv, 4 // h_kv, 4)[:, :, 1], w.w_k.reshape(16, h_kv, 4))


def test_exporters_refuse_only_what_the_target_cannot_hold():
    rng = np.random.default_rng(5)
    gqa, narrow = random_weights(rng, 8, 4, 2), random_weights(rng, 10, 4, 2, d=3)
    cross = random_weights(rng, 8, 2, d_kv=5)
    with pytest.raises(ShapeError, match=r"pass expand_kv=True .* or use weights_io\.to_torch_attention"):
        weights_io.to_torch_mha(gqa)
    with pytest.raises(ShapeError, match=r"num_heads \* head_dim = 12 != d_model=10.*weights_io\.to_torch_attention"):
        weights_io.to_torch_mha(narrow, expand_kv=True)
    with pytest.raises(ShapeError, match=r"num_kv_heads=2 != num_heads=4 \(BERT has no GQA\).*weights_io\.to_llama"):
        weights_io.to_bert(gqa, 0)
    with pytest.raises(ShapeError, match=r"d_kv=5 != d_model=8 \(cross attention\).*to_torch_attention"):
        weights_io.to_llama(cross, 0)
    # what the targets can hold goes through
    assert weights_io.to_llama(narrow, 0)["model.layers.0.self_attn.q_proj.weight"].shape == (12, 10)
    assert "in_proj_weight" not in weights_io.to_torch_mha(cross)  # kdim != embed_dim: separate q/k/v
    with pytest.raises(ShapeError, match=r"nn\.MultiheadAttention's layout; use weights_io\.from_torch_mha"):
        weights_io.from_torch_attention(torch.nn.MultiheadAttention(8, 2))
    with pytest.raises(ShapeError, match=r"not nn\.MultiheadAttention's; use weights_io\.from_torch_attention"):
        weights_io.from_torch_mha(weights_io.to_torch_attention(gqa).state_dict(), num_heads=4)
    with pytest.raises(OptionError, match=r"num_heads: required with a state dict"):
        weights_io.from_torch_attention({"q_proj.weight": np.zeros((4, 4))})
