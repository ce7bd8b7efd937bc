"""Buggy attention *functions* (NumPy and PyTorch, plain functions, lambdas, classes), full boolean masks.

Each is transcribed from the public code its ``source`` names, with the bug planted (or, where the source itself
has the bug, left as it is)."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange

from . import Case

AT = (
    "harvardnlp/annotated-transformer the_annotated_transformer.py attention(), "
    "commit debc9fd747bb2123160a98046ad1c2d4da44a567"
)
D2L = "d2l-ai/d2l-en d2l/torch.py DotProductAttention, commit 23d7a5aecceee57d1292c56e90cce307f183bb0a"
LABML = (
    "labmlai/annotated_deep_learning_paper_implementations labml_nn/transformers/mha.py MultiHeadAttention.forward, "
    "commit e6b3c8a6a2cdae4071bcde1abeaaf9a2bc37bd53"
)
SDPA_DOC = "the reference implementation in torch 2.13's torch.nn.functional.scaled_dot_product_attention docstring"
HF = "transformers 5.24.0 models/llama/modeling_llama.py eager_attention_forward"


# --------------------------------------------------------------------------------------------------- helpers
def _np_softmax(s, axis=-1):
    m = np.max(s, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m)
    z = e.sum(axis=axis, keepdims=True)
    return e / np.where(z == 0, 1, z)


def _torch_masked_softmax(s, mask):
    """-inf fill, zeros on fully masked rows (correct)."""
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    if mask is not None:
        p = torch.where(mask.any(-1, keepdim=True), p, torch.zeros_like(p))
    return p


# --------------------------------------------------------------------------------------------------- scale
def d2l_numpy_no_scale(q, k, v, mask=None):
    """d2l's DotProductAttention in NumPy with the ``/ math.sqrt(d)`` forgotten."""
    scores = q @ np.swapaxes(k, -1, -2)  # BUG: no / sqrt(d)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    return _np_softmax(scores) @ v


def scale_by_d_model(q, k, v, mask=None):
    """minGPT-style attention on [B, h, n, d] with the scale taken from the embedding width C = h * d."""
    c = q.shape[-3] * q.shape[-1]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c))  # BUG: sqrt(n_embd) instead of sqrt(head_dim)
    return _torch_masked_softmax(att, mask) @ v


