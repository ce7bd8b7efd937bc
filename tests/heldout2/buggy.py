"""Buggy implementations of the second held-out set: functions, mask interfaces and layers (module mode)."""

from __future__ import annotations

from heldout import Case

from . import impls as m

TF = "transformers 5.24.0 (PyPI)"
TF4 = "huggingface/transformers v4.x (e.g. tag v4.40.0)"

FUNCTIONS = [
    Case(
        "h2-gpt2-value-size-scale",
        m.gpt2_cross_attn_value_scale,
        {"mask_convention": "additive", "mask_form": "batch"},
        expected="scale-wrong",
        source=f"{TF4} models/gpt2/modeling_gpt2.py GPT2Attention._attn as published: attn_weights / "
        "torch.full([], value.size(-1) ** 0.5): 1/sqrt(d_v), right only while d_v == d_k (not planted, as it was)",
    ),
    Case(
        "h2-gpt2-causal-slice-top-left",
        m.gpt2_causal_attn_top_left,
        {"causal_only": True, "causal_align": "bottom_right", "signature": "qkv"},
        expected="causal-alignment",
        source=f"{TF4} GPT2Attention._attn self-attention branch; planted: bias[:, :, :q_len, :k_len] (top-left) "
        "instead of bias[:, :, k_len - q_len : k_len, :k_len], declared bottom-right (a KV-cache step)",
    ),
    Case(
        "h2-t5-unscaled-raw",
        m.t5_attention,
        {"mask_convention": "additive", "ranks": (4,)},
        expected="scale-missing",
        source=f"{TF} models/t5/modeling_t5.py T5Attention.forward core as it is (no 1/sqrt(d_kv): T5 folds it into "
        "W_q's init), checked as a standalone attention function on unscaled q (a user porting T5's function as a "
        "generic SDPA); not planted",
    ),
    Case(
        "h2-bart-sdpa-double-scale",
        m.bart_sdpa_double_scale,
        {},
        expected="scale-wrong",
        source=f"{TF4} models/bart/modeling_bart.py BartAttention (query_states = q_proj(x) * self.scaling); planted: "
        "the pre-scaled query passed to F.scaled_dot_product_attention with its default scale (1/d_k in all)",
    ),
    Case(
        "h2-flax-softmax-over-queries",
        m.flax_softmax_over_queries,
        {"layout": "bnhd", "framework": "jax"},
        expected="softmax-axis",
        source="google/flax flax/linen/attention.py dot_product_attention_weights, JAX [B, n, h, d]; planted: "
        "jax.nn.softmax(attn_weights, axis=-2) on '...hqk' weights",
    ),
    Case(
        "h2-flax-weights-rescaled",
        m.flax_weights_rescaled,
        {"layout": "bnhd", "framework": "jax"},
        expected="scale-after-softmax",
        source="google/flax flax/linen/attention.py dot_product_attention, JAX [B, n, h, d]; planted: the weights "
        "divided by sqrt(depth) again after the softmax (the query was already scaled)",
    ),
    Case(
        "h2-flax-returns-numpy",
        m.flax_returns_numpy,
        {"layout": "bnhd", "framework": "jax"},
        expected="output-type",
        source="google/flax flax/linen/attention.py dot_product_attention, JAX; planted: np.asarray(...) on the result",
    ),
    Case(
        "h2-haiku-1e30-float16",
        m.haiku_attention,
        {"framework": "jax"},
        expected="masked-row-nan",
        source="google-deepmind/dm-haiku haiku/_src/attention.py MultiHeadAttention.__call__ (attn_logits / "
        "sqrt(key_size), jnp.where(mask, attn_logits, -1e30), softmax), JAX, heads first; not planted: -1e30 is "
        "-inf in float16, so a fully masked row is NaN there (uniform in float32)",
    ),
    Case(
        "h2-softmax-dim2-from-3d",
        m.softmax_dim2_from_3d,
        {},
        expected="softmax-axis",
        source="a [B*h, n, d] implementation (F.softmax(s, dim=2), as OpenNMT-py's and fairseq's 3-D bmm code "
        "would have) fed [B, h, n, d] tensors: dim 2 is then the query axis; right on 3-D inputs",
    ),
    Case(
        "h2-sdpa-mask-elif-causal",
        m.sdpa_mask_or_causal,
        {},
        expected="causal-leak",
        source="an SDPA-like wrapper (torch SDPA itself refuses attn_mask with is_causal): 'if attn_mask is not None: "
        "... elif is_causal: tril' drops the causal part whenever a mask is given",
    ),
    Case(
        "h2-tinygrad-causal-replaces-mask",
        m.tinygrad_sdpa,
        {},
        expected="padding-leak",
        second="masked-row-nan",
        source="tinygrad/tinygrad tinygrad/tensor.py Tensor.scaled_dot_product_attention (2024), in torch, as "
        "published: 'if is_causal: attn_mask = ones(...).tril(0)' replaces a given mask; the bool mask becomes "
        "(mask == 0).where(-inf, 0), so a fully masked row is NaN",
    ),
    Case(
        "h2-unmask-empty-rows-inplace",
        m.unmask_empty_rows_inplace,
        {},
        expected="mutates-input",
        source="the 'allow every key on a fully masked row to avoid NaN' workaround (cf. pytorch/pytorch#41508), "
        "planted as attn_mask[empty] = True on the caller's tensor",
    ),
    Case(
        "h2-numpy-returns-float32",
        m.numpy_weights_float32,
        {"compute_dtype": "input"},
        expected="dtype",
        source="equinox-style NumPy attention; planted: (w @ v).astype(np.float32) 'to save memory' (float64 and "
        "float16 inputs get float32 back). Declared compute_dtype='input' by the lead: undeclared, a float32 result "
        "is the documented lower-precision note, because issue 13 requires xformers' ref_attention (which returns "
        "float32 for every input dtype in the same way) to come out clean",
    ),
    Case(
        "h2-f-dropout-default-training",
        m.dropout_default_training,
        {},
        expected="nondeterministic",
        source="torch.nn.functional.dropout(x, p) defaults to training=True (torch docs), planted in a manual "
        "attention at inference; also softmax(s.float()) @ v.float() returned as float32 for every dtype, planted as "
        "a second bug and unmarked by the lead: undeclared, that is the documented lower-precision note (issue 13 "
        "requires xformers' ref_attention, which returns float32 for every dtype the same way, to come out clean)",
    ),
    Case(
        "h2-triton-tutorial-acc-not-rescaled",
        m.triton_tutorial_fwd_no_alpha,
        {"causal_align": "top_left"},
        expected="not-normalized",
        source="triton-lang/triton python/tutorials/06-fused-attention.py _attn_fwd_inner in NumPy; planted: "
        "'acc = acc * alpha[:, None]' removed (l_i is still rescaled)",
    ),
    Case(
        "h2-bmm-head-major-keys",
        m.bmm_head_major_keys,
        {"signature": "qkv", "ranks": (4,)},
        expected="batch-leak",
        source="fairseq-style (bsz*num_heads) folding for torch.bmm; planted: k and v folded head-major "
        "(transpose(0, 1).reshape) while q is folded batch-major",
    ),
    Case(
        "h2-keep-to-additive-inverted",
        m.keep_to_additive_inverted,
        {"mask_convention": "keep"},
        expected="mask-inverted",
        source=f"{TF4} modeling_utils.py get_extended_attention_mask ((1.0 - mask) * finfo.min) in NumPy; planted: "
        "mask * finfo.min (the 1 - dropped: the kept keys get the fill)",
    ),
    Case(
        "h2-fp16-min-fill-every-dtype",
        m.fp16_min_fill,
        {},
        expected="finite-fill",
        source="masked_fill(~mask, torch.finfo(torch.float16).min) hard-coded for every dtype (a -65504 fill "
        "written for fp16 checkpoints; right in float16, a finite fill in float32/float64/bfloat16)",
    ),
    Case(
        "h2-qk-bfloat16",
        m.qk_bfloat16,
        {},
        expected="precision",
        source="Q Kᵀ computed in bfloat16 'for speed' (cf. the fp16/bf16 attention precision reports, "
        "mlc-ai/mlc-llm#1638) and cast back to the input dtype; the rest in the input dtype",
    ),
    Case(
        "h2-unpack-four-dims",
        m.unpack_four_dims,
        {},
        expected="crash",
        source="'bsz, n_heads, n_q, d = q.shape' in a function that otherwise takes any rank: ValueError (not enough "
        "values to unpack) on every 3-D call, ranks not declared",
    ),
    Case(
        "h2-documented-raise-whole-mask",
        m.documented_raise,
        {"masked_rows": "raise"},
        expected="masked-row-policy",
        source="a NumPy attention documented to raise on a query with no allowed key; planted: the check is "
        "'not mask.any()' over the whole mask, so one empty row passes and comes back uniform (finfo.min fill)",
    ),
    Case(
        "h2-qwen2-repeat-kv-outer-axis",
        m.qwen2_sdpa_gqa_outer,
        {"gqa": True, "ranks": (4,)},
        expected="gqa-mapping",
        source=f"{TF} models/qwen2/modeling_qwen2.py repeat_kv; planted: hidden_states[:, None].expand(b, n_rep, "
        "h_kv, ...) (the new axis before the K/V heads: tile) where interleave is declared",
    ),
    Case(
        "h2-mlx-style-grouped-tile",
        m.MLXStyleAttentionTiled(),
        {"gqa": True, "ranks": (4,)},
        expected="gqa-mapping",
        source="ml-explore/mlx fast.scaled_dot_product_attention GQA semantics in NumPy, an instance with __call__; "
        "planted: queries grouped q.reshape(B, n_rep, h_kv, L, D) (tile) where interleave is declared",
    ),
    Case(
        "h2-naive-logsumexp",
        m.naive_logsumexp,
        {},
        expected="unstable-softmax",
        source="a FlashAttention-style forward written as P = exp(S - lse) (Dao et al. 2022, arXiv:2205.14135, "
        "lse = m + log l) with lse computed as log(sum(exp(S))) without the row max: exp(1000) = inf, exp(-1000) = 0",
    ),
    Case(
        "h2-equinox-unscaled-neg-inf",
        m.equinox_unscaled_neg_inf,
        {},
        expected="scale-missing",
        second="masked-row-nan",
        source="patrick-kidger/equinox equinox/nn/_attention.py dot_product_attention_weights in NumPy; planted: "
        "the / sqrt(d) dropped and -inf instead of finfo.min (a fully masked row is NaN)",
    ),
    Case(
        "h2-distilbert-key-padding-finfo-float32-tensor",
        m.distilbert_attention,
        {"mask_convention": "keep", "mask_form": "key_padding", "ranks": (4,)},
        expected="masked-row-nan",
        source=f"{TF4} models/distilbert/modeling_distilbert.py MultiHeadSelfAttention.forward: q / sqrt(dim), "
        "(mask == 0).view(bs, 1, 1, k_len), masked_fill(torch.tensor(finfo(scores.dtype).min)). Written as correct; "
        "the checker found (and the lead confirmed by hand) that in float64 torch.tensor(finfo(float64).min) is a "
        "float32 tensor, i.e. -inf, so a fully padded sequence is NaN in float64 (finite in float32 and below)",
    ),
]

