"""Buggy implementations behind the other mask interfaces: full masks in the block convention, per-batch masks
``[B, 1, n_q, n_k]``, key padding ``[B, n_k]``, valid lengths, additive and Hugging Face 4-D additive masks, packed
varlen batches (``cu_seqlens``) and KV-cache decode with per-sequence lengths."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange, repeat

from . import Case

D2L = (
    "d2l-ai/d2l-en d2l/torch.py masked_softmax + DotProductAttention + MultiHeadAttention, "
    "commit 23d7a5aecceee57d1292c56e90cce307f183bb0a"
)
FA = "Dao-AILab/flash-attention commit 0251105a2fb19d2957484b7f023cd8c115286ced"
FP = ("float64", "float32")


# --------------------------------------------------------------------------------------------------- block convention
def mha_mask_passed_to_sdpa(q, k, v, attn_mask=None, is_causal=False):
    """An ``nn.MultiheadAttention``-convention mask (True = blocked) handed to SDPA unchanged (SDPA reads True =
    attend)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)  # BUG: ~attn_mask


# --------------------------------------------------------------------------------------------------- per-batch
def per_batch_mask_repeat(q, k, v, attention_mask=None):
    """Heads folded into the batch ``[B*h, n, d]`` (batch-major, as ``x.reshape(B*h, ...)``) but the per-batch mask
    ``[B, 1, n_q, n_k]`` expanded with ``.repeat(h, 1, 1)`` (head-major): line/lighthouse#77,
    ArrowLuo/CLIP4Clip#22."""
    b, h, n_q, d = q.shape
    qs, ks, vs = (x.reshape(b * h, x.shape[2], x.shape[3]) for x in (q, k, v))
    s = torch.bmm(qs, ks.transpose(1, 2)) / math.sqrt(d)
    if attention_mask is not None:
        m = attention_mask[:, 0].repeat(h, 1, 1)  # BUG: repeat_interleave(h, dim=0)
        s = s.masked_fill(~m, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.bmm(p, vs).reshape(b, h, n_q, -1)


def hf_additive_after_softmax(q, k, v, attention_mask=None):
    """A 4-D Hugging Face additive mask added to the weights after the softmax (it belongs to the scores)."""
    w = torch.softmax(torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.shape[-1]), dim=-1)
    if attention_mask is not None:
        w = w + attention_mask  # BUG: after the softmax
    return torch.matmul(w, v)


def hf_additive_clamped(q, k, v, attention_mask=None):
    """A 4-D additive mask clamped to -1e4 "for fp16 safety": the fill is finite (huggingface/transformers#14859)."""
    w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.shape[-1])
    if attention_mask is not None:
        w = w + attention_mask.clamp(min=-1e4)  # BUG: a finite fill
    return torch.matmul(torch.softmax(w, dim=-1), v)


# --------------------------------------------------------------------------------------------------- key padding
def eva_key_padding_fill_after_softmax(q, k, v, key_padding_mask=None):
    """timm EvaAttention's manual path as it was at commit 3863d635 (key padding ``attn_mask [B, N]``, True = keep):
    ``attn.masked_fill(~attn_mask[:, None, None, :], -inf)`` *after* ``attn.softmax``."""
    attn = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
    attn = attn.softmax(dim=-1)
    if key_padding_mask is not None:
        attn_mask = key_padding_mask.to(torch.bool)
        attn = attn.masked_fill(~attn_mask[:, None, None, :], float("-inf"))
    return attn @ v


def key_padding_multiplied_after_softmax(q, k, v, key_padding_mask=None):
    """An nn.MultiheadAttention-convention key padding mask (True = padding) multiplied into the weights after the
    softmax (the mask never reaches the scores)."""
    attn = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    if key_padding_mask is not None:
        attn = attn * (~key_padding_mask)[:, None, None, :]  # BUG: after the softmax
    return attn @ v


