"""check-model chooses causal vs encoder from the model's config (issue 24), and a kind the config contradicts is a
usage error, not a bug of the model (issue 23.4). The models are tiny, built from configs and saved to tmp_path."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tr

from attnlab.checker.model import check_model, config_kind, load_local, model_kind, tiny_model
from attnlab.cli import main
from attnlab.errors import OptionError


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A saved Llama causal LM, a saved BERT encoder, a saved GPT-2 LM, and a Llama saved without its LM head."""
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    dirs = {}
    for name, model in {
        "llama": tiny_model("llama"),
        "bert": tiny_model("bert"),
        "gpt2": tiny_model("gpt2"),
        "llama-base": tr.LlamaModel(tiny_model("llama").config),
    }.items():
        model.save_pretrained(root / name)
        dirs[name] = root / name
    return dirs


def test_saved_configs_say_which_kind():
    assert config_kind({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}) == (
        "causal-lm",
        "architectures ['LlamaForCausalLM']",
    )
    assert config_kind({"architectures": ["GPT2LMHeadModel"]})[0] == "causal-lm"
    assert config_kind({"architectures": ["BertForMaskedLM"], "model_type": "bert"})[0] == "encoder"
    assert config_kind({"architectures": ["BertModel"], "model_type": "bert"})[0] == "encoder"  # by model_type
    assert config_kind({"architectures": ["LlamaModel"], "model_type": "llama"})[0] == "causal-lm"
    assert config_kind({"architectures": ["BertLMHeadModel"], "model_type": "bert", "is_decoder": True}) == (
        "causal-lm",
        "is_decoder true",
    )
    assert config_kind({"model_type": "no-such-family"}) == (None, "model_type 'no-such-family'")
    assert config_kind({}) == (None, "model_type None")


def test_the_saved_config_is_what_the_directory_holds(saved):
    cfg = json.loads((saved["llama"] / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert json.loads((saved["bert"] / "config.json").read_text())["architectures"] == ["BertModel"]


@pytest.mark.parametrize(("name", "cls"), [("llama", "LlamaForCausalLM"), ("gpt2", "GPT2LMHeadModel")])
def test_a_saved_causal_lm_is_checked_as_a_causal_lm(saved, name, cls, capsys):
    """It used to be loaded with AutoModel and checked as an encoder (padding), which said OK."""
    assert type(load_local(str(saved[name]))).__name__ == cls
    assert main(["check-model", str(saved[name]), "--seq-len", "8", "--no-color", "--width", "100"]) == 0
    out = capsys.readouterr().out
    assert "called as causal LM" in out and "future-tokens ok" in out and "OK clean" in out, out
    assert "padding" not in out


def test_a_saved_causal_lm_with_a_broken_attention_is_caught(saved, capsys):
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def unmasked(module, query, key, value, attention_mask, **kwargs):
        kwargs.pop("is_causal", None)
        return sdpa_attention_forward(module, query, key, value, None, is_causal=False, **kwargs)

    AttentionInterface.register("attnlab-kind-unmasked", unmasked)
    argv = ["check-model", str(saved["llama"]), "--attn-implementation", "attnlab-kind-unmasked", "--no-color"]
    assert main(argv) == 1
    assert "BUG causal-leak" in capsys.readouterr().out


def test_a_llama_saved_without_its_head_is_still_checked_as_causal(saved, capsys):
    assert main(["check-model", str(saved["llama-base"]), "--seq-len", "8", "--no-color"]) == 0
    assert "future-tokens ok" in capsys.readouterr().out


def test_a_saved_encoder_is_checked_as_an_encoder(saved, capsys):
    assert main(["check-model", str(saved["bert"]), "--seq-len", "8", "--no-color"]) == 0
    out = capsys.readouterr().out
    assert "called as encoder" in out and "padding ok" in out, out


@pytest.mark.parametrize(
    ("model", "kind", "message"),
    [
        (
            "bert-tiny",
            "causal-lm",
            "attnlab check-model: error: --kind causal-lm: bert-tiny is an encoder by its config (architectures "
            "['BertModel'], model_type 'bert'), so it cannot be checked as causal-lm; leave --kind out (or pass "
            "--kind encoder) to check it as an encoder\n",
        ),
        ("minilm", "causal-lm", "attnlab check-model: error: --kind causal-lm: minilm is an encoder by its config"),
        ("gpt2-tiny", "encoder", "attnlab check-model: error: --kind encoder: gpt2-tiny is a causal LM by its config"),
        ("smollm2", "encoder", "attnlab check-model: error: --kind encoder: smollm2 is a causal LM by its config"),
    ],
)
def test_a_kind_the_builtin_model_contradicts_is_a_usage_error(model, kind, message, capsys):
    """issue 23.4: `check-model bert-tiny --kind causal-lm` was reported as a crash of the model (exit 1)."""
    assert main(["check-model", model, "--kind", kind]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(message), captured.err
    assert captured.out == ""


@pytest.mark.parametrize(
    ("name", "kind", "says"),
    [
        ("bert", "causal-lm", "is an encoder by its config (architectures ['BertModel'], model_type 'bert'"),
        ("llama", "encoder", "is a causal LM by its config (architectures ['LlamaForCausalLM'])"),
    ],
)
def test_a_kind_the_saved_config_contradicts_is_a_usage_error(saved, name, kind, says, capsys):
    assert main(["check-model", str(saved[name]), "--kind", kind]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnlab check-model: error: --kind {kind}: {saved[name]} {says}"), err


def test_the_agreeing_kind_is_accepted(saved, capsys):
    assert main(["check-model", str(saved["bert"]), "--kind", "encoder", "--seq-len", "8"]) == 0
    assert main(["check-model", "gpt2-tiny", "--kind", "causal-lm", "--seq-len", "8"]) == 0
    capsys.readouterr()


def test_check_model_in_python_refuses_the_contradicting_kind():
    refused = r"^kind causal-lm: BertModel is an encoder by its config \(model_type 'bert'"
    with pytest.raises(OptionError, match=refused):
        check_model(tiny_model("bert"), kind="causal-lm")
    assert check_model(tiny_model("gpt2")).signature.startswith("causal LM")
    assert model_kind({"model_type": "unknown-family"}, "encoder") == "encoder"  # a config that does not say
