"""``attnlab check`` and ``attnlab check-model`` on the command line: exit codes, text at a fixed width, JSON."""

from __future__ import annotations

import json
import textwrap

import pytest

from attnlab.cli import main

USER_FILE = textwrap.dedent(
    '''
    import math
    import numpy as np


    def attention(q, k, v, mask=None):
        s = q @ np.swapaxes(k, -1, -2) / q.dtype.type(math.sqrt(q.shape[-1]))
        if mask is not None:
            s = np.where(mask, s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isfinite(m), m, 0))
        d = e.sum(axis=-1, keepdims=True)
        return np.divide(e, d, out=np.zeros_like(e), where=d > 0) @ v


    def blocked(q, k, v, mask=None):
        """True = blocked, read as True = may attend."""
        return attention(q, k, v, mask)


    NOT_A_FUNCTION = 3
    '''
)


@pytest.fixture
def user_file(tmp_path, monkeypatch):
    (tmp_path / "my_attention.py").write_text(USER_FILE)
    monkeypatch.chdir(tmp_path)
    return "my_attention.py"


def _lines(capsys):
    out = capsys.readouterr().out
    return [line.rstrip() for line in out.splitlines()]


def test_clean_file_target_exits_0_with_the_report(user_file, capsys):
    code = main(["check", f"{user_file}:attention", "--width", "100", "--no-color"])
    lines = _lines(capsys)
    assert code == 0
    assert lines[0] == f"attnlab check: {user_file}:attention"
    assert lines[1] == "  numpy, called as fn(q, k, v, mask=)"
    assert (
        lines[2]
        == "NOTE padding-nan: NaN in the K/V of padded keys spreads into valid outputs (0 × NaN = NaN in weights"
    )
    assert "not tested: bfloat16 (NumPy has no bfloat16)" in lines
    assert lines[-3].startswith("probes: preflight ok, reference ok, invariants skip, normalization ok, causal ok,")
    assert lines[-2] == (
        "masked-rows ok, large-logits ok, batch ok, determinism ok, call-order ok, mask-space ok, decode ok"
    )
    assert lines[-1].startswith("OK clean: no bug found (2 notes; not tested: scale, gqa, bfloat16);")
    assert all(len(line) <= 100 for line in lines)


def test_declared_convention_mismatch_exits_1_and_names_the_bug(user_file, capsys):
    code = main(["check", f"{user_file}:blocked", "--mask-convention", "block", "--width", "100", "--no-color"])
    lines = _lines(capsys)
    assert code == 1
    assert lines[2] == (
        "BUG mask-inverted: your function treats True as 'may attend' (the mask is read inverted; declared"
    )
    assert lines[3] == "True = blocked)"
    assert any(line.startswith("  fix: convert the mask at the boundary") for line in lines)
    assert lines[-1].startswith("FAILED 1 bug found: mask-inverted")


