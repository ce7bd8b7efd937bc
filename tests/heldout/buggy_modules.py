"""Buggy attention *layers* (torch nn.Modules checked in module mode, or called as ``layer(q, k, v)``): an
nn.MultiheadAttention subclass, Hugging Face Llama-style, nanoGPT/minGPT-style, timm-style and x-transformers'
Attend."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from . import Case

MINGPT = "karpathy/minGPT mingpt/model.py CausalSelfAttention, commit 37baab71b9abea1b76ab957409a1cc2fbfba8a26"
TIMM = (
    "huggingface/pytorch-image-models timm/layers/attention.py Attention, "
    "commit aa4b5850c1543fa488abf260f18390eda46cf85d"
)


# --------------------------------------------------------------------------------------------------- minGPT
@dataclass
class MinGPTConfig:
    n_embd: int = 32
    n_head: int = 4
    block_size: int = 64
    attn_pdrop: float = 0.0
    resid_pdrop: float = 0.0
    bias: bool = True
    dropout: float = 0.0


class MinGPTCausalSelfAttention(nn.Module):
    """minGPT's ``CausalSelfAttention`` (correct, transcribed; ``attn_pdrop``/``resid_pdrop`` read from the config
    with nanoGPT's ``dropout`` as the fallback the checker's config namespace carries)."""

    triangle = staticmethod(torch.tril)

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_dropout = nn.Dropout(getattr(config, "attn_pdrop", getattr(config, "dropout", 0.0)))
        self.resid_dropout = nn.Dropout(getattr(config, "resid_pdrop", getattr(config, "dropout", 0.0)))
        self.register_buffer(
            "bias",
            self.triangle(torch.ones(config.block_size, config.block_size)).view(
                1, 1, config.block_size, config.block_size
            ),
        )
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def scores(self, q, k):
        return (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = self.scores(q, k)
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MinGPTTriu(MinGPTCausalSelfAttention):
    """minGPT with its causal buffer built by ``torch.triu``: every query sees its future, not its past."""

    triangle = staticmethod(torch.triu)  # BUG: tril


class MinGPTNoScale(MinGPTCausalSelfAttention):
    """minGPT with the ``* (1.0 / math.sqrt(k.size(-1)))`` left out."""

    def scores(self, q, k):
        return q @ k.transpose(-2, -1)  # BUG


class MinGPTHeadsNotTransposedBack(MinGPTCausalSelfAttention):
    """minGPT re-assembling the heads with ``y.reshape(B, T, C)`` without the ``transpose(1, 2)``: positions and
    heads are interleaved (a common porting bug)."""

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = self.scores(q, k)
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        y = y.contiguous().view(B, T, C)  # BUG: y.transpose(1, 2) missing
        return self.c_proj(y)


# --------------------------------------------------------------------------------------------------- timm-style
class TimmManualInvertedMask(nn.Module):
    """timm's ``Attention`` manual path with a boolean ``attn_mask`` (True = attend) filled as if True = blocked."""

    def __init__(self, dim, num_heads=8, qkv_bias=False, attn_drop=0.0, **_):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = False
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = nn.Identity()
        self.k_norm = nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = nn.Identity()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, attn_mask=None, is_causal=False):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        if is_causal:
            attn = attn + attn.new_full((N, N), float("-inf")).triu_(1)
        elif attn_mask is not None:
            attn = attn.masked_fill(attn_mask, float("-inf"))  # BUG: ~attn_mask
        attn = attn.softmax(dim=-1)
        x = self.attn_drop(attn) @ v
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj(self.norm(x))


# --------------------------------------------------------------------------------------------------- nn.MHA subclass
class MHAManualScaleEmbedDim(nn.MultiheadAttention):
    """An ``nn.MultiheadAttention`` subclass with a hand-written forward (fairseq-style: in_proj chunks, heads in
    the batch dim ``[B*h, n, d]``) that scales by ``embed_dim ** -0.5`` instead of ``head_dim ** -0.5``."""

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None, **_):
        if not self.batch_first:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        b, n_q, e = query.shape
        n_k, h = key.shape[1], self.num_heads
        w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        b_q, b_k, b_v = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None, None, None)
        q = F.linear(query, w_q, b_q) * (self.embed_dim**-0.5)  # BUG: self.head_dim ** -0.5
        k, v = F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)
        q, k, v = (
            x.reshape(b, -1, h, self.head_dim).transpose(1, 2).reshape(b * h, -1, self.head_dim) for x in (q, k, v)
        )
        s = torch.bmm(q, k.transpose(1, 2))
        if attn_mask is not None:
            s = s.masked_fill(attn_mask.reshape(b * h, n_q, n_k) if attn_mask.dim() == 3 else attn_mask, float("-inf"))
        p = torch.softmax(s, dim=-1)
        out = torch.bmm(p, v).reshape(b, h, n_q, self.head_dim).transpose(1, 2).reshape(b, n_q, e)
        out = self.out_proj(out)
        if not self.batch_first:
            out = out.transpose(0, 1)
        return out, (p.reshape(b, h, n_q, n_k) if need_weights else None)


