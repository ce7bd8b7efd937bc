"""Real libraries and faithful transcriptions come out clean with their defaults, each in at most 3 lines of
user code (module mode for layers taking hidden states); contracts a user can declare."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from zoo import numpy_zoo as npz

from attnlab.checker import check


def _clean(r):
    assert r.ok, r.to_text()
    assert r.framework == "torch"
    return r


def _untested(r):
    return {u.capability for u in r.unsupported}


def test_multihead_attention_instance_in_module_mode():
    layer = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    r = _clean(check(layer))
    assert "MultiheadAttention" in r.mode and r.kind == "a torch.nn.Module (MultiheadAttention)"
    assert {"mask", "causal", "cross"}.isdisjoint(_untested(r))  # masks, causal (via the mask), n_q != n_k tested
    r = _clean(check(torch.nn.MultiheadAttention(12, 3), dtypes=("float32",)))  # batch_first=False
    assert "cross" not in _untested(r)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_hugging_face_llama_attention_with_rotary_and_gqa(impl):
    import transformers
    from transformers.models.llama.modeling_llama import LlamaAttention

    cfg = transformers.LlamaConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, attn_implementation=impl
    )
    r = _clean(check(LlamaAttention(cfg, layer_idx=0)))
    assert "gqa" not in _untested(r) and "mask" not in _untested(r)  # GQA (repeat_kv: interleave) tested
    assert f"({impl})" in r.mode and "rotary cos = 1" in r.mode
    if impl == "eager":  # the softmax is upcast to float32: float64 inputs are judged under float32's rule
        assert "lower-precision" in {n.code for n in r.notes}


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_hugging_face_bert_self_attention(impl):
    import transformers
    from transformers.models.bert.modeling_bert import BertSelfAttention

    cfg = transformers.BertConfig(hidden_size=32, num_attention_heads=4, attn_implementation=impl)
    _clean(check(BertSelfAttention(cfg).eval()))  # eval(): attention dropout 0.1 is on in training mode


def test_bert_in_training_mode_is_nondeterministic():
    import transformers
    from transformers.models.bert.modeling_bert import BertSelfAttention

    cfg = transformers.BertConfig(hidden_size=32, num_attention_heads=4, attn_implementation="eager")
    r = check(BertSelfAttention(cfg), probes=("reference", "determinism"))
    assert "nondeterministic" in r.codes


def test_hugging_face_eager_attention_forward_function():
    from transformers.models.llama.modeling_llama import eager_attention_forward

    r = _clean(check(eager_attention_forward))
    assert "stand-in module" in r.mode and "gqa" not in _untested(r) and "scale" not in _untested(r)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_hugging_face_gpt2_attention_with_its_fused_c_attn(impl):
    import transformers
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    cfg = transformers.GPT2Config(n_embd=32, n_head=4, attn_implementation=impl)
    r = _clean(check(GPT2Attention(cfg, layer_idx=0).eval()))  # eval(): attn_pdrop and resid_pdrop are 0.1
    assert "c_attn returns the checker's [q | k | v]" in r.mode and "mask" not in _untested(r)
    assert "cross" in _untested(r) and "gqa" in _untested(r)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_hugging_face_bart_and_whisper_attention_with_cross_attention(impl):
    import transformers
    from transformers.models.bart.modeling_bart import BartAttention
    from transformers.models.whisper.modeling_whisper import WhisperAttention

    for layer in (
        BartAttention(32, 4, config=transformers.BartConfig(d_model=32, attn_implementation=impl)),
        WhisperAttention(32, 4, config=transformers.WhisperConfig(d_model=32, attn_implementation=impl)),
    ):
        r = _clean(check(layer))
        assert "out_proj identity" in r.mode and {"cross", "mask"}.isdisjoint(_untested(r))  # key_value_states


def test_hugging_face_t5_attention_is_checked_with_its_scale_named():
    import transformers
    from transformers.models.t5.modeling_t5 import T5Attention

    cfg = transformers.T5Config(d_model=32, d_kv=8, num_heads=4, dropout_rate=0.0)
    r = _clean(check(T5Attention(cfg, layer_idx=0)))
    assert "q/k/v return the checker's q, k, v, o identity, a 4-D additive mask" in r.mode
    assert "scales the scores by 1, not 1/sqrt(head_dim = 8)" in r.mode  # T5 folds 1/sqrt(d_k) into W_q


def test_a_buggy_kernel_registered_with_hugging_face_is_named_through_the_layer():
    """A kernel plugged into Hugging Face's AttentionInterface (how users add their own) that drops the mask:
    checked through an unmodified BartAttention, the bug is named."""
    import transformers
    from transformers import AttentionInterface
    from transformers.models.bart.modeling_bart import BartAttention
    from transformers.models.bart.modeling_bart import eager_attention_forward as bart_eager

    def no_mask_kernel(module, query, key, value, attention_mask, **kwargs):
        return bart_eager(module, query, key, value, None, **kwargs)

    AttentionInterface.register("attnlab_test_no_mask", no_mask_kernel)
    cfg = transformers.BartConfig(d_model=32, attn_implementation="attnlab_test_no_mask")
    r = check(BartAttention(32, 4, config=cfg), probes=("reference", "padding"))
    assert "padding-leak" in r.codes and "attnlab_test_no_mask" in r.mode, r.to_text()


@pytest.mark.parametrize(("impl", "rotary_share"), [("eager", 1.0), ("sdpa", 0.25)])
def test_hugging_face_gpt_neox_attention_with_its_per_head_fused_query_key_value(impl, rotary_share):
    import transformers
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXAttention

    cfg = transformers.GPTNeoXConfig(hidden_size=32, num_attention_heads=4, attn_implementation=impl)
    cfg.rope_parameters["partial_rotary_factor"] = rotary_share  # Pythia rotates a quarter of each head
    r = _clean(check(GPTNeoXAttention(cfg, layer_idx=0)))
    assert "[q_h | k_h | v_h] per head" in r.mode and "rotary cos = 1" in r.mode and "mask" not in _untested(r)


def test_a_buggy_kernel_in_a_gpt_neox_layer_is_named():
    import transformers
    from transformers import AttentionInterface
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXAttention, eager_attention_forward

    def scale_ignored(module, query, key, value, attention_mask, scaling, **kwargs):
        return eager_attention_forward(module, query, key, value, attention_mask, 1.0, **kwargs)

    AttentionInterface.register("attnlab_test_scale_ignored", scale_ignored)
    cfg = transformers.GPTNeoXConfig(hidden_size=32, num_attention_heads=4)
    cfg._attn_implementation = "attnlab_test_scale_ignored"
    r = check(GPTNeoXAttention(cfg, layer_idx=0), probes=("reference",))
    assert r.codes == ("scale-missing",), r.to_text()


def test_a_layer_of_hidden_states_from_an_unknown_family_is_a_usage_error_not_a_crash():
    import transformers
    from transformers.models.falcon.modeling_falcon import FalconAttention

    from attnlab.checker import UsageError

    class Block(torch.nn.Module):
        def forward(self, x, attention_mask=None):
            return x

    layer = FalconAttention(transformers.FalconConfig(hidden_size=32, num_attention_heads=4), layer_idx=0)
    for m, name in ((layer, "FalconAttention"), (Block(), "Block")):
        with pytest.raises(UsageError, match=rf"fn: {name}.forward takes hidden states .* not q, k, v.*wrap it"):
            check(m)


_HF_MODELS = "gpt2 bart whisper t5 opt gpt_neox gptj vit deit clip siglip distilbert roberta electra".split()
_HF_GQA_MODELS = "mistral mixtral qwen2 gemma gemma2 phi starcoder2 olmo cohere stablelm".split()


@pytest.mark.parametrize("model", _HF_MODELS + _HF_GQA_MODELS)
def test_hugging_face_eager_attention_functions_of_many_models_are_clean(model):
    """Each model's own eager_attention_forward: those without K/V head expansion (GPT-2, BART, ViT...) are not
    tried with GQA (they would fail with a shape error, which is not a bug of theirs), the others are."""
    import importlib

    fn = importlib.import_module(f"transformers.models.{model}.modeling_{model}").eager_attention_forward
    r = _clean(check(fn))
    grouped = model in _HF_GQA_MODELS
    assert ("gqa" in _untested(r)) is not grouped, r.to_text()


def test_x_transformers_attend():
    from x_transformers import attend as attend

    r = _clean(check(attend.Attend()))  # (out, Intermediates): the pair's second item is not weights
    assert r.kind == "a torch.nn.Module (Attend)" and r.mode == ""
    _clean(check(attend.Attend, probes=("reference", "masked-rows", "causal", "padding")))  # the class itself


@pytest.mark.parametrize("fused", [True, False])
def test_timm_attention_transcription(fused):
    from zoo.layers import TimmAttention

    r = check(TimmAttention(32, 4, fused_attn=fused))
    if fused:
        _clean(r)
    else:  # the manual path fills -inf: a fully masked row is NaN, unless that policy is declared
        assert r.codes == ("masked-row-nan",), r.to_text()
        _clean(check(TimmAttention(32, 4, fused_attn=False), masked_rows="nan"))


@pytest.mark.parametrize("flash", [True, False])
def test_nanogpt_causal_self_attention_transcription(flash):
    from zoo.layers import CausalSelfAttention, GPTConfig

    layer = CausalSelfAttention(GPTConfig(n_embd=32, n_head=4, block_size=64))
    if not flash:
        layer.flash = False
        layer.register_buffer("bias", torch.tril(torch.ones(64, 64)).view(1, 1, 64, 64))
    r = _clean(check(layer))
    assert "causal" not in _untested(r) and "mask" in _untested(r)  # always causal, no mask argument


def test_nanogpt_without_its_causal_mask_leaks():
    from zoo.layers import CausalSelfAttention, GPTConfig

    layer = CausalSelfAttention(GPTConfig(n_embd=32, n_head=4, block_size=64))
    layer.flash = False
    layer.register_buffer("bias", torch.ones(1, 1, 64, 64))  # the tril forgotten
    assert "causal-leak" in check(layer, probes=("reference", "causal")).codes


def test_flash_attn_attention_ref_and_xformers_ref_attention_transcriptions():
    from zoo.references import attention_ref, ref_attention

    r = _clean(check(attention_ref, layout="bnhd", mask_arg="attn_bias", mask_convention="additive", gqa=True))
    assert "lower-precision" in {n.code for n in r.notes}  # upcast=True computes float64 inputs in float32
    r = _clean(check(ref_attention, layout="bnhd", mask_arg="attn_bias", mask_convention="additive"))
    assert "lower-precision" in {n.code for n in r.notes}  # returns float32 for every dtype: not a dtype bug
    r = check(ref_attention, layout="bnhd", mask_arg="attn_bias", mask_convention="additive", compute_dtype="input")
    assert "dtype" in r.codes  # held to each input dtype, it is one


def test_attnlab_module_mode_via_target_string(tmp_path):
    f = tmp_path / "layer.py"
    f.write_text("import torch\nlayer = torch.nn.MultiheadAttention(8, 2, batch_first=True)\n")
    r = check(f"{f}:layer", dtypes=("float32",))
    assert r.ok and r.isolation == "worker process" and "MultiheadAttention" in r.mode, r.to_text()


# ------------------------------------------------------------------------------------------------ contracts
def test_gqa_mapping_contract():
    assert check(npz.gqa_correct, gqa="interleave").ok
    r = check(npz.gqa_correct, gqa="tile", probes=("reference",))
    assert r.codes == ("gqa-mapping",) and "declared (gqa='tile')" in r.findings[0].message


def test_masked_row_policy_contract():
    r = check(npz.finfo_min_fill, masked_rows="zeros")
    assert r.codes == ("masked-row-policy",) and "uniform average" in r.findings[0].message
    assert check(npz.finfo_min_fill, masked_rows="uniform").ok
    assert check(npz.masked_row_nan, masked_rows="nan").ok
    assert "masked-row-nan" in check(npz.masked_row_nan).codes


def test_masked_rows_any_accepts_zeros_uniform_or_an_error_but_not_an_arbitrary_row():
    def row_unmasked(q, k, v, mask=None):
        """Correct, except a row with no allowed key attends to every key (as if it had no mask)."""
        if mask is not None:
            mask = np.where(mask.any(axis=-1, keepdims=True), mask, True)
        return npz.correct(q, k, v, mask)

    def row_of_ones(q, k, v, mask=None):
        out = npz.correct(q, k, v, mask)
        return out if mask is None else np.where(mask.any(axis=-1)[..., None], out, 1.0)

    for fn, became in ((row_unmasked, "neither zeros nor a uniform average"), (row_of_ones, "neither zeros")):
        r = check(fn, probes=("reference", "masked-rows"))  # masked_rows="any", the default
        assert r.codes == ("masked-row-policy",), r.to_text()
        assert (
            became in r.findings[0].message and "which allows an error, zeros or the uniform" in r.findings[0].message
        )
    for fn in (npz.correct, npz.finfo_min_fill):  # zeros, the uniform average: documented, a note
        r = check(fn, probes=("reference", "masked-rows"))
        assert r.findings == () and "masked-row" in {n.code for n in r.notes}, r.to_text()


def test_ranks_contract_never_calls_with_3d():
    def four_d_only(q, k, v, mask=None):
        assert q.ndim == 4  # an AssertionError is a crash, not a refusal
        return npz.correct(q, k, v, mask)

    assert "crash" in check(four_d_only).codes
    r = check(four_d_only, ranks=(4,))
    assert r.ok and next(u.reason for u in r.unsupported if u.capability == "rank") == "declared ranks=(4,)"


def test_causal_when_no_mask_contract():
    def causal_by_default(q, k, v, mask=None):
        import attnlab.masks as m

        if mask is None:
            mask = m.causal(q.shape[-2], k.shape[-2])
        return npz.correct(q, k, v, mask)

    assert "causal-leak" in check(causal_by_default).codes or not check(causal_by_default).ok
    assert check(causal_by_default, causal_when_no_mask=True).ok


def test_compute_dtype_contract():
    def computes_in_float32(q, k, v, mask=None):
        return npz.correct(q.astype("float32"), k.astype("float32"), v.astype("float32"), mask).astype(q.dtype)

    r = check(computes_in_float32)
    assert r.ok and "lower-precision" in {n.code for n in r.notes}
    r = check(computes_in_float32, compute_dtype="float32")
    assert r.ok and any("as declared" in n.message for n in r.notes if n.code == "lower-precision")
    assert not check(computes_in_float32, compute_dtype="input").ok


# ------------------------------------------------------------------------------------------------ mask interfaces
def _ran(r, *names):
    status = {p.name: p.status for p in r.probes}
    return all(status[n] == "passed" for n in names)


def test_key_padding_masks_in_both_conventions():
    r = check(npz.key_padding_attention)  # the parameter name key_padding_mask selects the [B, n_k] form
    assert r.ok and r.spec["mask_form"] == "full", r.to_text()
    assert _ran(r, "padding", "masked-rows", "causal")  # causal through its flag, padding separately
    r = check(
        lambda q, k, v, key_padding_mask=None, is_causal=False: npz.key_padding_attention(
            q, k, v, None if key_padding_mask is None else ~key_padding_mask, is_causal
        ),
        mask_convention="block",  # nn.MultiheadAttention's key_padding_mask: True = padding
    )
    assert r.ok and _ran(r, "padding", "masked-rows"), r.to_text()
    r = check(npz.key_padding_on_queries, probes=("reference", "padding"))
    assert "padding-leak" in r.codes
    assert "key_padding_mask=bool [2, " in next(f for f in r.findings if f.code == "crash").evidence


def test_valid_lengths():
    # d2l's masked_softmax fills with -1e6: a finite fill, which blocked keys beat once the scores are below -1e6;
    # in float16 -1e6 is -inf, so a sequence of valid length 0 is NaN there
    r = check(npz.masked_softmax_valid_lens)
    assert r.codes == ("finite-fill", "masked-row-nan"), r.to_text()
    assert {p.name: p.status for p in r.probes}["masked-rows"] == "failed"  # it ran, and found the float16 NaN
    assert "in float16 (finite in float64)" in r.findings[1].message
    note = next(n for n in r.notes if n.code == "masked-row")  # length 0: d2l's -1e6 fill gives the uniform average
    assert "uniform average" in note.message and "length 0" in note.evidence


def test_per_batch_masks_broadcast_over_heads():
    def per_batch(q, k, v, mask=None):  # reads [B, 1, n_q, n_k]: head 0's mask for every head
        return npz.correct(q, k, v, None if mask is None else mask[:, :1])

    assert not check(per_batch, probes=("reference",)).ok  # given per-head masks, it is wrong
    r = check(per_batch, mask_form="batch")
    assert r.ok and _ran(r, "padding", "masked-rows"), r.to_text()


def test_hugging_face_4d_additive_mask_function():
    import torch as torch_

    def hf_style(q, k, v, attention_mask=None):  # [B, 1, n_q, n_k] additive, as Hugging Face's eager path
        s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        if attention_mask is not None:
            assert attention_mask.shape[1] == 1
            s = s + attention_mask
        return torch_.softmax(s, dim=-1) @ v

    r = check(hf_style, mask_form="batch", mask_convention="additive", probes=("reference", "padding", "masked-rows"))
    assert r.ok, r.to_text()


def test_kv_cache_decode_kernel_with_per_sequence_lengths():
    from zoo.references import kvcache_attention

    r = check(kvcache_attention, layout="bnhd", gqa=True, causal_align="bottom_right")
    assert r.ok and _ran(r, "padding", "masked-rows", "causal"), r.to_text()

    def top_left_per_sequence(q, k_cache, v_cache, cache_seqlens=None, causal=False, softmax_scale=None):
        if cache_seqlens is not None and causal:  # aligns each sequence's queries to its first keys: wrong
            n_q = q.shape[1]
            cache_seqlens = torch.minimum(cache_seqlens, torch.full_like(cache_seqlens, n_q))
        return kvcache_attention(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale)

    r = check(top_left_per_sequence, layout="bnhd", causal_align="bottom_right", probes=("reference",))
    assert r.codes == ("reference-mismatch",), r.to_text()
    assert "causal+mask+cross" in r.findings[0].evidence  # per-sequence bottom-right, n_k > n_q, B = 2


def test_packed_variable_length_batches():
    from zoo.references import varlen_attention

    r = check(varlen_attention, gqa=True, causal_align="bottom_right", dtypes=("float64", "float32"))
    assert r.ok and _ran(r, "padding", "masked-rows", "causal"), r.to_text()

    def ignores_cu_seqlens_k(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, softmax_scale=None
    ):
        return varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_q, max_seqlen_q, max_seqlen_q, causal, softmax_scale)

    assert not check(ignores_cu_seqlens_k, gqa=True, dtypes=("float32",), probes=("reference",)).ok


@pytest.mark.parametrize(
    "option",
    [
        ("framework", "numpy"),
        ("layout", "bnhd"),
        ("mask_convention", "block"),
        ("signature", "plain"),
        ("returns", "output+weights"),
        ("mask_form", "varlen"),
        ("mask_form", "key_padding"),
    ],
)
def test_module_mode_refuses_options_it_cannot_honour(option, capsys, tmp_path):
    """Module mode builds the layer's call itself: these options were ignored (and the verdict said clean), and
    ``--mask-form varlen`` crashed inside the checker's own wrapper; now each is a usage error naming the option."""
    from attnlab.checker import UsageError
    from attnlab.cli import main

    name, value = option
    layer = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    with pytest.raises(UsageError) as err:
        check(layer, **{name: value})
    message = str(err.value)
    assert message.startswith(f"{name}={value!r} (--{name.replace('_', '-')}): ") and "module mode" in message
    if option != ("mask_form", "varlen"):
        return  # the command line once (a worker process imports torch: seconds)
    f = tmp_path / "layer.py"
    f.write_text("import torch\nlayer = torch.nn.MultiheadAttention(8, 2, batch_first=True)\n")
    assert main(["check", f"{f}:layer", f"--{name.replace('_', '-')}", value]) == 2
    err = capsys.readouterr().err
    assert f"--{name.replace('_', '-')} cannot be honoured" in err and "Traceback" not in err
