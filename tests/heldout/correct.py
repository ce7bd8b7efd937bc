"""Correct implementations: the checker must find nothing in any of them (with the declarations each documents)."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from einops import einsum

from . import Case

TF = "transformers 5.24.0 (PyPI), "


# ----------------------------------------------------------------------------------------- styles of plain code
class NumpyKeepAttention:
    """A callable class over NumPy with an int keep-mask (1 = keep, 0 = masked); fully masked rows are zeros.

    Written from the definition softmax(QK^T / sqrt(d_k)) V (Vaswani et al. 2017, eq. 1), in the style of
    d2l-ai/d2l-en d2l/mxnet.py ``masked_softmax`` (NumPy arrays, a keep mask)."""

    def __call__(self, q, k, v, mask=None):
        s = (q @ np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = np.where(mask == 1, s, -np.inf)
        m = np.max(s, axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        e = np.exp(s - m)
        z = e.sum(axis=-1, keepdims=True)
        return (e / np.where(z == 0, 1, z)) @ v


def lucidrains_einops(q, k, v, mask=None):
    """lucidrains' einops attention (lucidrains/x-transformers x_transformers/attend.py ``Attend.forward``, the
    non-flash path, v2.31.10 from PyPI): einsum over named axes, masked_fill with ``-finfo(dtype).max``."""
    scale = q.shape[-1] ** -0.5
    sim = einsum(q, k, "b h i d, b h j d -> b h i j") * scale
    if mask is not None:
        sim = sim.masked_fill(~mask, -torch.finfo(sim.dtype).max)
    attn = sim.softmax(dim=-1)
    return einsum(attn, v, "b h i j, b h j d -> b h i d")


def hf_additive_per_batch(q, k, v, attention_mask=None):
    """A Hugging Face 4-D additive mask ``[B, 1, n_q, n_k]`` (0 or finfo.min), added to the scores as
    transformers 5.24.0 models/llama/modeling_llama.py ``eager_attention_forward`` does (without its float32
    softmax upcast)."""
    w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.shape[-1])
    if attention_mask is not None:
        w = w + attention_mask
    return torch.matmul(torch.softmax(w, dim=-1), v)


def d2l_valid_lens_fixed(q, k, v, valid_lens=None):
    """d2l-ai/d2l-en d2l/torch.py ``masked_softmax`` + ``DotProductAttention`` + ``MultiHeadAttention``'s
    ``repeat_interleave`` of ``valid_lens`` (commit 23d7a5aecceee57d1292c56e90cce307f183bb0a), with the -1e6 fill
    replaced by ``-inf`` and sequences of length 0 given zeros (so it is exact at any score magnitude)."""
    b, h, n_q, d = q.shape
    qs, ks, vs = (x.reshape(b * h, x.shape[2], x.shape[3]) for x in (q, k, v))
    scores = torch.bmm(qs, ks.transpose(1, 2)) / math.sqrt(d)
    if valid_lens is None:
        w = F.softmax(scores, dim=-1)
    else:
        lens = torch.repeat_interleave(valid_lens, repeats=h, dim=0)
        keep = torch.arange(scores.shape[-1], device=q.device)[None, None, :] < lens[:, None, None]
        w = F.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
        w = torch.where(keep.any(dim=-1, keepdim=True), w, torch.zeros_like(w))
    return torch.bmm(w, vs).reshape(b, h, n_q, v.shape[-1])


def varlen_loop_sdpa(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, softmax_scale=None):
    """Packed variable-length attention, one sequence at a time through ``F.scaled_dot_product_attention``: the
    semantics of Dao-AILab/flash-attention flash_attn/flash_attn_interface.py ``flash_attn_varlen_func`` (commit
    0251105a2fb19d2957484b7f023cd8c115286ced: ``causal`` aligned bottom-right, a query with no key returns 0)."""
    out = q.new_zeros(q.shape[0], q.shape[1], v.shape[-1])
    for i in range(len(cu_seqlens_q) - 1):
        sq, eq, sk, ek = (int(x) for x in (cu_seqlens_q[i], cu_seqlens_q[i + 1], cu_seqlens_k[i], cu_seqlens_k[i + 1]))
        lq, lk = eq - sq, ek - sk
        if lq == 0 or lk == 0:
            continue
        qi, ki, vi = (t.transpose(0, 1)[None] for t in (q[sq:eq], k[sk:ek], v[sk:ek]))  # [1, h, L, d]
        if ki.shape[1] != qi.shape[1]:
            ki = ki.repeat_interleave(qi.shape[1] // ki.shape[1], dim=1)
            vi = vi.repeat_interleave(qi.shape[1] // vi.shape[1], dim=1)
        keep = None
        if causal:
            keep = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
        o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=keep, scale=softmax_scale)
        if keep is not None:
            o = torch.where(keep.any(-1)[None, None, :, None], o, torch.zeros_like(o))
        out[sq:eq] = o[0].transpose(0, 1)
    return out


def kvcache_decode_loop(q, k_cache, v_cache, cache_seqlens=None, causal=False, softmax_scale=None):
    """A decode step against a KV cache with per-sequence lengths, one sequence at a time: the semantics of
    Dao-AILab/flash-attention flash_attn/flash_attn_interface.py ``flash_attn_with_kvcache`` (commit
    0251105a2fb19d2957484b7f023cd8c115286ced): ``q [B, n_q, h, d]``, caches ``[B, n_cache, h_kv, d]``, only the
    first ``cache_seqlens[b]`` entries valid, the n_q queries the last positions (causal bottom-right)."""
    b, n_q, h, d = q.shape
    scale = 1 / math.sqrt(d) if softmax_scale is None else softmax_scale
    outs = []
    for i in range(b):
        length = k_cache.shape[1] if cache_seqlens is None else int(cache_seqlens[i])
        kk = k_cache[i, :length].transpose(0, 1)  # [h_kv, L, d]
        vv = v_cache[i, :length].transpose(0, 1)
        kk = kk.repeat_interleave(h // kk.shape[0], dim=0)
        vv = vv.repeat_interleave(h // vv.shape[0], dim=0)
        s = (q[i].transpose(0, 1) @ kk.transpose(-1, -2)) * scale  # [h, n_q, L]
        if causal:
            row = torch.arange(n_q)[:, None]
            col = torch.arange(length)[None, :]
            s = s.masked_fill(col > length - n_q + row, float("-inf"))
        p = torch.softmax(s, dim=-1)
        p = torch.where(torch.isinf(s).all(-1, keepdim=True), torch.zeros_like(p), p)
        outs.append((p @ vv).transpose(0, 1))  # [n_q, h, d_v]
    return torch.stack(outs)


def jax_dpa():
    import jax

    return jax.jit(jax.nn.dot_product_attention, static_argnames=("is_causal", "scale"))


def _llama(impl):
    import transformers
    from transformers.models.llama.modeling_llama import LlamaAttention

    cfg = transformers.LlamaConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, attn_implementation=impl
    )
    return LlamaAttention(cfg, layer_idx=0)


def _bert():
    import transformers
    from transformers.models.bert.modeling_bert import BertSelfAttention

    cfg = transformers.BertConfig(hidden_size=32, num_attention_heads=4, attn_implementation="eager")
    return BertSelfAttention(cfg).eval()


def _eager():
    from transformers.models.llama.modeling_llama import eager_attention_forward

    return eager_attention_forward


def _attend():
    from x_transformers.attend import Attend

    return Attend()


def _nanogpt_manual():
    from zoo.layers import CausalSelfAttention, GPTConfig

    layer = CausalSelfAttention(GPTConfig(n_embd=32, n_head=4, block_size=64))
    layer.flash = False
    layer.register_buffer("bias", torch.tril(torch.ones(64, 64)).view(1, 1, 64, 64))
    return layer


def _mingpt():
    from .buggy_modules import MinGPTCausalSelfAttention, MinGPTConfig

    return MinGPTCausalSelfAttention(MinGPTConfig(n_embd=32, n_head=4, block_size=64))


def _timm(fused):
    from zoo.layers import TimmAttention

    return TimmAttention(32, 4, fused_attn=fused)


def _refs():
    from zoo import references

    return references


FA = "Dao-AILab/flash-attention tests/test_flash_attn.py attention_ref, commit 0251105a2fb19d2957484b7f023cd8c115286ced"
XF = (
    "facebookresearch/xformers xformers/attn_bias_utils.py ref_attention, "
    "commit ce4f89d54286ab07b90d0a230561e338eb70bff2"
)

CASES = [
    Case(
        "ok-torch-sdpa",
        F.scaled_dot_product_attention,
        {"gqa": True},
        source="torch 2.13 torch.nn.functional.scaled_dot_product_attention (default backend), enable_gqa",
    ),
    Case(
        "ok-torch-sdpa-partial",
        functools.partial(F.scaled_dot_product_attention, dropout_p=0.0),
        {"dtypes": ("float64", "float32")},
        source="functools.partial of torch 2.13 F.scaled_dot_product_attention (a partial as users bind dropout)",
    ),
    Case(
        "ok-sdpa-block-convention-lambda",
        lambda q, k, v, attn_mask=None, is_causal=False: F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if attn_mask is None else ~attn_mask, is_causal=is_causal
        ),
        {"mask_convention": "block", "dtypes": ("float64", "float32")},
        source="a lambda taking nn.MultiheadAttention's boolean convention (True = blocked, torch docs of "
        "MultiheadAttention.forward attn_mask) and inverting it for SDPA (True = attend)",
    ),
    Case(
        "ok-nn-multihead-attention",
        torch.nn.MultiheadAttention(16, 2, batch_first=True),
        {"dtypes": ("float64", "float32")},
        source="torch 2.13 torch.nn.MultiheadAttention (module mode, need_weights=False: zeros on fully masked "
        "rows; with need_weights=True they are NaN, pytorch/pytorch#160064)",
    ),
    Case(
        "ok-jax-dot-product-attention",
        jax_dpa(),
        {"layout": "bnhd", "gqa": True, "dtypes": ("float32",)},
        source="jax 0.10.2 jax.nn.dot_product_attention under jax.jit ([B, n, h, d], GQA)",
    ),
    Case(
        "ok-hf-eager-attention-forward",
        _eager(),
        {"dtypes": ("float64", "float32")},
        source=TF + "models/llama/modeling_llama.py eager_attention_forward (the real function)",
    ),
    Case(
        "ok-hf-llama-attention-eager",
        _llama("eager"),
        {"dtypes": ("float64", "float32")},
        source=TF + "LlamaAttention (eager, GQA 4/2 heads, rotary position_embeddings) in module mode",
    ),
    Case(
        "ok-hf-llama-attention-sdpa",
        _llama("sdpa"),
        {"dtypes": ("float64", "float32")},
        source=TF + "LlamaAttention (sdpa, GQA 4/2 heads) in module mode",
    ),
    Case(
        "ok-hf-bert-self-attention",
        _bert(),
        {"dtypes": ("float64", "float32")},
        source=TF + "models/bert/modeling_bert.py BertSelfAttention (eager, eval mode) in module mode",
    ),
    Case(
        "ok-x-transformers-attend",
        _attend(),
        {"gqa": "tile", "dtypes": ("float64", "float32")},
        source="x-transformers 2.31.10 (PyPI) x_transformers/attend.py Attend(); its GQA is "
        "repeat('b kvh n d -> b (r kvh) n d'): K/V head i % h_kv, declared gqa='tile'",
    ),
    Case(
        "ok-lucidrains-einops",
        lucidrains_einops,
        {"dtypes": ("float64", "float32")},
        source="x-transformers 2.31.10 x_transformers/attend.py Attend.forward non-flash path, transcribed as a "
        "function with einops.einsum",
    ),
    Case(
        "ok-key-padding-block-sdpa",
        lambda q, k, v, key_padding_mask=None: F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        ),
        {"mask_convention": "block", "dtypes": ("float64", "float32")},
        source="nn.MultiheadAttention's key_padding_mask convention (True = padding, torch docs) turned into an "
        "SDPA mask [B, 1, 1, n_k] in a lambda",
    ),
    Case(
        "ok-flash-attn-attention-ref-key-padding",
        lambda q, k, v, key_padding_mask=None: _refs().attention_ref(q, k, v, key_padding_mask=key_padding_mask),
        {"layout": "bnhd", "gqa": True, "masked_rows": "nan", "dtypes": ("float64", "float32")},
        source=FA + " (tests/zoo/references.py), called with key_padding_mask [B, n_k] (no causal: with padding its "
        "causal diagonal follows each sequence's valid length, which the key-padding form does not express); "
        "upcast=True computes float64 in float32 (documented); a sequence with no valid key is NaN (only local "
        "windows are zero-filled, its comment says), declared masked_rows='nan'",
    ),
    Case(
        "ok-xformers-ref-attention",
        lambda q, k, v, attn_bias=None: _refs().ref_attention(q, k, v, attn_bias=attn_bias),
        {"layout": "bnhd", "mask_convention": "additive", "dtypes": ("float64", "float32")},
        source=XF + " (tests/zoo/references.py) with an additive attn_bias [B, h, n_q, n_k]",
    ),
    Case(
        "ok-nanogpt-manual",
        _nanogpt_manual(),
        {"dtypes": ("float64", "float32")},
        source="karpathy/nanoGPT model.py CausalSelfAttention, manual path (tests/zoo/layers.py), commit "
        "3adf61e154c3fe3fca428ad6bc3818b27a3b8291",
    ),
    Case(
        "ok-mingpt",
        _mingpt(),
        {"dtypes": ("float64", "float32")},
        source="karpathy/minGPT mingpt/model.py CausalSelfAttention, commit 37baab71b9abea1b76ab957409a1cc2fbfba8a26",
    ),
    Case(
        "ok-timm-attention-fused",
        _timm(True),
        {"dtypes": ("float64", "float32")},
        source="huggingface/pytorch-image-models timm/layers/attention.py Attention (fused SDPA path), commit "
        "aa4b5850c1543fa488abf260f18390eda46cf85d (tests/zoo/layers.py)",
    ),
    Case(
        "ok-timm-attention-manual",
        _timm(False),
        {"masked_rows": "nan", "dtypes": ("float64", "float32")},
        source="huggingface/pytorch-image-models timm/layers/attention.py Attention (manual path: -inf bias, NaN "
        "on fully masked rows as SDPA's math semantics; declared masked_rows='nan'), commit "
        "aa4b5850c1543fa488abf260f18390eda46cf85d",
    ),
    Case(
        "ok-numpy-keep-class",
        NumpyKeepAttention(),
        {"mask_convention": "keep"},
        source="definition (Vaswani et al. 2017 eq. 1) in the style of d2l-ai/d2l-en d2l/mxnet.py masked_softmax",
    ),
    Case(
        "ok-hf-additive-per-batch",
        hf_additive_per_batch,
        {"mask_form": "batch", "mask_convention": "additive", "dtypes": ("float64", "float32")},
        source=TF + "eager_attention_forward's mask handling, as a plain function with a 4-D additive mask",
    ),
    Case(
        "ok-d2l-valid-lens",
        d2l_valid_lens_fixed,
        {"mask_form": "valid_lens", "dtypes": ("float64", "float32")},
        source="d2l-ai/d2l-en d2l/torch.py masked_softmax/DotProductAttention/MultiHeadAttention, commit "
        "23d7a5aecceee57d1292c56e90cce307f183bb0a, fill -1e6 replaced by -inf (exact)",
    ),
    Case(
        "ok-varlen-loop",
        varlen_loop_sdpa,
        {"mask_form": "varlen", "gqa": True, "causal_align": "bottom_right", "dtypes": ("float64", "float32")},
        source="flash_attn_varlen_func semantics (Dao-AILab/flash-attention flash_attn/flash_attn_interface.py, "
        "commit 0251105a2fb19d2957484b7f023cd8c115286ced) through a per-sequence SDPA loop",
    ),
    Case(
        "ok-kvcache-decode",
        kvcache_decode_loop,
        {"mask_form": "kv_cache", "layout": "bnhd", "gqa": True, "causal_align": "bottom_right"},
        source="flash_attn_with_kvcache semantics (Dao-AILab/flash-attention flash_attn/flash_attn_interface.py, "
        "commit 0251105a2fb19d2957484b7f023cd8c115286ced), per-sequence loop",
    ),
]
