"""The implementations of the second held-out set, correct and buggy, each written after one public source.

Every function here is a transcription in our own words (NumPy, PyTorch or JAX); the source and what was changed
is in the :class:`heldout.Case` that uses it (``correct.py``, ``buggy.py``). Buggy variants are small edits of
their correct counterpart, marked ``# BUG:``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# ---------------------------------------------------------------------------------------------------------------
# GPT-2 (transformers v4.x models/gpt2/modeling_gpt2.py GPT2Attention._attn)


def gpt2_cross_attn(query, key, value, attention_mask=None):
    """GPT2Attention._attn, the cross-attention branch (no causal bias), with the scale from the query size.
    q [B, h, n_q, d], attention_mask additive [B, 1, n_q, n_k]."""
    attn_weights = torch.matmul(query, key.transpose(-1, -2))
    attn_weights = attn_weights / torch.full([], query.size(-1) ** 0.5, dtype=attn_weights.dtype)
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = attn_weights.type(value.dtype)
    return torch.matmul(attn_weights, value)


def gpt2_cross_attn_value_scale(query, key, value, attention_mask=None):
    """As published in transformers v4.x: the scale is taken from value.size(-1)."""
    attn_weights = torch.matmul(query, key.transpose(-1, -2))
    # BUG (as published): value.size(-1) is d_v, not d_k
    attn_weights = attn_weights / torch.full([], value.size(-1) ** 0.5, dtype=attn_weights.dtype)
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = attn_weights.type(value.dtype)
    return torch.matmul(attn_weights, value)


def _gpt2_causal(query, key, value, top_left):
    attn_weights = torch.matmul(query, key.transpose(-1, -2))
    attn_weights = attn_weights / torch.full([], query.size(-1) ** 0.5, dtype=attn_weights.dtype)
    query_length, key_length = query.size(-2), key.size(-2)
    # GPT-2 slices its [max_pos, max_pos] tril buffer as bias[key_length - query_length : key_length, :key_length];
    # written here as the equivalent tril with an offset (also defined when query_length > key_length)
    offset = 0 if top_left else key_length - query_length
    causal_mask = torch.ones(query_length, key_length, dtype=torch.bool).tril(diagonal=offset)
    mask_value = torch.full([], torch.finfo(attn_weights.dtype).min, dtype=attn_weights.dtype)
    attn_weights = torch.where(causal_mask, attn_weights, mask_value)
    attn_weights = nn.functional.softmax(attn_weights, dim=-1).type(value.dtype)
    return torch.matmul(attn_weights, value)


def gpt2_causal_attn(query, key, value):
    """GPT2Attention._attn self-attention branch: always causal, bottom-right (the buffer slice)."""
    return _gpt2_causal(query, key, value, top_left=False)


def gpt2_causal_attn_top_left(query, key, value):
    """BUG: the bias sliced bias[:query_length, :key_length] (top-left) in a KV-cache step."""
    return _gpt2_causal(query, key, value, top_left=True)


# ---------------------------------------------------------------------------------------------------------------
# T5 (transformers models/t5/modeling_t5.py T5Attention.forward): no 1/sqrt(d_kv), it is folded into W_q's init


def t5_attention(query_states, key_states, value_states, mask=None):
    """T5Attention's core: scores = q kᵀ + position_bias (+ the additive extended mask), softmax in float32."""
    scores = torch.matmul(query_states, key_states.transpose(3, 2))
    position_bias = torch.zeros_like(scores)
    if mask is not None:
        position_bias = position_bias + mask
    scores += position_bias
    attn_weights = nn.functional.softmax(scores.float(), dim=-1).type_as(scores)
    return torch.matmul(attn_weights, value_states)


def t5_folded(q, k, v, mask=None):
    """What a T5 checkpoint computes on unscaled projections: its W_q carries 1/sqrt(d_kv) (mesh-tf init)."""
    return t5_attention(q * q.shape[-1] ** -0.5, k, v, mask)


# ---------------------------------------------------------------------------------------------------------------
# DistilBERT (transformers v4.x models/distilbert/modeling_distilbert.py MultiHeadSelfAttention.forward)


