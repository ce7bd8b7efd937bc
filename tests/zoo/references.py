"""Faithful transcriptions of reference oracles whose libraries do not install here (CUDA-only builds), each
naming its source. They are correct implementations: the checker must find nothing in them.

* :func:`attention_ref` and :func:`construct_local_mask`: Dao-AILab/flash-attention ``tests/test_flash_attn.py``
  at commit 0251105a2fb19d2957484b7f023cd8c115286ced (verbatim, black-formatted): ``[B, n, h, d]`` layout,
  key/query padding masks ``[B, n]``, an additive ``attn_bias``, bottom-right ``causal`` (aligned to each
  sequence's valid length when padding masks are given), GQA by ``einops.repeat`` (interleave), computed in
  float32 (``upcast=True``) and cast back; returns ``(output, attention)``.
* :func:`ref_attention` and :func:`ref_attention_bmhk`: facebookresearch/xformers ``xformers/attn_bias_utils.py``
  at commit ce4f89d54286ab07b90d0a230561e338eb70bff2 (the last commit that has it: the next one, ca6d2aa0,
  replaced the module by stubs re-exporting mslk; before 24f7741e it lived in ``tests/test_mem_eff_attention.py``):
  ``[B, n, h, d]`` (or 3-D ``[B*h, n, d]``, or 5-D grouped), an additive ``attn_bias`` tensor (a 4-D
  ``[B, h, n_q, n_k]`` one is folded to ``[B*h, ...]``, lower ranks broadcast), computed and returned in float32.
  The branches for xformers' ``AttentionBias`` objects are left out (xformers does not install here, so no such
  object exists); the tensor paths are verbatim.
* :func:`kvcache_attention` and :func:`varlen_attention` are not transcriptions: written here from the
  docstrings of ``flash_attn_with_kvcache`` and ``flash_attn_varlen_func`` (flash_attn/flash_attn_interface.py,
  same commit).
"""

from __future__ import annotations

import math

import torch
from einops import rearrange, repeat


def construct_local_mask(
    seqlen_q,
    seqlen_k,
    window_size=(-1, -1),  # -1 means infinite window size
    query_padding_mask=None,
    key_padding_mask=None,
    device=None,
    key_leftpad=None,
):
    row_idx = rearrange(torch.arange(seqlen_q, device=device, dtype=torch.long), "s -> s 1")
    col_idx = torch.arange(seqlen_k, device=device, dtype=torch.long)
    if key_leftpad is not None:
        key_leftpad = rearrange(key_leftpad, "b -> b 1 1 1")
        col_idx = repeat(col_idx, "s -> b 1 1 s", b=key_leftpad.shape[0])
        col_idx = torch.where(col_idx >= key_leftpad, col_idx - key_leftpad, 2**32)
    sk = seqlen_k if key_padding_mask is None else rearrange(key_padding_mask.sum(-1), "b -> b 1 1 1")
    sq = seqlen_q if query_padding_mask is None else rearrange(query_padding_mask.sum(-1), "b -> b 1 1 1")
    if window_size[0] < 0:
        return col_idx > row_idx + sk - sq + window_size[1]
    else:
        sk = torch.full_like(col_idx, seqlen_k) if key_padding_mask is None else sk
        return torch.logical_or(
            col_idx > torch.minimum(row_idx + sk - sq + window_size[1], sk),
            col_idx < row_idx + sk - sq - window_size[0],
        )


