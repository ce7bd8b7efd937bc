"""Correct implementations of the second held-out set: the checker must find nothing on them."""

from __future__ import annotations

import functools

from heldout import Case
from transformers.models.gpt_neox.modeling_gpt_neox import eager_attention_forward as neox_eager
from transformers.models.whisper.modeling_whisper import eager_attention_forward as whisper_eager

from . import impls as m

TF = "transformers 5.24.0 (PyPI)"
TF4 = "huggingface/transformers v4.x (e.g. tag v4.40.0)"

CASES = [
    Case(
        "h2-ok-gpt2-cross-attn",
        m.gpt2_cross_attn,
        {"mask_convention": "additive", "mask_form": "batch"},
        source=f"{TF4} src/transformers/models/gpt2/modeling_gpt2.py GPT2Attention._attn, cross-attention branch "
        "(no causal bias), additive [B, 1, n_q, n_k] mask; the scale from query.size(-1) (fixed)",
    ),
    Case(
        "h2-ok-gpt2-causal-bottom-right",
        m.gpt2_causal_attn,
        {"causal_only": True, "causal_align": "bottom_right", "signature": "qkv"},
        source=f"{TF4} GPT2Attention._attn self-attention branch: torch.where(bias[:, :, k_len - q_len : k_len, "
        ":k_len], w, finfo.min), always causal, bottom-right (as a KV-cache step needs)",
    ),
    Case(
        "h2-ok-t5-folded-scale-lambda",
        lambda q, k, v, mask=None: m.t5_folded(q, k, v, mask),
        {"mask_convention": "additive", "ranks": (4,)},
        source=f"{TF} models/t5/modeling_t5.py T5Attention.forward (scores = q kᵀ + position_bias, no 1/sqrt(d_kv); "
        "softmax(scores.float()).type_as(scores)); the scale T5 folds into W_q's initialisation applied to q in a "
        "lambda; float64 runs in float32 (lower-precision note)",
    ),
    Case(
        "h2-ok-fairseq-key-padding-guarded",
        m.fairseq_attention,
        {"mask_convention": "block", "mask_form": "key_padding", "ranks": (4,)},
        source="facebookresearch/fairseq fairseq/modules/multihead_attention.py MultiheadAttention.forward "
        "(main branch, non-fast path after the projections: q * head_dim**-0.5, bmm over bsz*num_heads, "
        "key_padding_mask True = padding -> -inf, utils.softmax in float32), plus nan_to_num(0) for fully padded "
        "sequences",
    ),
    Case(
        "h2-ok-flax-dot-product-attention",
        m.flax_dot_product_attention,
        {"layout": "bnhd", "framework": "jax"},
        source="google/flax flax/linen/attention.py dot_product_attention_weights + dot_product_attention "
        "(query / sqrt(depth), einsum '...qhd,...khd->...hqk', jnp.where(mask, w, finfo.min), softmax), JAX, "
        "[B, n, h, d]",
    ),
    Case(
        "h2-ok-equinox-numpy",
        m.equinox_attention,
        {},
        source="patrick-kidger/equinox equinox/nn/_attention.py dot_product_attention_weights / "
        "dot_product_attention (einsum 'sd,Sd->sS', where(mask, logits, finfo.min)), rewritten in NumPy with "
        "'...' batch dims",
    ),
    Case(
        "h2-ok-allennlp-masked-softmax",
        m.allennlp_attention,
        {"mask_form": "key_padding", "ranks": (4,)},
        source="allenai/allennlp allennlp/nn/util.py masked_softmax(memory_efficient=True) "
        "(vector.masked_fill(~mask, min_value_of_dtype)) with ScaledDotProductMatrixAttention's / sqrt(d); "
        "mask [B, n_k] True = real key",
    ),
    Case(
        "h2-ok-valid-lens-numpy",
        m.valid_lens_attention,
        {"mask_form": "valid_lens", "ranks": (4,)},
        source="d2l masked_softmax interface (valid_lens [B]) written from scratch in NumPy; sequences of length 0 "
        "give zeros",
    ),
    Case(
        "h2-ok-kvcache-decode-numpy",
        m.decode_attention,
        {"layout": "bnhd", "gqa": True, "causal_align": "bottom_right", "mask_form": "kv_cache", "ranks": (4,)},
        source="Dao-AILab/flash-attention flash_attn/flash_attn_interface.py flash_attn_with_kvcache docstring "
        "(cache_seqlens, causal aligned to the bottom-right of each sequence, GQA by head groups), in NumPy",
    ),
    Case(
        "h2-ok-varlen-torch-loop",
        m.varlen_attention,
        {"mask_form": "varlen", "causal_align": "bottom_right"},
        source="Dao-AILab/flash-attention flash_attn/flash_attn_interface.py flash_attn_varlen_func semantics "
        "(cu_seqlens_q/k, causal bottom-right per sequence), a per-sequence torch loop",
    ),
    Case(
        "h2-ok-qwen2-attention-eager",
        m.qwen2_layer("eager"),
        {},
        source=f"{TF} models/qwen2/modeling_qwen2.py Qwen2Attention (eager, GQA 4/2, q/k/v biases) in module mode",
    ),
    Case(
        "h2-ok-mistral-attention-sdpa",
        m.mistral_layer("sdpa"),
        {},
        source=f"{TF} models/mistral/modeling_mistral.py MistralAttention (sdpa, GQA 4/2, sliding_window 4096 "
        "longer than every probe) in module mode",
    ),
    Case(
        "h2-ok-whisper-eager-function",
        whisper_eager,
        {},
        source=f"{TF} models/whisper/modeling_whisper.py eager_attention_forward (the real function: softmax "
        "in the input dtype, no repeat_kv)",
    ),
    Case(
        "h2-ok-gpt-neox-eager-function",
        neox_eager,
        {},
        source=f"{TF} models/gpt_neox/modeling_gpt_neox.py eager_attention_forward (the real function; softmax in "
        "float32)",
    ),
    Case(
        "h2-ok-triton-tutorial-numpy",
        m.triton_tutorial_fwd,
        {"causal_align": "top_left"},
        source="triton-lang/triton python/tutorials/06-fused-attention.py _attn_fwd / _attn_fwd_inner (online "
        "softmax in exp2 with qk_scale = sm_scale / ln 2, acc *= alpha, l_i = l_i * alpha + sum p), key blocks of "
        "16, in NumPy; causal top-left",
    ),
    Case(
        "h2-ok-sdpa-docs-reference-partial",
        functools.partial(m.sdpa_reference, dropout_p=0.0),
        {"gqa": True},
        source="torch 2.13 torch.nn.functional.scaled_dot_product_attention docstring's reference implementation, "
        "bias over the inputs' leading dims and fully masked rows set to 0; a functools.partial binding dropout_p",
    ),
    Case(
        "h2-ok-falcon-additive",
        m.falcon_attention,
        {"mask_convention": "additive"},
        source=f"{TF} models/falcon/modeling_falcon.py FalconAttention.forward eager non-alibi path "
        "(scores /= sqrt(head_dim), softmax(scores + attention_mask, dtype=hidden_states.dtype))",
    ),
    Case(
        "h2-ok-qwen2-repeat-kv-sdpa",
        m.qwen2_sdpa_gqa,
        {"gqa": True, "ranks": (4,)},
        source=f"{TF} models/qwen2/modeling_qwen2.py repeat_kv ([:, :, None].expand(...).reshape) feeding "
        "F.scaled_dot_product_attention",
    ),
    Case(
        "h2-ok-mlx-style-class",
        m.MLXStyleAttention,
        {"gqa": True, "ranks": (4,)},
        source="ml-explore/mlx mx.fast.scaled_dot_product_attention semantics (GQA without repeating K/V: queries "
        "grouped [B, h_kv, n_rep, L, D]), rewritten in NumPy; the class itself passed (instantiated with no "
        "arguments)",
    ),
]