def _distilbert(q, k, v, mask, inverted):
    bs, _, _, dim_per_head = q.shape
    k_length = k.size(2)
    q = q / math.sqrt(dim_per_head)
    scores = torch.matmul(q, k.transpose(2, 3))
    if mask is not None:
        mask_reshp = (bs, 1, 1, k_length)
        blocked = (mask == 1) if inverted else (mask == 0)  # BUG when inverted: 1 = keep read as padding
        blocked = blocked.view(mask_reshp).expand_as(scores)
        scores = scores.masked_fill(blocked, torch.tensor(torch.finfo(scores.dtype).min))
    weights = nn.functional.softmax(scores, dim=-1)
    return torch.matmul(weights, v)


def distilbert_attention(q, k, v, mask=None):
    """mask [bs, k_length]: 1 = keep, 0 = padding (Hugging Face attention_mask)."""
    return _distilbert(q, k, v, mask, inverted=False)


def distilbert_attention_inverted(q, k, v, mask=None):
    return _distilbert(q, k, v, mask, inverted=True)


# ---------------------------------------------------------------------------------------------------------------
# fairseq (facebookresearch/fairseq fairseq/modules/multihead_attention.py MultiheadAttention.forward, the
# non-fast path after the projections): q scaled by head_dim**-0.5, (bsz*num_heads) folded batch-major, bmm,
# key_padding_mask True = padding filled with -inf, softmax in float32 (utils.softmax)


def _fairseq(q, k, v, key_padding_mask, scaled=True, guard=True, head_major_view=False):
    bsz, num_heads, tgt_len, head_dim = q.shape
    src_len = k.size(2)
    if scaled:
        q = q * head_dim**-0.5
    q = q.reshape(bsz * num_heads, tgt_len, head_dim)
    k = k.reshape(bsz * num_heads, src_len, head_dim)
    v = v.reshape(bsz * num_heads, src_len, v.size(-1))
    attn_weights = torch.bmm(q, k.transpose(1, 2))
    if key_padding_mask is not None:
        pad = key_padding_mask.to(torch.bool)
        if head_major_view:
            # BUG: batch-major (bsz*num_heads) scores viewed as (num_heads, bsz): slot s gets pad[s % bsz]
            attn_weights = attn_weights.view(num_heads, bsz, tgt_len, src_len)
            attn_weights = attn_weights.masked_fill(pad[None, :, None, :], float("-inf"))
        else:
            attn_weights = attn_weights.view(bsz, num_heads, tgt_len, src_len)
            attn_weights = attn_weights.masked_fill(pad.unsqueeze(1).unsqueeze(2), float("-inf"))
        attn_weights = attn_weights.view(bsz * num_heads, tgt_len, src_len)
    attn_weights_float = F.softmax(attn_weights, dim=-1, dtype=torch.float32)
    if guard:
        # fully padded sequences: no key at all; zeros instead of 0/0
        attn_weights_float = torch.nan_to_num(attn_weights_float, nan=0.0)
    attn_probs = attn_weights_float.type_as(attn_weights)
    attn = torch.bmm(attn_probs, v)
    return attn.view(bsz, num_heads, tgt_len, v.size(-1))


def fairseq_attention(q, k, v, key_padding_mask=None):
    return _fairseq(q, k, v, key_padding_mask)


def fairseq_attention_as_published(q, k, v, key_padding_mask=None):
    """No guard: a fully padded sequence is exp(-inf - -inf) = NaN (fairseq returns NaN there)."""
    return _fairseq(q, k, v, key_padding_mask, guard=False)


def fairseq_attention_head_major(q, k, v, key_padding_mask=None):
    return _fairseq(q, k, v, key_padding_mask, head_major_view=True)


def fairseq_attention_unscaled_nan(q, k, v, key_padding_mask=None):
    """Two bugs: the q scaling dropped and no guard for fully padded sequences."""
    return _fairseq(q, k, v, key_padding_mask, scaled=False, guard=False)


# ---------------------------------------------------------------------------------------------------------------
# Flax (google/flax flax/linen/attention.py dot_product_attention_weights + dot_product_attention), [B, n, h, d]


def _flax_weights(query, key, mask, axis):
    depth = query.shape[-1]
    query = query / jnp.sqrt(depth).astype(query.dtype)
    attn_weights = jnp.einsum("...qhd,...khd->...hqk", query, key)
    if mask is not None:
        big_neg = jnp.finfo(query.dtype).min
        attn_weights = jnp.where(mask, attn_weights, big_neg)
    return jax.nn.softmax(attn_weights, axis=axis).astype(query.dtype)