def sdpa_scale_ignored(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """The SDPA signature with ``scale`` accepted and never used."""
    scale_factor = 1 / math.sqrt(query.size(-1))  # BUG: the scale argument is ignored
    s = query @ key.transpose(-2, -1) * scale_factor
    if is_causal:
        attn_mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
    return _torch_masked_softmax(s, attn_mask) @ value


def scale_after_softmax_torch(q, k, v, mask=None):
    """The scale moved behind the softmax: weights * 1/sqrt(d_k)."""
    s = q @ k.transpose(-2, -1)
    p = _torch_masked_softmax(s, mask) * (q.shape[-1] ** -0.5)  # BUG: scales the weights
    return p @ v


def scale_after_softmax_numpy(q, k, v, mask=None):
    """(softmax(QK^T) V) / sqrt(d_k) in NumPy."""
    s = q @ np.swapaxes(k, -1, -2)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    return (_np_softmax(s) @ v) / math.sqrt(q.shape[-1])  # BUG: scales the output


# --------------------------------------------------------------------------------------------------- softmax axis
def labml_softmax_dim0(q, k, v, mask=None):
    """labml's MHA layout ``[seq, batch, heads, d]`` with ``nn.Softmax(dim=0)`` (the query axis of 'ijbh')."""
    qi, kj, vj = (x.permute(2, 0, 1, 3) for x in (q, k, v))  # [B, h, n, d] -> [n, B, h, d]
    scores = torch.einsum("ibhd,jbhd->ijbh", qi, kj) * (q.shape[-1] ** -0.5)
    if mask is not None:
        scores = scores.masked_fill(~mask.permute(2, 3, 0, 1), float("-inf"))
    attn = torch.softmax(scores, dim=0)  # BUG: labml uses dim=1 (keys)
    x = torch.einsum("ijbh,jbhd->ibhd", attn, vj)
    return x.permute(1, 2, 0, 3)


def softmax_flattened_numpy(q, k, v, mask=None):
    """Softmax over the flattened (queries x keys) plane of each head."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    shape = s.shape
    p = _np_softmax(s.reshape(*shape[:-2], -1)).reshape(shape)  # BUG: normalizes n_q * n_k entries together
    return p @ v


def softmax_heads_keys_einops(q, k, v, mask=None):
    """Softmax over heads and keys together, via einops ``b h i j -> b i (h j)``."""
    h = q.shape[1]
    s = torch.einsum("bhid,bhjd->bhij", q, k) * q.shape[-1] ** -0.5
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = rearrange(s, "b h i j -> b i (h j)").softmax(dim=-1)  # BUG: the heads share one distribution
    p = rearrange(p, "b i (h j) -> b h i j", h=h)
    return torch.einsum("bhij,bhjd->bhid", p, v)


# --------------------------------------------------------------------------------------------------- masks
def mask_inverted_torch(q, k, v, mask=None):
    """A True-means-attend mask filled as if True meant blocked."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))  # BUG: should be ~mask
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v


def mask_multiplied_after_softmax(q, k, v, mask=None):
    """The mask multiplied into the weights after an unmasked softmax (rows no longer sum to 1)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    p = torch.softmax(s, dim=-1)
    if mask is not None:
        p = p * mask  # BUG: masking after the softmax
    return p @ v


def neg_inf_fill_after_softmax(q, k, v, mask=None):
    """``masked_fill(-inf)`` applied to the weights after the softmax, the EVA bug (timm commit 3863d635) on a
    full mask."""
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    attn = s.softmax(dim=-1)
    if mask is not None:
        attn = attn.masked_fill(~mask, float("-inf"))  # BUG: fills the weights
    return attn @ v


def finite_fill_after_softmax_numpy(q, k, v, mask=None):
    """A -1e9 fill (annotated transformer's value) moved behind the softmax, in NumPy."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    p = _np_softmax(s)
    if mask is not None:
        p = np.where(mask, p, -1e9)  # BUG: fills the weights
    return p @ v


def bert_minus_10000(q, k, v, mask=None):
    """Hugging Face BERT's classic extended attention mask: ``(1.0 - mask) * -10000.0`` added to the scores
    (transformers v4.x modeling_utils.py get_extended_attention_mask, before it moved to finfo.min in
    huggingface/transformers#17306)."""
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s + (1.0 - mask.to(s.dtype)) * -10000.0  # BUG: finite fill
    return torch.matmul(torch.softmax(s, dim=-1), v)


def annotated_transformer_attention(query, key, value, mask=None):
    """The Annotated Transformer's ``attention`` as published: ``masked_fill(mask == 0, -1e9)`` (dropout None).
    Returns ``(output, p_attn)``."""
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    return torch.matmul(p_attn, value), p_attn


def masked_row_nan_numpy(q, k, v, mask=None):
    """-inf fill with nothing for rows whose keys are all masked (0/0 = NaN)."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def labml_mha_attention(q, k, v, mask=None):
    """labml's MultiHeadAttention core as published (layout ``[seq, batch, heads, d]``, ``masked_fill(mask == 0,
    -inf)``, softmax over dim=1): a fully masked query row is NaN."""
    qi, kj, vj = (x.permute(2, 0, 1, 3) for x in (q, k, v))
    scores = torch.einsum("ibhd,jbhd->ijbh", qi, kj)
    scores *= 1 / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask.permute(2, 3, 0, 1) == 0, float("-inf"))
    attn = torch.softmax(scores, dim=1)
    return torch.einsum("ijbh,jbhd->ibhd", attn, vj).permute(1, 2, 0, 3)


def causal_tril_off_by_one(q, k, v, mask=None, is_causal=False):
    """A causal flag built with ``tril(diagonal=1)``: every query also sees the next key."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril(diagonal=1)  # BUG: diagonal=0
    return _torch_masked_softmax(s, mask) @ v


