"""`attnlab check-model smollm2`: the real model on attnlab's Llama passes; with its causal mask broken it fails."""

from attnlab.cli import main


def test_smollm2_is_clean(capsys):
    assert main(["check-model", "smollm2", "--seq-len", "6", "--no-color"]) == 0
    out = capsys.readouterr().out
    assert "probes: future-tokens ok" in out
    assert "OK clean: no bug found" in out


def test_smollm2_with_a_broken_causal_mask_names_the_leak(capsys):
    assert main(["check-model", "smollm2", "--seq-len", "6", "--break-causal", "--no-color"]) == 1
    out = capsys.readouterr().out
    assert "causal-leak" in out and "FAILED 1 bug found: causal-leak" in out


def test_break_causal_is_for_smollm2_only(capsys):
    assert main(["check-model", "gpt2-tiny", "--break-causal"]) == 2
    assert capsys.readouterr().err == "attnlab check-model: error: --break-causal: applies to smollm2 only\n"