def flax_dot_product_attention(query, key, value, mask=None):
    attn_weights = _flax_weights(query, key, mask, axis=-1)
    return jnp.einsum("...hqk,...khd->...qhd", attn_weights, value)


def flax_softmax_over_queries(query, key, value, mask=None):
    attn_weights = _flax_weights(query, key, mask, axis=-2)  # BUG: axis=-2 is the query axis of '...hqk'
    return jnp.einsum("...hqk,...khd->...qhd", attn_weights, value)


def flax_weights_rescaled(query, key, value, mask=None):
    attn_weights = _flax_weights(query, key, mask, axis=-1)
    attn_weights = attn_weights / jnp.sqrt(query.shape[-1]).astype(query.dtype)  # BUG: the scale once more
    return jnp.einsum("...hqk,...khd->...qhd", attn_weights, value)


def flax_returns_numpy(query, key, value, mask=None):
    attn_weights = _flax_weights(query, key, mask, axis=-1)
    return np.asarray(jnp.einsum("...hqk,...khd->...qhd", attn_weights, value))  # BUG: a NumPy array back


# ---------------------------------------------------------------------------------------------------------------
# Haiku (google-deepmind/dm-haiku haiku/_src/attention.py MultiHeadAttention.__call__): logits / sqrt(key_size),
# jnp.where(mask, attn_logits, -1e30): a Python float that float16 cannot hold becomes -inf


def haiku_attention(query, key, value, mask=None):
    """[B, h, n, d] (haiku's einsum '...thd,...Thd->...htT' with the heads moved first)."""
    key_size = query.shape[-1]
    attn_logits = jnp.einsum("...hqd,...hkd->...hqk", query, key)
    attn_logits = attn_logits / np.sqrt(key_size).astype(key.dtype)
    if mask is not None:
        attn_logits = jnp.where(mask, attn_logits, -1e30)
    attn_weights = jax.nn.softmax(attn_logits)
    return jnp.einsum("...hqk,...hkd->...hqd", attn_weights, value)


# ---------------------------------------------------------------------------------------------------------------
# Equinox (patrick-kidger/equinox equinox/nn/_attention.py dot_product_attention_weights), in NumPy


def _np_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def equinox_attention(query, key_, value, mask=None):
    query = query / math.sqrt(query.shape[-1])
    logits = np.einsum("...sd,...Sd->...sS", query, key_)
    if mask is not None:
        logits = np.where(mask, logits, np.finfo(logits.dtype).min)
    weights = _np_softmax(logits)
    return np.einsum("...sS,...Sd->...sd", weights, value)


def equinox_unscaled_neg_inf(query, key_, value, mask=None):
    """Two bugs: no 1/sqrt(d), and -inf instead of finfo.min (a fully masked row is NaN)."""
    logits = np.einsum("...sd,...Sd->...sS", query, key_)
    if mask is not None:
        logits = np.where(mask, logits, -np.inf)
    with np.errstate(invalid="ignore"):
        weights = _np_softmax(logits)
    return np.einsum("...sS,...Sd->...sd", weights, value)


# ---------------------------------------------------------------------------------------------------------------
# AllenNLP (allenai/allennlp allennlp/nn/util.py masked_softmax(memory_efficient=True), min_value_of_dtype;
# allennlp/modules/matrix_attention/scaled_dot_product_matrix_attention.py)


def allennlp_attention(q, k, v, mask=None):
    """mask [B, n_k] bool, True = a real key."""
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    if mask is not None:
        keep = mask.bool()[:, None, None, :]
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    return torch.matmul(F.softmax(scores, dim=-1), v)


# ---------------------------------------------------------------------------------------------------------------
# valid lengths (d2l's masked_softmax interface, written from scratch in NumPy)