def key_padding_on_query_axis(q, k, v, key_padding_mask=None, causal=False):
    """flash-attn's attention_ref masking with the padding rearranged onto the query axis (``b s -> b 1 s 1``, the
    shape its query_padding_mask uses) instead of the keys (``b s -> b 1 1 s``)."""
    scores = torch.einsum("bhtd,bhsd->bhts", q / math.sqrt(q.shape[-1]), k)
    if key_padding_mask is not None:
        n_q = q.shape[2]
        qm = (
            key_padding_mask[:, :n_q]
            if key_padding_mask.shape[1] >= n_q
            else F.pad(key_padding_mask, (0, n_q - key_padding_mask.shape[1]), value=True)
        )
        scores = scores.masked_fill(rearrange(~qm, "b s -> b 1 s 1"), float("-inf"))  # BUG: keys
    if causal:
        n_q, n_k = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q).logical_not(), float("-inf"))
    attn = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhts,bhsd->bhtd", attn, v)


def key_padding_heads_wrong_einops(q, k, v, key_padding_mask=None):
    """Scores folded ``(b h)`` but the key padding mask repeated ``b j -> (h b) 1 j`` (head-major)."""
    b, h = q.shape[:2]
    qs, ks, vs = (rearrange(x, "b h n d -> (b h) n d") for x in (q, k, v))
    s = torch.einsum("xid,xjd->xij", qs, ks) / math.sqrt(q.shape[-1])
    if key_padding_mask is not None:
        m = repeat(key_padding_mask, "b j -> (h b) 1 j", h=h)  # BUG: (b h)
        s = s.masked_fill(~m, float("-inf"))
    p = s.softmax(-1).nan_to_num(0.0)
    return rearrange(torch.einsum("xij,xjd->xid", p, vs), "(b h) n d -> b h n d", b=b)


# --------------------------------------------------------------------------------------------------- valid lengths
def _d2l_masked_softmax(X, valid_lens, le=False, value=-1e6):
    def _sequence_mask(X, valid_len, value=0):
        maxlen = X.size(1)
        idx = torch.arange((maxlen), dtype=torch.float32, device=X.device)[None, :]
        mask = idx <= valid_len[:, None] if le else idx < valid_len[:, None]
        X[~mask] = value
        return X

    if valid_lens is None:
        return F.softmax(X, dim=-1)
    shape = X.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    X = _sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=value)
    return F.softmax(X.reshape(shape), dim=-1)


def _d2l_mha(q, k, v, valid_lens, repeat_lens, **kw):
    b, h, n_q, d = q.shape
    qs, ks, vs = (x.reshape(b * h, x.shape[2], x.shape[3]) for x in (q, k, v))
    if valid_lens is not None:
        valid_lens = repeat_lens(valid_lens, h)
    scores = torch.bmm(qs, ks.transpose(1, 2)) / math.sqrt(d)
    w = _d2l_masked_softmax(scores, valid_lens, **kw)
    return torch.bmm(w, vs).reshape(b, h, n_q, -1)


def d2l_as_published(q, k, v, valid_lens=None):
    """d2l's multi-head attention core as published: the -1e6 fill."""
    return _d2l_mha(q, k, v, valid_lens, lambda lens, h: torch.repeat_interleave(lens, repeats=h, dim=0))


def d2l_valid_lens_tiled(q, k, v, valid_lens=None):
    """d2l with ``valid_lens.repeat(num_heads)`` (tile) where MultiHeadAttention uses ``repeat_interleave``; the
    fill made -inf and empty rows zero so only the head order is wrong."""
    out = _d2l_mha(q, k, v, valid_lens, lambda lens, h: lens.repeat(h), value=float("-inf"))  # BUG
    return out.nan_to_num(0.0)


def d2l_valid_lens_off_by_one(q, k, v, valid_lens=None):
    """d2l's ``_sequence_mask`` with ``arange <= valid_len`` (one padded key too many); the fill made -inf."""
    out = _d2l_mha(q, k, v, valid_lens, lambda lens, h: torch.repeat_interleave(lens, h), le=True, value=float("-inf"))
    return out.nan_to_num(0.0)