def attention_ref(
    q,
    k,
    v,
    query_padding_mask=None,
    key_padding_mask=None,
    attn_bias=None,
    dropout_p=0.0,
    dropout_mask=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite window size
    softcap=0.0,
    upcast=True,
    reorder_ops=False,
    key_leftpad=None,
):
    """
    Arguments:
        q: (batch_size, seqlen_q, nheads, head_dim)
        k: (batch_size, seqlen_k, nheads_k, head_dim)
        v: (batch_size, seqlen_k, nheads_k, head_dim)
        query_padding_mask: (batch_size, seqlen_q)
        key_padding_mask: (batch_size, seqlen_k)
        attn_bias: broadcastable to (batch_size, nheads, seqlen_q, seqlen_k)
        dropout_p: float
        dropout_mask: (batch_size, nheads, seqlen_q, seqlen_k)
        causal: whether to apply causal masking
        window_size: (int, int), left and right window size
        upcast: whether to cast all inputs to fp32, do all computation in fp32, then cast
            output back to fp16/bf16.
        reorder_ops: whether to change the order of operations (scaling k instead of scaling q, etc.)
            without changing the math. This is to estimate the numerical error from operation
            reordering.
    Output:
        output: (batch_size, seqlen_q, nheads, head_dim)
        attention: (batch_size, nheads, seqlen_q, seqlen_k), softmax after dropout
    """
    if causal:
        window_size = (window_size[0], 0)
    dtype_og = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    k = repeat(k, "b s h d -> b s (h g) d", g=q.shape[2] // k.shape[2])
    v = repeat(v, "b s h d -> b s (h g) d", g=q.shape[2] // v.shape[2])
    d = q.shape[-1]
    if not reorder_ops:
        scores = torch.einsum("bthd,bshd->bhts", q / math.sqrt(d), k)
    else:
        scores = torch.einsum("bthd,bshd->bhts", q, k / math.sqrt(d))
    if softcap > 0:
        scores = scores / softcap
        scores = scores.tanh()
        scores = scores * softcap
    if key_padding_mask is not None:
        scores.masked_fill_(rearrange(~key_padding_mask, "b s -> b 1 1 s"), float("-inf"))
    if window_size[0] >= 0 or window_size[1] >= 0:
        local_mask = construct_local_mask(
            seqlen_q,
            seqlen_k,
            window_size,
            query_padding_mask,
            key_padding_mask,
            q.device,
            key_leftpad=key_leftpad,
        )
        scores.masked_fill_(local_mask, float("-inf"))
    if attn_bias is not None:
        scores = scores + attn_bias
    attention = torch.softmax(scores, dim=-1).to(v.dtype)
    # Some rows might be completely masked out so we fill them with zero instead of NaN
    if window_size[0] >= 0 or window_size[1] >= 0:
        attention = attention.masked_fill(torch.all(local_mask, dim=-1, keepdim=True), 0.0)
    # We want to mask here so that the attention matrix doesn't have any NaNs
    # Otherwise we'll get NaN in dV
    if query_padding_mask is not None:
        attention = attention.masked_fill(rearrange(~query_padding_mask, "b s -> b 1 s 1"), 0.0)
    dropout_scaling = 1.0 / (1 - dropout_p)
    # attention_drop = attention.masked_fill(~dropout_mask, 0.0) * dropout_scaling
    # output = torch.einsum('bhts,bshd->bthd', attention_drop , v)
    if dropout_mask is not None:
        attention_drop = attention.masked_fill(~dropout_mask, 0.0)
    else:
        attention_drop = attention
    output = torch.einsum("bhts,bshd->bthd", attention_drop, v * dropout_scaling)
    if query_padding_mask is not None:
        output.masked_fill_(rearrange(~query_padding_mask, "b s -> b s 1 1"), 0.0)
    return output.to(dtype=dtype_og), attention.to(dtype=dtype_og)


def ref_attention(q, k, v, attn_bias=None, drop_mask=None, p=0.0, scale=None):
    if q.ndim == 5:

        def attn_bias_group(group: int):
            if isinstance(attn_bias, torch.Tensor):
                return attn_bias[:, group]
            return attn_bias

        return torch.stack(
            [
                ref_attention_bmhk(
                    q[:, :, g],
                    k[:, :, g],
                    v[:, :, g],
                    scale=scale,
                    attn_bias=attn_bias_group(g),
                )
                for g in range(q.shape[2])
            ],
            dim=2,
        )
    if q.ndim == 4:
        assert p == 0.0
        return ref_attention_bmhk(q, k, v, scale=scale, attn_bias=attn_bias)
    q = q.float()
    k = k.float()
    v = v.float()

    scale = scale if scale is not None else (1 / q.shape[-1] ** 0.5)
    q = q * scale

    attn = q @ k.transpose(-2, -1)
    if attn_bias is not None:
        attn_bias_tensor = attn_bias
        if attn_bias_tensor.ndim == 4:
            assert q.shape[0] == attn_bias_tensor.shape[0] * attn_bias_tensor.shape[1]
            attn_bias_tensor = attn_bias_tensor.reshape([-1, *attn_bias_tensor.shape[2:]])
        attn = attn + attn_bias_tensor.float()
    attn = attn.softmax(-1)
    if drop_mask is not None:
        attn = attn * (drop_mask / (1 - p))
    return attn @ v


def ref_attention_bmhk(q, k, v, attn_bias, scale=None) -> torch.Tensor:
    assert q.ndim == 4

    def T(t):
        return t.permute((0, 2, 1, 3)).reshape([t.shape[0] * t.shape[2], t.shape[1], t.shape[3]])

    out = ref_attention(T(q), T(k), T(v), attn_bias, scale=scale)
    out = out.reshape([q.shape[0], q.shape[2], q.shape[1], v.shape[3]])
    return out.permute((0, 2, 1, 3))


def kvcache_attention(q, k_cache, v_cache, cache_seqlens=None, causal=False, softmax_scale=None):
    """The semantics of flash-attn's ``flash_attn_with_kvcache`` (flash_attn/flash_attn_interface.py, its
    docstring) without new k/v: ``q [B, n_q, h, d]``, ``k_cache/v_cache [B, n_cache, h_kv, d]``,
    ``cache_seqlens [B]`` int32 valid cache entries; with ``causal`` the n_q queries are each sequence's last
    positions (bottom-right per sequence). Written from that docstring, computed like ``attention_ref``."""
    b, n_q, h, d = q.shape
    n_k = k_cache.shape[1]
    lengths = torch.full((b,), n_k, dtype=torch.int64) if cache_seqlens is None else cache_seqlens.long()
    col = torch.arange(n_k)[None, None, :]  # [1, 1, n_k]
    keep = col < lengths[:, None, None]  # [B, 1, n_k]
    if causal:
        row = torch.arange(n_q)[None, :, None]
        keep = keep & (col <= lengths[:, None, None] - n_q + row)  # [B, n_q, n_k]
    scale = softmax_scale if softmax_scale is not None else 1 / math.sqrt(d)
    k = repeat(k_cache, "b s h d -> b s (h g) d", g=h // k_cache.shape[2])
    v = repeat(v_cache, "b s h d -> b s (h g) d", g=h // v_cache.shape[2])
    scores = torch.einsum("bthd,bshd->bhts", q.float() * scale, k.float())
    scores = scores.masked_fill(~keep[:, None], float("-inf"))
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows with no key: zeros, as FlashAttention
    return torch.einsum("bhts,bshd->bthd", p, v.float()).to(q.dtype)


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, softmax_scale=None):
    """The semantics of flash-attn's ``flash_attn_varlen_func`` (flash_attn/flash_attn_interface.py, its
    docstring): packed ``q [total_q, h, d]``, ``k, v [total_k, h_kv, d]``, ``cu_seqlens_q/k`` int32 ``[B + 1]``;
    ``causal`` is bottom-right per sequence; rows with no key are 0. One sequence at a time through
    :func:`attention_ref`."""
    outs = []
    for b in range(len(cu_seqlens_q) - 1):
        sq, eq = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        sk, ek = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        if eq == sq:
            continue
        if ek == sk:
            outs.append(torch.zeros(eq - sq, q.shape[1], v.shape[-1], dtype=q.dtype))
            continue
        qb, kb, vb = q[None, sq:eq], k[None, sk:ek], v[None, sk:ek]
        if softmax_scale is not None:
            qb = qb * (softmax_scale * math.sqrt(q.shape[-1]))
        out, _ = attention_ref(qb, kb, vb, causal=causal)
        outs.append(out[0].nan_to_num(0.0))
    return torch.cat(outs) if outs else q.new_zeros(0, q.shape[1], v.shape[-1])