def valid_lens_attention(q, k, v, valid_lens=None):
    """q [B, h, n_q, d]; valid_lens [B]: keys j < valid_lens[b] are real."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if valid_lens is not None:
        keep = np.arange(k.shape[-2])[None, None, None, :] < np.asarray(valid_lens)[:, None, None, None]
        s = np.where(keep, s, -np.inf)
        has_key = keep.any(axis=-1, keepdims=True)
        s = np.where(has_key, s, 0.0)
        w = _np_softmax(s) * has_key
    else:
        w = _np_softmax(s)
    return (w @ v).astype(q.dtype, copy=False)


def valid_lens_on_queries(q, k, v, valid_lens=None):
    """BUG: the lengths mask the query rows (arange over n_q) instead of the key columns."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    w = _np_softmax(s)
    if valid_lens is not None:
        rows = np.arange(q.shape[-2])[None, None, :, None] < np.asarray(valid_lens)[:, None, None, None]
        w = w * rows
    return (w @ v).astype(q.dtype, copy=False)


# ---------------------------------------------------------------------------------------------------------------
# KV-cache decode (flash_attn_with_kvcache semantics: Dao-AILab/flash-attention flash_attn/flash_attn_interface.py;
# [B, n, h, d], cache_seqlens [B], the n_q new queries are the last positions, causal bottom-right per sequence)


def _decode(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, bug=None):
    b, n_q, h, d = q.shape
    n_k, h_kv = k_cache.shape[1], k_cache.shape[2]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    rep = h // h_kv
    k = np.repeat(k_cache, rep, axis=2)
    v = np.repeat(v_cache, rep, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    lens = np.full(b, n_k) if cache_seqlens is None else np.asarray(cache_seqlens)
    j = np.arange(n_k)[None, None, None, :]
    i = np.arange(n_q)[None, None, :, None]
    L = lens[:, None, None, None]
    keep = j <= L if bug == "inclusive" else j < L  # BUG "inclusive": the slot after the cache is read
    if causal:
        last = n_k if bug == "global" else L  # BUG "global": offset from the padded cache size, not the length
        keep = keep & (j <= last - n_q + i)
    s = np.where(keep, s, -np.inf)
    has = keep.any(axis=-1, keepdims=True)
    s = np.where(has, s, 0.0)
    w = _np_softmax(s) * has
    return np.einsum("bhqk,bkhd->bqhd", w, v).astype(q.dtype, copy=False)


def decode_attention(q, k_cache, v_cache, cache_seqlens=None, causal=False, softmax_scale=None):
    return _decode(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale)


def decode_attention_global_offset(q, k_cache, v_cache, cache_seqlens=None, causal=False, softmax_scale=None):
    return _decode(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, bug="global")


def decode_attention_inclusive(q, k_cache, v_cache, cache_seqlens=None, causal=False, softmax_scale=None):
    return _decode(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, bug="inclusive")


# ---------------------------------------------------------------------------------------------------------------
# varlen (flash_attn_varlen_func semantics, flash_attn/flash_attn_interface.py): q [total_q, h, d]


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, packed_bug):
    scale = 1.0 / math.sqrt(q.size(-1)) if softmax_scale is None else softmax_scale
    out = torch.zeros(q.size(0), q.size(1), v.size(-1), dtype=q.dtype)
    cq = [int(x) for x in cu_seqlens_q]
    ck = [int(x) for x in cu_seqlens_k]
    if packed_bug:
        # BUG: the packed batch attended as one sequence (no block-diagonal mask): tokens see other sequences
        cq, ck = [cq[0], cq[-1]], [ck[0], ck[-1]]
    for b in range(len(cq) - 1):
        qb = q[cq[b] : cq[b + 1]].transpose(0, 1)
        kb = k[ck[b] : ck[b + 1]].transpose(0, 1)
        vb = v[ck[b] : ck[b + 1]].transpose(0, 1)
        lq, lk = qb.size(1), kb.size(1)
        if lq == 0 or lk == 0:
            continue
        s = torch.matmul(qb, kb.transpose(-1, -2)) * scale
        keep = torch.ones(lq, lk, dtype=torch.bool)
        if causal:
            keep = keep.tril(diagonal=lk - lq)
        s = s.masked_fill(~keep, float("-inf"))
        has = keep.any(dim=-1, keepdim=True)
        w = torch.softmax(s.masked_fill(~has, 0.0), dim=-1) * has
        out[cq[b] : cq[b + 1]] = torch.matmul(w, vb).transpose(0, 1)
    return out


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, softmax_scale=None):
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, False)


def varlen_attention_packed(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, softmax_scale=None
):
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, True)