def test_module_target_and_json(capsys):
    code = main(["check", "zoo.numpy_zoo:scale_missing", "--json", "--probes", "reference,determinism"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert data["target"] == "zoo.numpy_zoo:scale_missing"
    assert [f["code"] for f in data["findings"]] == ["scale-missing"]
    assert data["findings"][0]["fix"].startswith("multiply Q Kᵀ by 1/sqrt(d_k)")


def test_options_reach_the_checker(capsys):
    code = main(
        [
            "check",
            "zoo.numpy_zoo:refuses_half",
            "--json",
            "--dtypes",
            "float64,float32",
            "--unsupported",
            "mask",
            "--timeout",
            "5",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["spec"]["dtypes"] == ["float64", "float32"]
    caps = {u["capability"]: u["reason"] for u in data["unsupported"]}
    assert caps["mask"] == "declared unsupported"
    assert caps["float16"] == "not in the dtypes to try"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "nowhere.py:f"], "attnlab check: error: target 'nowhere.py:f': file nowhere.py does not exist"),
        (
            ["check", "just_a_name"],
            "attnlab check: error: target 'just_a_name': expected path/to/file.py:func or package.module:func",
        ),
        (["check", "zoo.numpy_zoo:missing"], "attnlab check: error: zoo.numpy_zoo has no attribute 'missing'"),
        (
            ["check", "no_such_module_xyz:f"],
            "attnlab check: error: target 'no_such_module_xyz:f': cannot import module "
            "no_such_module_xyz: ModuleNotFoundError",
        ),
        (
            ["check", "zoo.numpy_zoo:correct", "--unsupported", "warp"],
            "attnlab check: error: unsupported: expected one of",
        ),
        (
            ["check", "zoo.numpy_zoo:correct", "--probes", "speed"],
            "attnlab check: error: probes: unknown probe 'speed'",
        ),
        (
            ["check-model", "gpt5"],
            "attnlab check-model: error: unknown model 'gpt5'; expected one of gpt2-tiny, "
            "llama-tiny, bert-tiny, minilm, smollm2, a local model directory or module:factory",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message), err


def test_not_a_function_and_bad_choice_exit_2(user_file, capsys):
    assert main(["check", f"{user_file}:NOT_A_FUNCTION"]) == 2
    assert "NOT_A_FUNCTION is a int, not a function" in capsys.readouterr().err
    assert main(["check", f"{user_file}:attention", "--layout", "nhd"]) == 2  # argparse


def test_check_model_builtin_clean_and_json(capsys):
    assert main(["check-model", "llama-tiny", "--width", "100", "--no-color"]) == 0
    lines = _lines(capsys)
    assert lines[0] == "attnlab check-model: llama-tiny"
    assert lines[1] == "  model, called as causal LM: logits_fn(token_ids)"
    assert lines[2] == "probes: future-tokens ok, batch ok, determinism ok"
    assert main(["check-model", "bert-tiny", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["command"] == "check-model" and data["ok"] and data["signature"].startswith("encoder")


MODEL_FILE = textwrap.dedent(
    """
    import numpy as np

    TABLE = np.random.default_rng(0).normal(size=(50, 8))


    def prefix_mean():
        def logits_fn(ids):
            return np.cumsum(TABLE[ids], axis=1) / np.arange(1, ids.shape[1] + 1)[None, :, None]

        return logits_fn


    def whole_mean():
        def logits_fn(ids):
            return np.broadcast_to(TABLE[ids].mean(axis=1, keepdims=True), (*ids.shape, 8))

        return logits_fn
    """
)


def test_check_model_on_a_factory_of_plain_callables(tmp_path, monkeypatch, capsys):
    (tmp_path / "lm.py").write_text(MODEL_FILE)
    monkeypatch.chdir(tmp_path)
    argv = ["--kind", "causal-lm", "--vocab-size", "50", "--no-color", "--width", "100"]
    assert main(["check-model", "lm.py:prefix_mean", *argv]) == 0
    assert main(["check-model", "lm.py:whole_mean", *argv]) == 1
    lines = _lines(capsys)
    assert "BUG causal-leak: the logits at position 0 change when tokens 2..11 (its future) change" in lines
    assert main(["check-model", "lm.py:prefix_mean"]) == 2
    assert "a plain logits_fn or encode_fn needs --kind and --vocab-size" in capsys.readouterr().err


def test_help_lists_the_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "check-model" in out and "check " in out


def test_contract_options_reach_the_check(tmp_path):
    import json as _json
    import subprocess
    import sys as _sys

    f = tmp_path / "valid.py"
    f.write_text(
        "import numpy as np\n"
        "def attention(q, k, v, lengths=None):\n"
        "    s = q @ np.swapaxes(k, -1, -2) / q.dtype.type(np.sqrt(q.shape[-1]))\n"
        "    if lengths is not None:\n"
        "        keep = np.arange(k.shape[-2])[None, None, None, :] < lengths[:, None, None, None]\n"
        "        s = np.where(keep, s, np.finfo(s.dtype).min)\n"
        "    e = np.exp(s - s.max(-1, keepdims=True))\n"
        "    return (e / e.sum(-1, keepdims=True)) @ v\n"
    )
    cmd = [_sys.executable, "-m", "attnlab.cli", "check", f"{f}:attention", "--mask-arg", "lengths"]
    out = subprocess.run(
        [*cmd, "--mask-form", "valid_lens", "--ranks", "4", "--masked-rows", "uniform", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    data = _json.loads(out.stdout)
    assert out.returncode == 0 and data["verdict"] == "clean", out.stdout[-2000:] + out.stderr
    assert data["spec"]["mask_form"] == "valid_lens" and data["spec"]["ranks"] == [4]
    assert data["detected"].startswith("numpy")


def test_flags_are_generated_from_spec_options():
    import argparse

    from attnlab.checker import Spec
    from attnlab.checker.spec import options
    from attnlab.commands import check as command

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    flags = {a.dest: a for a in parser._actions}
    for name, default, opt in options():
        if opt.cli is False:
            assert name not in flags, name
            continue
        action = flags[name]
        assert action.option_strings == ["--" + name.replace("_", "-")] and action.default == default, name
        own = opt.cli.get("help") if isinstance(opt.cli, dict) else None
        assert action.help.replace("%%", "%") == (own or opt.doc.replace("``", "")), name
    args = parser.parse_args(
        ["f.py:g", "--device", "cuda:1", "--gqa", "--gqa-mapping", "tile", "--ranks", "4", "--dtypes", "float32"]
    )
    spec = Spec(**{n: getattr(args, n) for n, _, o in options() if o.cli is not False})
    assert (spec.device, spec.gqa, spec.gqa_mapping, spec.ranks, spec.dtypes) == (
        "cuda:1",
        True,
        "tile",
        (4,),
        ("float32",),
    )