def sdpa_is_causal_ignored(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """The SDPA signature whose is_causal is accepted and dropped (the mask is None when is_causal is set)."""
    scale_factor = 1 / math.sqrt(query.size(-1)) if scale is None else scale
    s = query @ key.transpose(-2, -1) * scale_factor  # BUG: is_causal never read
    return _torch_masked_softmax(s, attn_mask) @ value


def causal_top_left_declared_bottom_right(q, k, v, mask=None, causal=False):
    """flash-attn < 2.1 causal semantics (top-left ``tril()``) in a function documented as flash-attn >= 2.1
    (bottom-right, Dao-AILab/flash-attention README "2.1: Change behavior of causal flag")."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        c = torch.ones(s.shape[-2:], dtype=torch.bool).tril()  # BUG: bottom-right is tril(n_k - n_q)
        mask = c if mask is None else mask & c
    return _torch_masked_softmax(s, mask) @ v


def rebuild_causal_bottom_right(q, k, v, mask=None):
    """Recognizes a lower-triangular mask and rebuilds it as the "fast causal path", aligned bottom-right: with
    n_k > n_q the given (top-left) mask is widened to future keys."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        top_left = torch.ones(n_q, n_k, dtype=torch.bool).tril()
        if bool((mask == top_left).all()):
            mask = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)  # BUG: the other alignment
    return _torch_masked_softmax(s, mask) @ v


# --------------------------------------------------------------------------------------------------- softmax math
def unstable_softmax_numpy(q, k, v, mask=None):
    """exp(s) / sum exp(s) without subtracting the row maximum."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    e = np.exp(s)  # BUG: overflows for large logits
    if mask is not None:
        e = np.where(mask, e, 0.0)
    z = e.sum(axis=-1, keepdims=True)
    return (e / np.where(z == 0, 1, z)) @ v


def unstable_softmax_torch(q, k, v, mask=None):
    """A hand-written torch softmax ``exp / sum`` without the max."""
    s = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    e = s.exp()  # BUG
    return (e / e.sum(-1, keepdim=True).clamp_min(1e-30)) @ v


def softmax_one(q, k, v, mask=None):
    """Evan Miller's "attention is off by one" softmax_1 (exp / (1 + sum exp)) used where softmax is meant."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True).clamp_min(0)
    e = (s - m).exp()
    return (e / ((-m).exp() + e.sum(-1, keepdim=True))) @ v  # BUG: rows sum to < 1


def online_softmax_no_rescale(q, k, v, mask=None, block=2):
    """A FlashAttention-style online softmax over key blocks in NumPy that rescales the accumulator but forgets to
    rescale the running denominator l when the running maximum grows (Dao et al. 2022, Algorithm 1, line 10)."""
    s_all = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s_all = np.where(mask, s_all, -np.inf)
    n_k = k.shape[-2]
    m = np.full((*s_all.shape[:-1], 1), -np.inf)
    l = np.zeros_like(m)
    acc = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    for j in range(0, n_k, block):
        s = s_all[..., j : j + block]
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        safe = np.where(np.isfinite(m_new), m_new, 0)
        p = np.exp(s - safe)
        alpha = np.where(np.isfinite(m), np.exp(m - safe), 0)
        acc = acc * alpha + p @ v[..., j : j + block, :]
        l = l + p.sum(axis=-1, keepdims=True)  # BUG: should be l * alpha + ...
        m = m_new
    return (acc / np.where(l == 0, 1, l)).astype(q.dtype)


# --------------------------------------------------------------------------------------------------- batch / heads
def loop_uses_v0(q, k, v, mask=None):
    """A per-batch loop that multiplies every element's weights by ``v[0]``."""
    out = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    for b in range(q.shape[0]):
        s = q[b] @ np.swapaxes(k[b], -1, -2) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = np.where(mask[b] if mask.ndim == 4 else mask, s, -np.inf)
        out[b] = _np_softmax(s) @ v[0]  # BUG: v[b]
    return out


def head_loop_reuses_k0(q, k, v, mask=None):
    """A per-head loop (as ports of per-head ``nn.Linear`` attention do) that reads head 0's keys for every head."""
    heads = []
    for i in range(q.shape[1]):
        s = q[:, i] @ k[:, 0].transpose(-2, -1) / math.sqrt(q.shape[-1])  # BUG: k[:, i]
        heads.append(_torch_masked_softmax(s, None if mask is None else mask[:, i]) @ v[:, i])
    return torch.stack(heads, dim=1)


