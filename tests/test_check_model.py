"""check-model: future tokens must not change earlier logits, padding must not change valid outputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from attnlab.checker.model import (
    check_causal_lm,
    check_encoder,
    check_model,
    hf_causal_lm,
    load_local,
    minilm,
    tiny_model,
)
from attnlab.cli import main
from attnlab.errors import OptionError

TABLE = np.random.default_rng(0).normal(size=(50, 8))


def _prefix_mean(ids):
    e = TABLE[ids]  # [B, n, 8]
    return np.cumsum(e, axis=1) / np.arange(1, ids.shape[1] + 1)[None, :, None]


def _unmasked_attention(module, query, key, value, attention_mask, **kwargs):
    """A broken attention: drops the mask and the causal flag (registered as 'attnlab-unmasked')."""
    kwargs.pop("is_causal", None)
    return sdpa_attention_forward(module, query, key, value, None, is_causal=False, **kwargs)


AttentionInterface.register("attnlab-unmasked", _unmasked_attention)


def test_plain_callables_clean_and_broken():
    assert check_causal_lm(_prefix_mean, vocab_size=50).ok
    r = check_causal_lm(lambda ids: _prefix_mean(ids[:, ::-1])[:, ::-1], vocab_size=50)
    assert r.codes == ("causal-leak",)
    assert "its future" in r.findings[0].message
    r = check_causal_lm(lambda ids: _prefix_mean(ids) + _prefix_mean(ids)[::-1], vocab_size=50)  # mixes the batch
    assert r.codes == ("batch-leak",)
    r = check_causal_lm(lambda ids: _prefix_mean(ids) + np.random.default_rng().normal(0, 1e-3), vocab_size=50)
    assert r.codes == ("nondeterministic",)

    def boom(ids):
        raise RuntimeError("out of memory")

    r = check_causal_lm(boom, vocab_size=50)
    assert r.codes == ("crash",) and "out of memory" in r.findings[0].evidence


def test_plain_encoder_callables():
    def masked_mean(ids, mask):
        e = TABLE[ids] * mask[..., None]
        return np.broadcast_to(e.sum(axis=1, keepdims=True) / mask.sum(axis=1)[:, None, None], e.shape)

    def unmasked_mean(ids, mask):
        return masked_mean(ids, np.ones_like(mask))

    assert check_encoder(masked_mean, vocab_size=50).ok
    r = check_encoder(unmasked_mean, vocab_size=50)
    assert r.codes == ("padding-leak",)
    assert "padded positions hold random tokens" in r.findings[0].message


@pytest.mark.parametrize("kind", ["gpt2", "llama", "bert"])
def test_tiny_hf_models_are_clean_and_a_broken_attention_is_caught(kind):
    for impl in ("eager", "sdpa"):
        r = check_model(tiny_model(kind, attn_implementation=impl))
        assert r.ok, r.to_text()
    r = check_model(tiny_model(kind, attn_implementation="attnlab-unmasked"))
    assert r.codes == (("padding-leak",) if kind == "bert" else ("causal-leak",)), r.to_text()


def test_dropout_left_on_is_nondeterministic():
    model = tiny_model("gpt2")
    fn = hf_causal_lm(model)
    model.train()  # hf_causal_lm put it in eval mode; a user forgetting eval() looks like this
    r = check_causal_lm(fn, vocab_size=model.config.vocab_size)
    assert "nondeterministic" in r.codes


def test_minilm_from_the_package_is_clean():
    model = minilm()
    assert model.config.num_hidden_layers == 6
    r = check_model(model, seq_len=10)
    assert r.ok, r.to_text()
    assert r.signature.startswith("encoder")


def test_bad_arguments():
    with pytest.raises(OptionError, match=r"^vocab_size: expected an int >= 2, got 1$"):
        check_causal_lm(_prefix_mean, vocab_size=1)
    with pytest.raises(OptionError, match=r"^kind: expected one of 'gpt2', 'llama', 'bert', got 'gpt5'$"):
        tiny_model("gpt5")
    with pytest.raises(OptionError, match=r"model: expected a Hugging Face model with a \.config, got function"):
        check_model(_prefix_mean)
    with pytest.raises(OptionError, match=r"^kind: expected one of 'causal-lm', 'encoder', got 'seq2seq'$"):
        check_model(tiny_model("bert"), kind="seq2seq")
    with pytest.raises(OptionError, match=r"^kind: expected one of 'causal-lm', 'encoder', got 'decoder'$"):
        load_local("/nonexistent", kind="decoder")


def test_torch_outputs_are_accepted():
    r = check_causal_lm(lambda ids: torch.from_numpy(_prefix_mean(ids)), vocab_size=50)
    assert r.ok


def test_load_local_reads_a_saved_model_offline(tmp_path, capsys):
    """load_local (what `attnlab check-model DIR` uses) gives back the model saved there, with its weights."""
    saved = tiny_model("llama", seed=3)
    saved.save_pretrained(tmp_path)
    lm = load_local(str(tmp_path), kind="causal-lm")
    assert type(lm).__name__ == "LlamaForCausalLM"
    ids = torch.arange(1, 9)[None]
    with torch.no_grad():
        torch.testing.assert_close(lm(input_ids=ids).logits, saved.eval()(input_ids=ids).logits, rtol=0, atol=0)
    base = load_local(str(tmp_path), kind="encoder")  # AutoModel: the transformer without its LM head
    assert type(base).__name__ == "LlamaModel"
    assert main(["check-model", str(tmp_path), "--kind", "causal-lm", "--seq-len", "8", "--no-color"]) == 0
    out = capsys.readouterr().out
    assert "called as causal LM" in out and "future-tokens ok" in out and "OK clean" in out