# ---------------------------------------------------------------------------------------------------------------
# Triton tutorial 06 (triton-lang/triton python/tutorials/06-fused-attention.py _attn_fwd_inner), in NumPy:
# blocks of keys, running max m_i, running sum l_i, acc rescaled by alpha = exp2(m_i - m_ij), qk_scale in log2


def _triton_fwd(q, k, v, causal, sm_scale, rescale_acc=True, block_n=16):
    acc_dtype = np.promote_types(q.dtype, np.float32)
    qf, kf, vf = q.astype(acc_dtype), k.astype(acc_dtype), v.astype(acc_dtype)
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    qk_scale = scale * 1.44269504  # 1/ln(2)
    m_i = np.full((*q.shape[:-1], 1), -np.inf, dtype=acc_dtype)
    l_i = np.zeros((*q.shape[:-1], 1), dtype=acc_dtype)
    acc = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=acc_dtype)
    rows = np.arange(n_q)[:, None]
    for start in range(0, n_k, block_n):
        kb, vb = kf[..., start : start + block_n, :], vf[..., start : start + block_n, :]
        qk = qf @ np.swapaxes(kb, -1, -2) * qk_scale
        if causal:
            cols = np.arange(start, start + kb.shape[-2])[None, :]
            qk = np.where(cols <= rows, qk, -np.inf)  # top-left, as the tutorial (n_q == n_k there)
        m_ij = np.maximum(m_i, qk.max(axis=-1, keepdims=True))
        safe = np.where(np.isfinite(m_ij), m_ij, 0.0)
        p = np.exp2(qk - safe)
        alpha = np.exp2(np.where(np.isfinite(m_i), m_i, safe) - safe)
        l_i = l_i * alpha + p.sum(axis=-1, keepdims=True)
        if rescale_acc:
            acc = acc * alpha
        # BUG when not rescale_acc: acc keeps the old blocks' weights at their old max while l_i is rescaled
        acc = acc + p @ vb
        m_i = m_ij
    return (acc / l_i).astype(q.dtype)


def triton_tutorial_fwd(q, k, v, causal=False, sm_scale=None):
    return _triton_fwd(q, k, v, causal, sm_scale)


def triton_tutorial_fwd_no_alpha(q, k, v, causal=False, sm_scale=None):
    return _triton_fwd(q, k, v, causal, sm_scale, rescale_acc=False)


# ---------------------------------------------------------------------------------------------------------------
# PyTorch docs: torch.nn.functional.scaled_dot_product_attention's reference implementation (torch 2.13 docstring)


def sdpa_reference(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """The docs' reference, with the bias over the inputs' leading dims (the docs' [L, S] bias cannot take a
    [B, h, L, S] mask) and fully masked rows set to 0 instead of NaN."""
    L, S = query.size(-2), key.size(-2)
    scale_factor = 1 / math.sqrt(query.size(-1)) if scale is None else scale
    attn_bias = torch.zeros((*query.shape[:-2], L, S), dtype=query.dtype)
    if is_causal:
        temp_mask = torch.ones(L, S, dtype=torch.bool).tril(diagonal=0)
        attn_bias.masked_fill_(temp_mask.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_bias.masked_fill_(attn_mask.logical_not(), float("-inf"))
        else:
            attn_bias = attn_bias + attn_mask
    if enable_gqa:
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
    attn_weight = query @ key.transpose(-2, -1) * scale_factor
    attn_weight += attn_bias
    attn_weight = torch.softmax(attn_weight, dim=-1)
    attn_weight = torch.where(torch.isneginf(attn_bias).all(dim=-1, keepdim=True), 0.0, attn_weight)
    attn_weight = torch.dropout(attn_weight, dropout_p, train=True)
    return attn_weight @ value


def sdpa_mask_or_causal(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """A wrapper that builds one boolean mask: the given one, else the causal one."""
    L, S = query.size(-2), key.size(-2)
    scale_factor = 1 / math.sqrt(query.size(-1)) if scale is None else scale
    if attn_mask is not None:
        allowed = attn_mask
    elif is_causal:  # BUG: with a mask AND is_causal, the causal part is dropped
        allowed = torch.ones(L, S, dtype=torch.bool).tril()
    else:
        allowed = None
    s = query @ key.transpose(-2, -1) * scale_factor
    if allowed is not None:
        s = s.masked_fill(~allowed, torch.finfo(s.dtype).min)
    return torch.softmax(s, dim=-1) @ value


def tinygrad_sdpa(query, key, value, attn_mask=None, is_causal=False):
    """tinygrad (tinygrad/tinygrad tinygrad/tensor.py Tensor.scaled_dot_product_attention), in torch:
    is_causal replaces attn_mask, a bool mask becomes a -inf/0 bias, qk / sqrt(d), softmax, @ value."""
    if is_causal:  # BUG (as published): the given attn_mask is replaced, not combined
        attn_mask = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool).tril(0)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # BUG (as published): -inf everywhere in a row is NaN after the softmax
        attn_mask = torch.where(attn_mask == 0, float("-inf"), 0.0).to(query.dtype)
    qk = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.shape[-1])
    return ((qk + attn_mask) if attn_mask is not None else qk).softmax(-1) @ value


def bart_sdpa_double_scale(query, key, value, attn_mask=None, is_causal=False):
    """BART/Whisper scale the query in q_proj (query_states = q_proj(x) * scaling); a port to SDPA keeps that line
    and lets SDPA apply its default scale again."""
    query = query * query.size(-1) ** -0.5  # BUG: SDPA below scales by 1/sqrt(d) once more
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal)