# --------------------------------------------------------------------------------------------------- varlen
def _unpack_loop(q, k, v, cu_q, cu_k, causal, scale=None, top_left=False, pad_to=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = q.new_zeros(q.shape[0], q.shape[1], v.shape[-1])
    for i in range(len(cu_q) - 1):
        sq, eq, sk, ek = (int(x) for x in (cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]))
        lq, lk = eq - sq, ek - sk
        if lq == 0 or (lk == 0 and pad_to is None):
            continue
        qi = q[sq:eq].transpose(0, 1)
        if pad_to is not None:  # keys padded to max_seqlen_k (rows past the sequence zero)
            ki = k.new_zeros(pad_to, *k.shape[1:])
            vi = v.new_zeros(pad_to, *v.shape[1:])
            ki[:lk], vi[:lk] = k[sk:ek], v[sk:ek]
            ki, vi = ki.transpose(0, 1), vi.transpose(0, 1)
            lk = pad_to
        else:
            ki, vi = k[sk:ek].transpose(0, 1), v[sk:ek].transpose(0, 1)
        if ki.shape[0] != qi.shape[0]:
            ki = ki.repeat_interleave(qi.shape[0] // ki.shape[0], dim=0)
            vi = vi.repeat_interleave(qi.shape[0] // vi.shape[0], dim=0)
        s = qi @ ki.transpose(-1, -2) * scale
        if causal:
            keep = torch.ones(lq, lk, dtype=torch.bool).tril(0 if top_left else lk - lq)
            s = s.masked_fill(~keep, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out[sq:eq] = (p @ vi).transpose(0, 1)
    return out


def varlen_top_left(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, softmax_scale=None):
    """A varlen reference loop with flash-attn < 2.1 causal semantics (top-left per sequence), documented as
    ``flash_attn_varlen_func`` >= 2.1 (bottom-right)."""
    return _unpack_loop(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, top_left=True)  # BUG


def varlen_padded_keys_unmasked(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, softmax_scale=None
):
    """Each sequence's keys padded to ``max_seqlen_k`` (flash_attn/bert_padding.py pad_input style) and attended
    without the key padding mask: padded (zero) keys take weight."""
    return _unpack_loop(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, pad_to=int(max_seqlen_k))  # BUG


# --------------------------------------------------------------------------------------------------- KV cache
def _decode(q, k_cache, v_cache, cache_seqlens, causal, scale=None, use_lengths=True, slack=0):
    b, n_q, h, d = q.shape
    scale = 1 / math.sqrt(d) if scale is None else scale
    n_k = k_cache.shape[1]
    lengths = torch.full((b,), n_k) if cache_seqlens is None else cache_seqlens.long()
    col = torch.arange(n_k)[None, None, :]
    keep = col < (lengths[:, None, None] if use_lengths else n_k)
    if causal:
        row = torch.arange(n_q)[None, :, None]
        keep = keep & (col <= lengths[:, None, None] - n_q + row + slack)
    kk = k_cache.repeat_interleave(h // k_cache.shape[2], dim=2)
    vv = v_cache.repeat_interleave(h // v_cache.shape[2], dim=2)
    s = torch.einsum("bthd,bshd->bhts", q * scale, kk)
    s = s.masked_fill(~keep[:, None], float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhts,bshd->bthd", p, vv)


def kvcache_ignores_seqlens(q, k_cache, v_cache, cache_seqlens=None, causal=False, softmax_scale=None):
    """A decode kernel attending the whole cache: stale entries past ``cache_seqlens`` take weight (the causal
    bound still uses the lengths)."""
    return _decode(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, use_lengths=False)  # BUG


def kvcache_causal_off_by_one(q, k_cache, v_cache, cache_seqlens=None, causal=False, softmax_scale=None):
    """A decode kernel whose causal bound is ``col <= L - n_q + row + 1``: each new query sees the next one."""
    return _decode(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, slack=1)  # BUG


CASES = [
    Case(
        "block-mask-passed-to-sdpa",
        mha_mask_passed_to_sdpa,
        {"mask_convention": "block", "dtypes": FP},
        "mask-inverted",
        "torch docs: nn.MultiheadAttention attn_mask True = blocked vs F.scaled_dot_product_attention True = "
        "attend; a block-convention mask passed through unchanged",
    ),
    Case(
        "per-batch-mask-repeat",
        per_batch_mask_repeat,
        {"ranks": (4,), "mask_form": "batch", "dtypes": FP},
        "mask-wrong-heads",
        "line/lighthouse#77 and ArrowLuo/CLIP4Clip#22 (mask.repeat(n_head, 1, 1) vs repeat_interleave) on "
        "d2l-style [B*h] bmm attention",
    ),
    Case(
        "hf-additive-after-softmax",
        hf_additive_after_softmax,
        {"mask_form": "batch", "mask_convention": "additive", "dtypes": FP},
        "fill-after-softmax",
        "transformers 5.24.0 modeling_llama.py eager_attention_forward with attn_weights + attention_mask moved "
        "after the softmax",
    ),
    Case(
        "hf-additive-clamped",
        hf_additive_clamped,
        {"mask_form": "batch", "mask_convention": "additive", "dtypes": FP},
        "finite-fill",
        "transformers 5.24.0 eager_attention_forward with the mask clamped to -1e4: the fp16-motivated -1e4 of "
        "huggingface/transformers#14859 (T5 trained wrongly; fixed by #17306)",
    ),
    Case(
        "eva-key-padding-fill-after-softmax",
        eva_key_padding_fill_after_softmax,
        {"mask_form": "key_padding", "dtypes": FP},
        "fill-after-softmax",
        "huggingface/pytorch-image-models timm/models/eva.py EvaAttention.forward manual path, commit "
        "3863d63516c99bbd7ade25fba88f030a40cd8e30 (as published)",
    ),
    Case(
        "key-padding-multiplied-after-softmax",
        key_padding_multiplied_after_softmax,
        {"mask_form": "key_padding", "mask_convention": "block", "dtypes": FP},
        "mask-after-softmax",
        "key padding only (nn.MultiheadAttention convention, True = padding), multiplied into the weights after "
        "the softmax",
    ),
    Case(
        "key-padding-on-query-axis",
        key_padding_on_query_axis,
        {"mask_form": "key_padding", "causal_align": "bottom_right", "dtypes": FP},
        "padding-leak",
        FA + " tests/test_flash_attn.py attention_ref, key_padding_mask rearranged 'b s -> b 1 s 1' (the "
        "query_padding_mask shape)",
    ),
    Case(
        "key-padding-heads-einops",
        key_padding_heads_wrong_einops,
        {"mask_form": "key_padding", "dtypes": FP},
        "mask-wrong-heads",
        "einops repeat 'b j -> (h b) 1 j' against scores folded '(b h)' (the head/batch order bug of "
        "lsdefine/attention-is-all-you-need-keras#36)",
    ),
    Case(
        "d2l-valid-lens-as-published",
        d2l_as_published,
        {"mask_form": "valid_lens", "dtypes": FP},
        "finite-fill",
        D2L + ", as published (value=-1e6)",
    ),
    Case(
        "d2l-valid-lens-tiled",
        d2l_valid_lens_tiled,
        {"mask_form": "valid_lens", "dtypes": FP},
        "mask-wrong-heads",
        D2L + "; torch.repeat_interleave(valid_lens, num_heads) planted as valid_lens.repeat(num_heads)",
    ),
    Case(
        "d2l-valid-lens-off-by-one",
        d2l_valid_lens_off_by_one,
        {"mask_form": "valid_lens", "dtypes": FP},
        "padding-leak",
        D2L + "; _sequence_mask's arange < valid_len planted as <=",
    ),
    Case(
        "varlen-causal-top-left",
        varlen_top_left,
        {"mask_form": "varlen", "causal_align": "bottom_right", "dtypes": FP},
        "causal-alignment",
        FA + " flash_attn/flash_attn_interface.py flash_attn_varlen_func docstring (bottom-right since v2.1); a "
        "per-sequence reference loop with the pre-2.1 top-left alignment",
    ),
    Case(
        "varlen-padded-keys-unmasked",
        varlen_padded_keys_unmasked,
        {"mask_form": "varlen", "dtypes": FP},
        "padding-leak",
        FA + " flash_attn/bert_padding.py pad_input; keys padded to max_seqlen_k and attended without a mask",
    ),
    Case(
        "kvcache-ignores-seqlens",
        kvcache_ignores_seqlens,
        {"mask_form": "kv_cache", "layout": "bnhd", "gqa": True, "dtypes": FP},
        "padding-leak",
        FA + " flash_attn_with_kvcache docstring (cache_seqlens); a decode loop attending the whole cache",
    ),
    Case(
        "kvcache-causal-off-by-one",
        kvcache_causal_off_by_one,
        {"mask_form": "kv_cache", "layout": "bnhd", "gqa": True, "causal_align": "bottom_right", "dtypes": FP},
        "causal-leak",
        FA + " flash_attn_with_kvcache docstring; the bottom-right causal bound planted one key late",
    ),
]