def gqa_tile_where_interleave(q, k, v, mask=None):
    """GQA through ``k.repeat(1, g, 1, 1)`` (tile: head i uses K/V head i % h_kv) in code documented as
    Hugging Face's ``repeat_kv`` (interleave: i // g)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1)  # BUG: repeat_interleave(g, dim=1)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return _torch_masked_softmax(s, mask) @ v


def gqa_interleave_where_tile(q, k, v, mask=None):
    """GQA through ``repeat_interleave`` in code documented as x-transformers' tile order
    ``repeat('b kvh n d -> b (r kvh) n d')``."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)  # BUG: the other mapping
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return _torch_masked_softmax(s, mask) @ v


# --------------------------------------------------------------------------------------------------- crashes
def sdpa_doc_reference(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """PyTorch's documented reference SDPA, verbatim: ``attn_bias`` is ``[L, S]`` and ``masked_fill_`` in place
    with a ``[B, h, L, S]`` boolean mask raises (the issue's first "real bug gets an OK")."""
    L, S = query.size(-2), key.size(-2)
    scale_factor = 1 / math.sqrt(query.size(-1)) if scale is None else scale
    attn_bias = torch.zeros(L, S, dtype=query.dtype, device=query.device)
    if is_causal:
        assert attn_mask is None
        temp_mask = torch.ones(L, S, dtype=torch.bool, device=query.device).tril(diagonal=0)
        attn_bias.masked_fill_(temp_mask.logical_not(), float("-inf"))

    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_bias.masked_fill_(attn_mask.logical_not(), float("-inf"))
        else:
            attn_bias = attn_mask + attn_bias

    if enable_gqa:
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)

    attn_weight = query @ key.transpose(-2, -1) * scale_factor
    attn_weight += attn_bias
    attn_weight = torch.softmax(attn_weight, dim=-1)
    attn_weight = torch.dropout(attn_weight, dropout_p, train=True)
    return attn_weight @ value


def masked_fill_typo(q, k, v, mask=None):
    """``torch.masked_fill(scores, ~mask)`` with the fill value forgotten: every masked call raises TypeError."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = torch.masked_fill(s, ~mask)  # BUG: value missing
    return torch.softmax(s, dim=-1) @ v


def default_mask_n_q_by_n_q(q, k, v, mask=None):
    """Without a mask, a default all-ones mask built ``(n_q, n_q)``: crashes only unmasked with n_q != n_k."""
    n_q = q.shape[-2]
    if mask is None:
        mask = torch.ones(n_q, n_q, dtype=torch.bool)  # BUG: (n_q, n_k)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return _torch_masked_softmax(s, mask) @ v


def output_allocated_like_q(q, k, v, mask=None):
    """A per-head loop writing into ``torch.empty_like(q)``: crashes whenever d_v != d_k."""
    out = torch.empty_like(q)  # BUG: q.new_empty(*q.shape[:-1], v.shape[-1])
    for i in range(q.shape[1]):
        s = q[:, i] @ k[:, i].transpose(-2, -1) / math.sqrt(q.shape[-1])
        out[:, i] = _torch_masked_softmax(s, None if mask is None else mask[:, i]) @ v[:, i]
    return out


# --------------------------------------------------------------------------------------------------- dtype / precision
def eager_softmax_float32_not_cast_back(query, key, value, attention_mask=None):
    """Hugging Face's eager softmax upcast ``softmax(..., dtype=torch.float32)`` without ``.to(query.dtype)``: the
    output comes back float32 for float16/bfloat16 inputs (and the float32 weights meet half V)."""
    w = torch.matmul(query, key.transpose(2, 3)) / math.sqrt(query.shape[-1])
    if attention_mask is not None:
        w = w.masked_fill(~attention_mask, torch.finfo(w.dtype).min)
    w = F.softmax(w, dim=-1, dtype=torch.float32)  # BUG: .to(query.dtype) dropped
    return torch.matmul(w, value.to(w.dtype))


def numpy_float64_scalar_promotes(q, k, v, mask=None):
    """NumPy 2 (NEP 50): dividing by ``np.sqrt(d)`` (a float64 *scalar*, not a Python float) promotes float32 and
    float16 inputs to float64."""
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])  # BUG: np.float64 is a strong type
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    return _np_softmax(s) @ v


def weights_half_before_v(q, k, v, mask=None):
    """Weights cast to float16 before ``@ V`` to save memory, then the product cast back."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    p = _torch_masked_softmax(s, mask)
    return (p.half().to(q.dtype)) @ v  # BUG: 11 significant bits of weights