# ---------------------------------------------------------------------------------------------------------------
# Falcon (transformers models/falcon/modeling_falcon.py FalconAttention.forward, eager non-alibi path)


def falcon_attention(query_layer, key_layer, value_layer, attention_mask=None):
    """attention_mask additive [B, h, n_q, n_k] (0 / finfo.min)."""
    head_dim = query_layer.size(-1)
    attention_scores = query_layer @ key_layer.transpose(-1, -2)
    attention_scores /= math.sqrt(head_dim)
    if attention_mask is not None:
        attention_scores = attention_scores + attention_mask
    attention_scores = F.softmax(attention_scores, dim=-1, dtype=query_layer.dtype)
    return attention_scores @ value_layer


# ---------------------------------------------------------------------------------------------------------------
# GQA through repeat_kv (transformers models/qwen2/modeling_qwen2.py repeat_kv) and SDPA


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def repeat_kv_outer(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    # BUG: the new axis in front of the K/V heads: query head i reads K/V head i % h_kv (tile)
    hidden_states = hidden_states[:, None, :, :, :].expand(batch, n_rep, num_key_value_heads, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def qwen2_sdpa_gqa(query, key, value, attn_mask=None, is_causal=False, scale=None):
    n_rep = query.size(-3) // key.size(-3)
    return F.scaled_dot_product_attention(
        query, repeat_kv(key, n_rep), repeat_kv(value, n_rep), attn_mask=attn_mask, is_causal=is_causal, scale=scale
    )


def qwen2_sdpa_gqa_outer(query, key, value, attn_mask=None, is_causal=False, scale=None):
    n_rep = query.size(-3) // key.size(-3)
    return F.scaled_dot_product_attention(
        query,
        repeat_kv_outer(key, n_rep),
        repeat_kv_outer(value, n_rep),
        attn_mask=attn_mask,
        is_causal=is_causal,
        scale=scale,
    )


# ---------------------------------------------------------------------------------------------------------------
# MLX-style (ml-explore/mlx mx.fast.scaled_dot_product_attention semantics: GQA without repeating K/V, the query
# heads grouped [B, h_kv, n_rep, L, D]), rewritten in NumPy as a class with __call__


class MLXStyleAttention:
    """fn(q, k, v, mask=None, scale=None); q [B, h, L, D], k/v [B, h_kv, S, D]; mask bool True = keep."""

    grouped_tile = False

    def __call__(self, q, k, v, mask=None, scale=None):
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        b, h, L, d = q.shape
        h_kv = k.shape[1]
        n_rep = h // h_kv
        if self.grouped_tile:
            # BUG: heads split as [n_rep, h_kv]: query head i reads K/V head i % h_kv
            qg = q.reshape(b, n_rep, h_kv, L, d).transpose(0, 2, 1, 3, 4)
        else:
            qg = q.reshape(b, h_kv, n_rep, L, d)
        s = (qg * scale) @ np.swapaxes(k[:, :, None], -1, -2)
        if mask is not None:
            m = np.broadcast_to(mask, (b, h, L, k.shape[2]))
            if self.grouped_tile:
                m = m.reshape(b, n_rep, h_kv, L, -1).transpose(0, 2, 1, 3, 4)
            else:
                m = m.reshape(b, h_kv, n_rep, L, -1)
            s = np.where(m, s, np.finfo(s.dtype).min)
        out = _np_softmax(s) @ v[:, :, None]
        if self.grouped_tile:
            out = out.transpose(0, 2, 1, 3, 4)
        return out.reshape(b, h, L, v.shape[-1])


class MLXStyleAttentionTiled(MLXStyleAttention):
    grouped_tile = True


# ---------------------------------------------------------------------------------------------------------------
# small torch and NumPy functions with one planted bug each


def softmax_dim2_from_3d(q, k, v, mask=None):
    """Written for [B*h, n, d] with F.softmax(dim=2), later fed [B, h, n, d] tensors."""
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = F.softmax(s, dim=2)  # BUG on 4-D inputs: dim 2 is the query axis
    return torch.matmul(torch.nan_to_num(w), v)


def unmask_empty_rows_inplace(q, k, v, attn_mask=None):
    """Avoids NaN on fully masked rows by allowing every key there: written into the caller's mask."""
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    if attn_mask is not None:
        empty = ~attn_mask.any(dim=-1)
        attn_mask[empty] = True  # BUG: modifies the caller's tensor
        s = s.masked_fill(~attn_mask, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def numpy_weights_float32(q, k, v, mask=None):
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, np.finfo(s.dtype).min)
    return (_np_softmax(s) @ v).astype(np.float32)  # BUG: float32 out for float64 and float16 inputs


def dropout_default_training(q, k, v, mask=None):
    """F.dropout's training defaults to True (unlike nn.Dropout in eval mode), and the output is upcast."""
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
    w = F.dropout(torch.softmax(s.float(), dim=-1), p=0.1)  # BUG: training=True by default
    return torch.matmul(w, v.float())  # BUG (second): float32 returned for every input dtype


def bmm_head_major_keys(q, k, v):
    """Folds q batch-major but k/v head-major before bmm."""
    b, h, n_q, d = q.shape
    qf = q.reshape(b * h, n_q, d)
    kf = k.transpose(0, 1).reshape(b * h, k.size(2), d)  # BUG: (h, B) order
    vf = v.transpose(0, 1).reshape(b * h, v.size(2), v.size(3))
    w = torch.softmax(torch.bmm(qf, kf.transpose(1, 2)) / math.sqrt(d), dim=-1)
    return torch.bmm(w, vf).reshape(b, h, n_q, v.size(3))


def keep_to_additive_inverted(q, k, v, mask=None):
    """mask: int 1 = keep, 0 = masked (Hugging Face); converted to an additive bias."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        bias = np.asarray(mask, dtype=s.dtype) * np.finfo(s.dtype).min  # BUG: (1 - mask) * min
        s = s + bias
    return _np_softmax(s) @ v


def fp16_min_fill(q, k, v, mask=None):
    """The fill hard-coded as torch.finfo(torch.float16).min for every dtype."""
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(~mask, torch.finfo(torch.float16).min)  # BUG for float32/float64/bfloat16
    return torch.matmul(torch.softmax(s, dim=-1), v)


def qk_bfloat16(q, k, v, mask=None):
    """Q Kᵀ in bfloat16 for speed, the rest in the input dtype."""
    s = torch.matmul(q.to(torch.bfloat16), k.to(torch.bfloat16).transpose(-1, -2)).to(q.dtype)  # BUG
    s = s / math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
    return torch.matmul(torch.softmax(s, dim=-1), v)


def unpack_four_dims(q, k, v, mask=None):
    """B, h, n, d = q.shape: a ValueError on 3-D [h, n, d] inputs."""
    bsz, n_heads, n_q, d = q.shape  # BUG: only 4-D
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
    if mask is not None:
        s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
    return torch.matmul(torch.softmax(s, dim=-1), v).reshape(bsz, n_heads, n_q, v.size(-1))


def documented_raise(q, k, v, mask=None):
    """Documented: 'raises ValueError when a query has no allowed key'. The check looks at the whole mask."""
    if mask is not None and not np.asarray(mask).any():  # BUG: one empty row passes
        raise ValueError("mask: a query has no allowed key")
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, np.finfo(s.dtype).min)
    return _np_softmax(s) @ v


# ---------------------------------------------------------------------------------------------------------------
# Hugging Face attention functions for layers (transformers 5.24.0 AttentionInterface): called as
# fn(module, query, key, value, attention_mask, scaling=, dropout=, **kwargs) -> (out [B, n, h, d], weights);
# the mask is 4-D additive. Registered under their own names so a Qwen2/Mistral layer can use them.


def _hf_eager(module, query, key, value, attention_mask, scaling, dropout, *, use_mask=True, axis=-1):
    from transformers.models.qwen2.modeling_qwen2 import repeat_kv as hf_repeat_kv

    key_states = hf_repeat_kv(key, module.num_key_value_groups)
    value_states = hf_repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if use_mask and attention_mask is not None:
        attn_weights = attn_weights + attention_mask[:, :, :, : key_states.shape[-2]]
    attn_weights = nn.functional.softmax(attn_weights, dim=axis, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


def hf_attention_mask_dropped(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """BUG: attention_mask accepted and never added (docs/checker.md's check-model example, as a layer)."""
    return _hf_eager(module, query, key, value, attention_mask, scaling, dropout, use_mask=False)


def hf_attention_own_dropout(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """BUG: ignores the dropout= the layer passes (0.0 in eval) and applies config.attention_dropout always."""
    out, w = _hf_eager(module, query, key, value, attention_mask, scaling, 0.0)
    w = nn.functional.dropout(w, p=module.config.attention_dropout, training=True)
    from transformers.models.qwen2.modeling_qwen2 import repeat_kv as hf_repeat_kv

    out = torch.matmul(w, hf_repeat_kv(value, module.num_key_value_groups)).transpose(1, 2).contiguous()
    return out, w


def hf_attention_neox_norm(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """GPT-NeoX's norm_factor = sqrt(head_size) written as sqrt(hidden_size). BUG: 1/sqrt(d_model)."""
    norm_factor = math.sqrt(module.config.hidden_size)
    return _hf_eager(module, query, key, value, attention_mask, 1.0 / norm_factor, dropout)


HF_FUNCTIONS = {
    "heldout2_mask_dropped": hf_attention_mask_dropped,
    "heldout2_own_dropout": hf_attention_own_dropout,
    "heldout2_neox_norm": hf_attention_neox_norm,
}


def register_hf_functions() -> None:
    """Registers HF_FUNCTIONS with transformers' AttentionInterface (idempotent)."""
    from transformers import AttentionInterface

    for name, fn in HF_FUNCTIONS.items():
        AttentionInterface.register(name, fn)


def qwen2_layer(attn_implementation="eager", **config):
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention

    register_hf_functions()
    cfg = Qwen2Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, attn_implementation=attn_implementation, **config
    )
    return Qwen2Attention(cfg, layer_idx=0).eval()


def mistral_layer(attn_implementation="sdpa", **config):
    from transformers import MistralConfig
    from transformers.models.mistral.modeling_mistral import MistralAttention

    register_hf_functions()
    cfg = MistralConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, attn_implementation=attn_implementation, **config
    )
    return MistralAttention(cfg, layer_idx=0).eval()


def naive_logsumexp(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """Flash-style: P = exp(S - lse) with lse = log(sum(exp(S))) computed without the row max."""
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    s = torch.matmul(query, key.transpose(-1, -2)) * scale
    allowed = torch.ones(s.shape[-2:], dtype=torch.bool).tril() if is_causal else None
    if attn_mask is not None:
        allowed = attn_mask if allowed is None else attn_mask & allowed
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.log(torch.exp(s).sum(dim=-1, keepdim=True))  # BUG: exp overflows/underflows without the max
    p = torch.where(torch.isneginf(lse), 0.0, torch.exp(s - lse))
    return torch.matmul(p, value)


def batch_keep_after_softmax(q, k, v, attention_mask=None):
    """attention_mask [B, 1, n_q, n_k] int, 1 = keep (a Hugging Face 4-D keep mask), NumPy."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    w = _np_softmax(s)
    if attention_mask is not None:
        w = w * np.asarray(attention_mask, dtype=w.dtype)  # BUG: multiplied in after the softmax
    return w @ v