INTERFACES = [
    Case(
        "h2-distilbert-keep-inverted",
        m.distilbert_attention_inverted,
        {"mask_convention": "keep", "mask_form": "key_padding", "ranks": (4,)},
        expected="mask-inverted",
        source=f"{TF4} models/distilbert/modeling_distilbert.py MultiHeadSelfAttention.forward; planted: "
        "(mask == 1) instead of (mask == 0) as the blocked positions",
    ),
    Case(
        "h2-batch-keep-multiplied-after-softmax",
        m.batch_keep_after_softmax,
        {"mask_convention": "keep", "mask_form": "batch"},
        expected="mask-after-softmax",
        source="a NumPy port of a Hugging Face 4-D keep mask ([B, 1, n_q, n_k], 1 = keep) that multiplies the "
        "weights by it after the softmax instead of adding (1 - mask) * finfo.min before (planted)",
    ),
    Case(
        "h2-fairseq-key-padding-as-published",
        m.fairseq_attention_as_published,
        {"mask_convention": "block", "mask_form": "key_padding", "ranks": (4,)},
        expected="masked-row-nan",
        source="facebookresearch/fairseq fairseq/modules/multihead_attention.py MultiheadAttention.forward as "
        "published (key_padding_mask -> -inf, softmax): a fully padded sequence is NaN; not planted",
    ),
    Case(
        "h2-fairseq-key-padding-head-major",
        m.fairseq_attention_head_major,
        {"mask_convention": "block", "mask_form": "key_padding", "ranks": (4,)},
        expected="mask-wrong-heads",
        source="facebookresearch/fairseq fairseq/modules/multihead_attention.py (guarded as the correct case); "
        "planted: attn_weights.view(num_heads, bsz, ...) masked with key_padding_mask[None, :, None, :] while "
        "the scores are folded batch-major",
    ),
    Case(
        "h2-fairseq-unscaled-nan",
        m.fairseq_attention_unscaled_nan,
        {"mask_convention": "block", "mask_form": "key_padding", "ranks": (4,)},
        expected="scale-missing",
        second="masked-row-nan",
        source="facebookresearch/fairseq fairseq/modules/multihead_attention.py as published (NaN on a fully padded "
        "sequence) with the q * self.scaling line dropped (planted)",
    ),
    Case(
        "h2-valid-lens-on-queries",
        m.valid_lens_on_queries,
        {"mask_form": "valid_lens", "ranks": (4,)},
        expected="padding-leak",
        source="d2l masked_softmax interface (valid_lens [B]) in NumPy; planted: the lengths mask the query rows "
        "after the softmax (arange(n_q) < valid_lens) instead of the key columns before it",
    ),
    Case(
        "h2-kvcache-causal-global-offset",
        m.decode_attention_global_offset,
        {"layout": "bnhd", "gqa": True, "causal_align": "bottom_right", "mask_form": "kv_cache", "ranks": (4,)},
        expected="causal-leak",
        source="flash_attn_with_kvcache semantics (Dao-AILab/flash-attention flash_attn/flash_attn_interface.py) "
        "in NumPy; planted: the causal offset taken from the padded cache size n_k instead of cache_seqlens[b], so "
        "a shorter sequence's new queries see each other's future",
    ),
    Case(
        "h2-kvcache-seqlens-inclusive",
        m.decode_attention_inclusive,
        {"layout": "bnhd", "gqa": True, "causal_align": "bottom_right", "mask_form": "kv_cache", "ranks": (4,)},
        expected="padding-leak",
        source="flash_attn_with_kvcache semantics in NumPy; planted: keys j <= cache_seqlens[b] (the slot after the "
        "cache, not yet written, is attended)",
    ),
    Case(
        "h2-varlen-no-block-diagonal",
        m.varlen_attention_packed,
        {"mask_form": "varlen", "causal_align": "bottom_right"},
        expected="batch-leak",
        source="flash_attn_varlen_func semantics; planted: the packed batch attended as one sequence (the "
        "cross-contamination of packing without a block-diagonal mask, cf. huggingface/trl packing discussions)",
    ),
]

MODULES = [
    Case(
        "h2-module-qwen2-mask-dropped",
        m.qwen2_layer("heldout2_mask_dropped"),
        {},
        expected="padding-leak",
        source=f"{TF} Qwen2Attention with an AttentionInterface function that drops attention_mask (the "
        "check-model example of docs/checker.md, as a layer); module mode",
    ),
    Case(
        "h2-module-mistral-own-dropout",
        m.mistral_layer("heldout2_own_dropout", attention_dropout=0.1),
        {},
        expected="nondeterministic",
        source=f"{TF} MistralAttention (attention_dropout=0.1, .eval()) with an AttentionInterface function that "
        "ignores dropout= (0.0 in eval) and applies config.attention_dropout with training=True; module mode",
    ),
    Case(
        "h2-module-qwen2-neox-hidden-norm",
        m.qwen2_layer("heldout2_neox_norm"),
        {},
        expected="scale-wrong",
        source=f"{TF} models/gpt_neox/modeling_gpt_neox.py's norm_factor written as sqrt(hidden_size) instead of "
        "sqrt(head_size), in an AttentionInterface function under Qwen2Attention; module mode (1/sqrt(d_model))",
    ),
]

CASES = [*FUNCTIONS, *INTERFACES, *MODULES]