# --------------------------------------------------------------------------------------------------- Hugging Face
def _llama_tile_class():
    from transformers.models.llama import modeling_llama as ml

    class LlamaAttentionTileKV(ml.LlamaAttention):
        """transformers' ``LlamaAttention`` (5.24.0) whose eager attention expands K/V with ``.repeat`` (tile) where
        the checkpoint's heads follow ``repeat_kv`` (interleave) — a porting bug of custom Llama kernels."""

        def forward(self, hidden_states, position_embeddings, attention_mask=None, **kwargs):
            input_shape = hidden_states.shape[:-1]
            hidden_shape = (*input_shape, -1, self.head_dim)
            q = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            k = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            cos, sin = position_embeddings
            q, k = ml.apply_rotary_pos_emb(q, k, cos, sin)
            k = k.repeat(1, self.num_key_value_groups, 1, 1)  # BUG: repeat_kv (interleave)
            v = v.repeat(1, self.num_key_value_groups, 1, 1)
            w = torch.matmul(q, k.transpose(2, 3)) * self.scaling
            if attention_mask is not None:
                w = w + attention_mask
            w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(w, v).transpose(1, 2).contiguous()
            out = out.reshape(*input_shape, -1).contiguous()
            return self.o_proj(out), w

    return LlamaAttentionTileKV


def _llama_tile():
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager"
    )
    return _llama_tile_class()(cfg, layer_idx=0)


def _attend(**kw):
    from x_transformers.attend import Attend

    return Attend(**kw)


FP = ("float64", "float32")

CASES = [
    Case("module-mingpt-triu", MinGPTTriu(MinGPTConfig()), {"dtypes": FP}, "causal-leak", MINGPT + "; tril -> triu"),
    Case(
        "module-mingpt-no-scale",
        MinGPTNoScale(MinGPTConfig()),
        {"dtypes": FP},
        "scale-missing",
        MINGPT + "; * (1.0 / math.sqrt(k.size(-1))) removed",
    ),
    Case(
        "module-mingpt-heads-mixed",
        MinGPTHeadsNotTransposedBack(MinGPTConfig()),
        {"dtypes": FP},
        "batch-leak",
        MINGPT + "; y.transpose(1, 2) before the view removed (heads and positions mixed)",
    ),
    Case(
        "module-timm-inverted-mask",
        TimmManualInvertedMask(32, num_heads=4),
        {"dtypes": FP},
        "mask-inverted",
        TIMM + ", manual path, resolve_self_attn_mask's masked_fill_(~attn_mask) planted as masked_fill(attn_mask)",
    ),
    Case(
        "module-mha-subclass-scale",
        MHAManualScaleEmbedDim(16, 2, batch_first=True),
        {"dtypes": FP},
        "scale-wrong",
        "torch.nn.MultiheadAttention subclass with a fairseq-style manual forward (facebookresearch/fairseq "
        "fairseq/modules/multihead_attention.py: q * self.scaling, scaling = head_dim ** -0.5) scaling by "
        "embed_dim ** -0.5",
    ),
    Case(
        "module-hf-llama-tile-kv",
        _llama_tile(),
        {"dtypes": FP},
        "gqa-mapping",
        "transformers 5.24.0 models/llama/modeling_llama.py LlamaAttention + eager_attention_forward with repeat_kv "
        "planted as Tensor.repeat",
    ),
    Case(
        "module-attend-dropout-train",
        _attend(dropout=0.1),
        {"gqa": "tile", "dtypes": FP},
        "nondeterministic",
        "x-transformers 2.31.10 attend.py Attend(dropout=0.1) left in training mode (no .eval())",
    ),
    Case(
        "module-attend-as-interleave",
        _attend(),
        {"gqa": True, "dtypes": FP},
        "gqa-mapping",
        "x-transformers 2.31.10 attend.py Attend (tile GQA, repeat 'b kvh n d -> b (r kvh) n d') dropped into a "
        "Llama port whose K/V heads follow repeat_kv (interleave, gqa=True)",
    ),
]