def numpy_float32_inside(q, k, v, mask=None):
    """Documented as exact in the input precision, computes in float32 and casts back."""
    dt = q.dtype
    q, k, v = (x.astype(np.float32) for x in (q, k, v))  # BUG: float64 inputs lose precision
    s = q @ np.swapaxes(k, -1, -2) / np.float32(math.sqrt(q.shape[-1]))
    if mask is not None:
        s = np.where(mask, s, np.float32(-np.inf))
    return (_np_softmax(s) @ v).astype(dt)


# --------------------------------------------------------------------------------------------------- side effects
def scales_q_in_place(q, k, v, mask=None):
    """``q.mul_(scale)``: the caller's query tensor is scaled."""
    q = q.mul_(q.shape[-1] ** -0.5)  # BUG: in place
    s = q @ k.transpose(-2, -1)
    return _torch_masked_softmax(s, mask) @ v


def numpy_in_place_divide(q, k, v, mask=None):
    """``q /= sqrt(d)`` in NumPy writes into the caller's array."""
    q /= math.sqrt(q.shape[-1])  # BUG: in place
    s = q @ np.swapaxes(k, -1, -2)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    return _np_softmax(s) @ v


def torch_returns_numpy(q, k, v, mask=None):
    """A torch function that hands back ``.numpy()``."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return (_torch_masked_softmax(s, mask) @ v).detach().numpy()  # BUG


def sdpa_dropout_at_inference(q, k, v, attn_mask=None, is_causal=False):
    """``dropout_p=self.dropout`` passed to SDPA without ``if self.training`` (meta-pytorch/torchtune#1791,
    suno-ai/bark#662): dropout at inference."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=0.1, is_causal=is_causal)


# --------------------------------------------------------------------------------------------------- two bugs
def two_bugs_scale_and_inverted(q, k, v, mask=None):
    """No 1/sqrt(d_k) *and* the mask read as True = blocked."""
    s = q @ np.swapaxes(k, -1, -2)  # BUG 1
    if mask is not None:
        s = np.where(mask, -np.inf, s)  # BUG 2
    return _np_softmax(s) @ v


def two_bugs_causal_and_unstable(q, k, v, mask=None, is_causal=False):
    """A causal flag that leaks one future key *and* a softmax without the max."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril(1)  # BUG 1
    e = s.exp()  # BUG 2
    if mask is not None:
        e = e * mask
    return (e / e.sum(-1, keepdim=True).clamp_min(1e-30)) @ v


class MaskedRowZerosDeclared:
    """Hugging Face's eager path (finfo.min additive fill: a fully masked row is the uniform average) declared as
    promising zeros on such rows, as a FlashAttention drop-in would."""

    def __call__(self, q, k, v, mask=None):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s + torch.zeros_like(s).masked_fill(~mask, torch.finfo(s.dtype).min)
        return torch.softmax(s, dim=-1) @ v


# --------------------------------------------------------------------------------------------------- more styles
class NumpyAttentionModule:
    """A NumPy "module" whose bound method ``forward`` is checked; the mask multiplies the weights after the
    softmax."""

    def forward(self, q, k, v, mask=None):
        p = _np_softmax(q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1]))
        if mask is not None:
            p = p * mask  # BUG: after the softmax
        return p @ v


def transformer_lens_ignore(q, k, v):
    """TransformerLens' causal attention before TransformerLensOrg/TransformerLens#319: the causal mask applied
    with ``torch.where(mask, attn_scores, self.IGNORE)``, ``IGNORE = -1e5`` (issue #318: on pythia-70m real
    scores fall below -1e5 and the model attends outside the mask)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    attn_scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    mask = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
    attn_scores = torch.where(mask, attn_scores, torch.tensor(-1e5, dtype=attn_scores.dtype))  # BUG: finite
    return attn_scores.softmax(dim=-1) @ v


FP = ("float64", "float32")

CASES = [
    Case("scale-missing-numpy", d2l_numpy_no_scale, {}, "scale-missing", D2L + ", in NumPy; / sqrt(d) removed"),
    Case(
        "scale-d-model",
        scale_by_d_model,
        {"dtypes": FP},
        "scale-wrong",
        "karpathy/minGPT mingpt/model.py CausalSelfAttention (commit 37baab71b9abea1b76ab957409a1cc2fbfba8a26) "
        "as a function; scale 1/sqrt(C) (n_embd) planted for 1/sqrt(k.size(-1))",
    ),
    Case(
        "scale-arg-ignored",
        sdpa_scale_ignored,
        {"dtypes": FP},
        "scale-wrong",
        SDPA_DOC + "; the scale argument planted as ignored",
    ),
    Case(
        "scale-after-softmax-torch",
        scale_after_softmax_torch,
        {"dtypes": FP},
        "scale-after-softmax",
        "torch manual attention (nanoGPT model.py manual path, commit 3adf61e1) with the scale moved to the weights",
    ),
    Case(
        "scale-after-softmax-numpy",
        scale_after_softmax_numpy,
        {},
        "scale-after-softmax",
        D2L + ", in NumPy; the / sqrt(d) moved to the output",
    ),
    Case(
        "softmax-dim0-labml",
        labml_softmax_dim0,
        {"ranks": (4,), "dtypes": FP},
        "softmax-axis",
        LABML + "; nn.Softmax(dim=1) -> 0",
    ),
    Case(
        "softmax-flattened-numpy",
        softmax_flattened_numpy,
        {},
        "softmax-axis",
        D2L + ", in NumPy; softmax over reshape(..., -1) (queries x keys)",
    ),
    Case(
        "softmax-heads-keys-einops",
        softmax_heads_keys_einops,
        {"ranks": (4,), "dtypes": FP},
        "softmax-axis",
        "x-transformers 2.31.10 attend.py Attend einsum path; softmax over rearrange 'b h i j -> b i (h j)'",
    ),
    Case(
        "mask-inverted-torch",
        mask_inverted_torch,
        {"dtypes": FP},
        "mask-inverted",
        "karpathy/nanoGPT model.py manual path (commit 3adf61e1) with masked_fill(mask) instead of (mask == 0) (the "
        "opposite conventions of SDPA and nn.MultiheadAttention, torch docs)",
    ),
    Case(
        "mask-multiplied-after-softmax",
        mask_multiplied_after_softmax,
        {"dtypes": FP},
        "mask-after-softmax",
        "torch manual attention (the_annotated_transformer.py attention(), commit debc9fd7) with the mask multiplied "
        "into p_attn after the softmax",
    ),
    Case(
        "neg-inf-fill-after-softmax",
        neg_inf_fill_after_softmax,
        {"dtypes": FP},
        "fill-after-softmax",
        "huggingface/pytorch-image-models timm/models/eva.py EvaAttention manual path at commit "
        "3863d63516c99bbd7ade25fba88f030a40cd8e30 (masked_fill(-inf) after attn.softmax), on a full mask",
    ),
    Case(
        "finite-fill-after-softmax-numpy",
        finite_fill_after_softmax_numpy,
        {},
        "fill-after-softmax",
        AT + ", in NumPy; the -1e9 fill moved behind the softmax",
    ),
    Case(
        "finite-fill-bert-10000",
        bert_minus_10000,
        {"dtypes": FP},
        "finite-fill",
        "transformers v4.x modeling_utils.py get_extended_attention_mask ((1.0 - mask) * -10000.0) + BERT's "
        "scores + mask (replaced by finfo.min in huggingface/transformers#17306)",
    ),
    Case(
        "finite-fill-annotated-transformer",
        annotated_transformer_attention,
        {"dtypes": FP},
        "finite-fill",
        AT + " as published (-1e9); float16 left out: masked_fill(-1e9) raises on Half before any leak",
    ),
    Case("masked-row-nan-numpy", masked_row_nan_numpy, {}, "masked-row-nan", D2L + ", NumPy, -inf fill, no guard"),
    Case(
        "masked-row-nan-labml",
        labml_mha_attention,
        {"ranks": (4,), "dtypes": FP},
        "masked-row-nan",
        LABML + " as published (the core between the projections)",
    ),
    Case(
        "causal-tril-diagonal-1",
        causal_tril_off_by_one,
        {"dtypes": FP},
        "causal-leak",
        SDPA_DOC + "; temp_mask tril(diagonal=0) planted as tril(diagonal=1)",
    ),
    Case(
        "causal-flag-ignored",
        sdpa_is_causal_ignored,
        {"dtypes": FP},
        "causal-leak",
        SDPA_DOC + "; the is_causal branch removed",
    ),
    Case(
        "causal-top-left-declared-bottom-right",
        causal_top_left_declared_bottom_right,
        {"causal_align": "bottom_right", "dtypes": FP},
        "causal-alignment",
        "Dao-AILab/flash-attention README '2.1: Change behavior of causal flag' (bottom-right); attention_ref "
        "(tests/test_flash_attn.py, commit 0251105a) with the pre-2.1 top-left tril planted",
    ),
    Case(
        "causal-mask-rebuilt-bottom-right",
        rebuild_causal_bottom_right,
        {"dtypes": FP},
        "causal-alignment",
        "the issue's case (issue 13): a 'fast causal path' that recognizes a given tril mask and rebuilds it "
        "bottom-right, a future leak when n_k > n_q",
    ),
    Case("unstable-softmax-numpy", unstable_softmax_numpy, {}, "unstable-softmax", D2L + ", NumPy; exp without max"),
    Case(
        "unstable-softmax-torch",
        unstable_softmax_torch,
        {"dtypes": FP},
        "unstable-softmax",
        HF + " with F.softmax replaced by a hand-written exp / sum (no max)",
    ),
    Case(
        "softmax-one",
        softmax_one,
        {"dtypes": FP},
        "not-normalized",
        "Evan Miller, 'Attention Is Off By One' (evanmiller.org/attention-is-off-by-one.html, 2023) softmax_1 used "
        "where softmax attention is documented",
    ),
    Case(
        "online-softmax-no-l-rescale",
        online_softmax_no_rescale,
        {},
        "not-normalized",
        "FlashAttention Algorithm 1 (Dao et al. 2022, arXiv:2205.14135) in NumPy; the l rescale by "
        "exp(m_old - m_new) left out",
    ),
    Case(
        "batch-loop-v0",
        loop_uses_v0,
        {},
        "batch-leak",
        "the issue's case (issue 13): a per-batch loop over d2l DotProductAttention multiplying by v[0]",
    ),
    Case(
        "head-loop-k0",
        head_loop_reuses_k0,
        {"ranks": (4,), "dtypes": FP},
        "batch-leak",
        "a per-head loop over torch manual attention reading k[:, 0] for every head",
    ),
    Case(
        "gqa-tile-declared-interleave",
        gqa_tile_where_interleave,
        {"ranks": (4,), "gqa": True, "dtypes": FP},
        "gqa-mapping",
        "transformers 5.24.0 modeling_llama.py repeat_kv replaced by k.repeat(1, n_rep, 1, 1)",
    ),
    Case(
        "gqa-interleave-declared-tile",
        gqa_interleave_where_tile,
        {"ranks": (4,), "gqa": "tile", "dtypes": FP},
        "gqa-mapping",
        "x-transformers 2.31.10 attend.py repeat('b kvh n d -> b (r kvh) n d') replaced by repeat_interleave",
    ),
    Case("crash-sdpa-doc-reference", sdpa_doc_reference, {"gqa": True, "dtypes": FP}, "crash", SDPA_DOC + ", verbatim"),
    Case("crash-masked-fill-typo", masked_fill_typo, {"dtypes": FP}, "crash", HF + "-like; masked_fill value missing"),
    Case(
        "crash-default-mask-nq-nq",
        default_mask_n_q_by_n_q,
        {"dtypes": FP},
        "crash",
        "the issue's case (issue 13): a default mask torch.ones(n_q, n_q) when mask is None",
    ),
    Case(
        "crash-output-like-q",
        output_allocated_like_q,
        {"ranks": (4,), "dtypes": FP},
        "crash",
        "the issue's case (issue 13): out = torch.empty_like(q) in a per-head loop",
    ),
    Case(
        "dtype-softmax-float32-kept",
        eager_softmax_float32_not_cast_back,
        {"ranks": (4,), "dtypes": ("float32", "float16", "bfloat16")},
        "dtype",
        HF + " with .to(query.dtype) after the float32 softmax dropped",
    ),
    Case(
        "dtype-numpy-float64-scalar",
        numpy_float64_scalar_promotes,
        {},
        "dtype",
        D2L + ", NumPy, dividing by np.sqrt(d) (NEP 50 promotion)",
    ),
    Case(
        "precision-weights-half",
        weights_half_before_v,
        {"dtypes": FP},
        "precision",
        "the issue's case (issue 13): weights cast to float16 before @ V (cf. mlc-ai/mlc-llm#1638 on fp16 "
        "attention products)",
    ),
    Case(
        "precision-numpy-float32-inside",
        numpy_float32_inside,
        {"compute_dtype": "input", "dtypes": FP},
        "precision",
        D2L + ", NumPy, computing in float32 while documented exact in the input dtype (declared "
        "compute_dtype='input')",
    ),
    Case("mutates-q-mul-inplace", scales_q_in_place, {"dtypes": FP}, "mutates-input", "q.mul_(scale) in torch"),
    Case("mutates-numpy-divide", numpy_in_place_divide, {}, "mutates-input", D2L + ", NumPy, q /= sqrt(d)"),
    Case(
        "output-type-numpy", torch_returns_numpy, {"dtypes": FP}, "output-type", "a torch function returning .numpy()"
    ),
    Case(
        "nondeterministic-sdpa-dropout",
        sdpa_dropout_at_inference,
        {"dtypes": FP},
        "nondeterministic",
        "meta-pytorch/torchtune#1791 and suno-ai/bark#662: dropout_p passed to SDPA at inference",
    ),
    Case(
        "two-bugs-scale-inverted",
        two_bugs_scale_and_inverted,
        {},
        "scale-missing",
        D2L + ", NumPy, no / sqrt(d) and np.where(mask, -inf, s)",
        second="mask-inverted",
    ),
    Case(
        "two-bugs-causal-unstable",
        two_bugs_causal_and_unstable,
        {"dtypes": FP},
        "causal-leak",
        SDPA_DOC + "; tril(1) and exp without max",
        second="unstable-softmax",
    ),
    Case(
        "masked-row-zeros-declared",
        MaskedRowZerosDeclared(),
        {"masked_rows": "zeros", "dtypes": FP},
        "masked-row-policy",
        HF + "'s finfo.min fill (uniform rows) in a class declared masked_rows='zeros'",
    ),
    Case(
        "lambda-mup-one-over-d",
        lambda q, k, v, attn_mask=None, is_causal=False: F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=1.0 / q.shape[-1]
        ),
        {"dtypes": FP},
        "scale-wrong",
        "microsoft/mup README (muP attention: 1/d instead of 1/sqrt(d)) scaling pasted into a lambda documented as "
        "standard SDPA attention",
    ),
    Case(
        "partial-hard-coded-sm-scale",
        functools.partial(F.scaled_dot_product_attention, scale=0.125),
        {"dtypes": FP},
        "scale-wrong",
        "a functools.partial binding sm_scale = 0.125 (1/sqrt(64)), as kernel tests hard-code sm_scale "
        "(triton-lang/triton python/tutorials/06-fused-attention.py test_op: sm_scale = 0.5): right only for d_k = 64",
    ),
    Case(
        "bound-method-mask-after-softmax",
        NumpyAttentionModule().forward,
        {},
        "mask-after-softmax",
        D2L + ", NumPy, as a bound method; the mask multiplied into the weights after the softmax",
    ),
    Case(
        "finite-fill-transformer-lens-1e5",
        transformer_lens_ignore,
        {"causal_only": True, "dtypes": FP},
        "finite-fill",
        "TransformerLensOrg/TransformerLens#318 and PR #319 (IGNORE = -1e5 in the causal mask, replaced by -inf); "
        "the attention part transcribed from the issue's description",
    ),
]
