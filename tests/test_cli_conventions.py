"""What a user expects from a Python command line (issue 24): a versioned JSON schema for every JSON document,
help for every option, the exit statuses in ``check --help``, NO_COLOR / FORCE_COLOR, a progress display only on a
terminal, shell completion, usage errors before torch is imported, and a clean exit when stdout is closed."""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import select
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest

from attnlab import schemas
from attnlab.checker import ExitStatus
from attnlab.cli import main
from attnlab.commands import COMMANDS
from attnlab.commands.check import CheckProgress, show_progress
from attnlab.commands.parser import build_parser
from attnlab.commands.terminal import use_color

ROOT = Path(__file__).resolve().parents[1]

CLEAN = textwrap.dedent(
    """
    import math
    import time

    import numpy as np


    def attention(q, k, v, mask=None):
        s = q @ np.swapaxes(k, -1, -2) / q.dtype.type(math.sqrt(q.shape[-1]))
        if mask is not None:
            s = np.where(mask, s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isfinite(m), m, 0))
        d = e.sum(axis=-1, keepdims=True)
        return np.divide(e, d, out=np.zeros_like(e), where=d > 0) @ v


    def unscaled(q, k, v, mask=None):
        return attention(q * math.sqrt(q.shape[-1]), k, v, mask)


    def slow(q, k, v, mask=None):
        time.sleep(0.05)
        return attention(q, k, v, mask)


    TABLE = np.random.default_rng(0).normal(size=(16, 8))


    def prefix_mean():
        def logits_fn(ids):
            return np.cumsum(TABLE[ids], axis=1) / np.arange(1, ids.shape[1] + 1)[None, :, None]

        return logits_fn
    """
)


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    (tmp_path / "mine.py").write_text(CLEAN)
    src = (ROOT / "tests" / "grad_impls.py").read_text()
    (tmp_path / "impls.py").write_text(
        src + "\n\ndef fwd(q, k, v, mask=None):\n    return tiled_forward(q, k, v, mask)[0]\n\nbwd = plain('delta-p')\n"
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _validate(doc: dict) -> None:
    """``doc`` names its schema first and matches it (draft 2020-12)."""
    assert next(iter(doc)) == "schema"
    schema = schemas.schema(doc["schema"])
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(doc)


# --- JSON schemas ------------------------------------------------------------------------------------------------


def test_every_schema_file_is_a_valid_schema_named_by_its_command():
    files = sorted(p.stem for p in Path(schemas.__file__).parent.glob("*.json"))
    assert files == sorted(schemas.VERSIONS)
    for command in schemas.VERSIONS:
        name = schemas.name(command)
        assert re.fullmatch(rf"attnlab\.{re.escape(command)}/\d+", name)
        s = schemas.schema(name)
        jsonschema.Draft202012Validator.check_schema(s)
        assert s["$id"] == name and s["properties"]["schema"] == {"const": name} and s["description"]
    with pytest.raises(ValueError, match=re.escape("schema_name: expected one of attnlab.bench/1")):
        schemas.schema("attnlab.check/2")
    assert schemas.name("check --backward") == "attnlab.check/1"


def test_the_schemas_are_package_data():
    import fnmatch
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["attnlab"]
    files = [f"schemas/{p.name}" for p in Path(schemas.__file__).parent.glob("*.json")]
    assert files and all(any(fnmatch.fnmatch(f, pattern) for pattern in data) for f in files)


def test_check_and_check_model_schemas_differ_only_in_their_names():
    a, b = schemas.schema("attnlab.check/1"), schemas.schema("attnlab.check-model/1")
    for s in (a, b):
        for key in ("$id", "title", "description"):
            s.pop(key)
        s["properties"].pop("schema")
        s["properties"].pop("command")
    assert a == b


def test_every_command_with_json_output_has_a_schema():
    _, _, parsers = build_parser()
    with_json = set()
    for name, p in parsers.items():
        for a in p._actions:
            if "--json" in a.option_strings or ("--format" in a.option_strings and "json" in (a.choices or ())):
                with_json.add(name)
    assert with_json == set(schemas.VERSIONS)


def test_the_docs_example_validates_a_report_and_prints_what_it_says(capsys):
    text = (ROOT / "docs" / "checker.md").read_text()
    block = text.split("2020-12) of every document ships with the package")[1].split("```python\n")[1].split("```")[0]
    exec(compile(block, "docs/checker.md", "exec"), {})
    shown = block.strip().splitlines()[-1].removeprefix("# ")
    assert capsys.readouterr().out.strip() == shown


def test_a_schema_rejects_a_document_without_a_field():
    doc = json.loads(json.dumps({"schema": "attnlab.cost/1", "dtype": "float16", "rows": [], "crossover": 3}))
    with pytest.raises(jsonschema.ValidationError):  # minItems 1
        _validate(doc)


def _json(capsys, argv, status):
    assert main(argv) == status
    return json.loads(capsys.readouterr().out)


def test_check_json_matches_its_schema(user_dir, capsys):
    clean = _json(capsys, ["check", "mine.py:attention", "--json"], 0)
    assert clean["schema"] == "attnlab.check/1" and clean["verdict"] == "clean"
    _validate(clean)
    bug = _json(capsys, ["check", "mine.py:unscaled", "--json", "--probes", "reference"], 1)
    assert [f["code"] for f in bug["findings"]] == ["scale-missing"]
    _validate(bug)
    backward = _json(capsys, ["check", "impls.py:fwd", "--backward", "bwd", "--json", "--probes", "reference"], 1)
    assert backward["command"] == "check --backward" and backward["schema"] == "attnlab.check/1"
    _validate(backward)


def test_check_failure_json_matches_its_schema(user_dir, capsys, monkeypatch):
    import attnlab.checker

    def broken(*args, **kwargs):
        raise RuntimeError("planted")

    monkeypatch.setattr(attnlab.checker, "check", broken)
    doc = _json(capsys, ["check", "mine.py:attention", "--json"], 4)
    assert doc["verdict"] == "checker-failure" and doc["error"] == "RuntimeError: planted"
    _validate(doc)
    del doc["error"]
    with pytest.raises(jsonschema.ValidationError, match="'error' is a required property"):
        _validate(doc)


def test_check_model_json_matches_its_schema(user_dir, capsys):
    argv = ["check-model", "mine.py:prefix_mean", "--kind", "causal-lm", "--vocab-size", "16", "--json"]
    doc = _json(capsys, argv, 0)
    assert doc["schema"] == "attnlab.check-model/1" and doc["command"] == "check-model"
    _validate(doc)


@pytest.mark.parametrize(
    "argv",
    [
        ["explain", "2x2-causal", "--format", "json", "--mistake", "all"],
        ["explain", "causal-4", "--tiled", "2", "--format", "json"],
        ["explain", "2x2", "--backward", "--format", "json"],
    ],
)
def test_explain_json_matches_its_schema(capsys, argv):
    doc = _json(capsys, argv, 0)
    assert doc["schema"] == "attnlab.explain/1"
    _validate(doc)


def test_cost_json_matches_its_schema_and_the_table(capsys):
    doc = _json(capsys, ["cost", "1000", "4096", "--kv-heads", "2", "--causal", "--json"], 0)
    assert doc["schema"] == "attnlab.cost/1"
    _validate(doc)
    r = doc["rows"][0]
    assert (r["n_q"], r["kind"], r["pairs"]) == (1000, "GQA", 1000 * 1001 // 2)  # causal pairs, exact
    assert r["attention_flops"] == r["score_flops"] + r["av_flops"]
    huge = _json(capsys, ["cost", str(10**18), "--json"], 0)["rows"][0]
    assert huge["score_elements"] == 8 * 10**36  # an exact int, beyond any float's precision


def test_bench_json_matches_its_schema(tmp_path, capsys):
    path = tmp_path / "b.json"
    argv = ["bench", "--sizes", "32", "--d", "8", "--heads", "1", "--causal", "no", "--methods", "naive", "tiled"]
    assert main([*argv, "--repetitions", "1", "--json", str(path), "--no-progress"]) == 0
    doc = json.loads(path.read_text())
    assert doc["schema"] == "attnlab.bench/1" and [r["method"] for r in doc["rows"]] == ["naive", "tiled"]
    _validate(doc)


def test_intervene_json_matches_its_schema(smollm2, monkeypatch, capsys):
    import attnlab.models.gguf

    monkeypatch.setattr(attnlab.models.gguf, "load_smollm2", lambda: smollm2)
    doc = _json(capsys, ["intervene", "The capital of France is", "--layer", "0", "--json"], 0)
    assert doc["schema"] == "attnlab.intervene/1" and doc["model"] == "SmolLM2-135M-Instruct"
    _validate(doc)


# --- the layout of a library function ----------------------------------------------------------------------------


def test_jax_dot_product_attention_is_checked_in_its_documented_layout():
    """jax.nn.dot_product_attention takes [B, T, N, H]: layout "auto" (the default) knows it, so the real function
    is clean; declared heads-first, the same function gets findings."""
    import functools

    import jax

    from attnlab import check
    from attnlab.checker.adapters import LIBRARY_LAYOUTS, library_layout

    static = ("is_causal", "scale")  # jitted: eager dispatch compiles every primitive for every new shape
    fn = jax.jit(jax.nn.dot_product_attention, static_argnames=static)
    r = check(fn, probes=("reference",), dtypes=("float32",))
    assert r.codes == () and r.spec["layout"] == "bnhd", r.to_text()
    assert "layout bnhd: jax.nn.dot_product_attention takes [B, T, N, H]" in r.detected
    wrapped = jax.jit(functools.partial(jax.nn.dot_product_attention, implementation="xla"), static_argnames=static)
    assert (
        library_layout(wrapped)
        == library_layout(jax.nn.dot_product_attention)
        == LIBRARY_LAYOUTS[("jax._src.nn.functions", "dot_product_attention")]
    )
    assert library_layout(jax.numpy.matmul) is None
    wrong = check(fn, layout="bhnd", probes=("reference",), dtypes=("float32",))
    assert "reference-mismatch" in wrong.codes and wrong.spec["layout"] == "bhnd"
    assert "(layout bhnd)" in wrong.to_text()


def test_a_function_that_takes_bnhd_is_told_the_layout_is_the_likely_cause():
    """An unknown function taking [B, n, h, d], called heads-first: its findings come with a ``layout`` note whose
    evidence is a rerun of the reference probe in bnhd; a real head-mixing bug gets no such note."""
    from zoo import numpy_zoo as z

    from attnlab import check

    r = check(z.correct_bnhd, probes=("reference", "batch"))
    assert {"reference-mismatch", "batch-leak"} <= set(r.codes)
    note = next(n for n in r.notes if n.code == "layout")
    assert "--layout bnhd" in note.fix and "transpose" not in note.fix
    assert re.fullmatch(r"reference probe rerun with layout bnhd: \d+ calls, no finding", note.evidence)
    assert check(z.correct_bnhd, layout="bnhd", probes=("reference", "batch")).codes == ()
    declared = check(z.correct_bnhd, layout="bhnd", probes=("reference", "batch"))
    assert declared.codes == r.codes and "layout" not in [n.code for n in declared.notes]  # declared: believed
    leak = check(z.batch_reshape, probes=("reference", "batch"))
    assert "layout" not in [n.code for n in leak.notes], leak.to_text()


# --- help text and exit statuses ---------------------------------------------------------------------------------

#: Options hidden from --help on purpose (test hooks), each named here so that a new one is a decision.
HIDDEN = {("lab", "--exit-when-ready"), ("ring", "--inject-fault")}


def test_every_option_of_every_command_has_help():
    parser, _, parsers = build_parser()
    assert set(parsers) == {__import__(f"attnlab.commands.{c}", fromlist=["NAME"]).NAME for c in COMMANDS}
    missing, hidden = [], set()
    for name, p in [("attnlab", parser), *parsers.items()]:
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            flag = a.option_strings[0] if a.option_strings else a.dest
            if a.help == argparse.SUPPRESS:
                hidden.add((name, flag))
            elif not (a.help or "").strip():
                missing.append(f"{name} {flag}")
    assert missing == []
    assert hidden == HIDDEN


def test_check_help_lists_every_exit_status_from_exit_status(capsys):
    assert main(["check", "--help"]) == 0
    out = capsys.readouterr().out
    epilog = out[out.index("exit status:") :]
    for status in ExitStatus:
        assert f"  {int(status)}  {status.meaning}" in epilog
    assert [int(s) for s in ExitStatus] == [0, 1, 2, 3, 4]
    assert "--quiet" in out and "NO_COLOR" in out


# --- colour ------------------------------------------------------------------------------------------------------


class _Stream:
    def __init__(self, tty: bool):
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize(
    "tty, flag, env, expected",
    [
        (True, False, {}, True),
        (False, False, {}, False),
        (True, True, {}, False),
        (True, False, {"NO_COLOR": "1"}, False),
        (True, False, {"NO_COLOR": ""}, True),  # no-color.org: set and not empty
        (False, False, {"FORCE_COLOR": "1"}, True),
        (False, False, {"FORCE_COLOR": "1", "NO_COLOR": "1"}, False),
        (False, True, {"FORCE_COLOR": "1"}, False),
    ],
)
def test_use_color_follows_the_flag_no_color_force_color_then_the_terminal(tty, flag, env, expected):
    assert use_color(_Stream(tty), no_color=flag, environ=env) is expected


ESC = "\x1b["


@pytest.mark.parametrize("command", ["check", "check-model"])
def test_reports_follow_no_color_and_force_color(user_dir, capsys, monkeypatch, command):
    argv = {
        "check": ["check", "mine.py:unscaled", "--probes", "reference", "--width", "100"],
        "check-model": ["check-model", "mine.py:prefix_mean", "--kind", "causal-lm", "--vocab-size", "16"],
    }[command]
    status = 1 if command == "check" else 0
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    assert main(argv) == status
    assert ESC not in capsys.readouterr().out  # captured: not a terminal
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert main(argv) == status
    coloured = capsys.readouterr().out
    assert ESC in coloured and f"attnlab {command}: " in re.sub(r"\x1b\[[0-9;]*m", "", coloured)
    monkeypatch.setenv("NO_COLOR", "1")
    assert main(argv) == status
    assert ESC not in capsys.readouterr().out


def test_explain_follows_force_color_and_no_color(capsys, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert main(["explain", "2x2"]) == 0
    assert ESC in capsys.readouterr().out  # rich, coloured, although not a terminal
    monkeypatch.setenv("NO_COLOR", "1")
    assert main(["explain", "2x2"]) == 0
    assert ESC not in capsys.readouterr().out


# --- progress ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tty, quiet, env, expected",
    [
        (True, False, {}, True),
        (False, False, {}, False),
        (True, True, {}, False),
        (True, False, {"NO_COLOR": "1"}, False),
        (False, False, {"FORCE_COLOR": "1"}, False),  # colour can be forced; a progress display needs a terminal
    ],
)
def test_progress_is_shown_only_on_a_terminal_without_no_color_or_quiet(tty, quiet, env, expected):
    assert show_progress(_Stream(tty), quiet=quiet, environ=env) is expected


def _read_all(fd: int, seconds: float = 120.0) -> str:
    chunks = []
    while True:
        ready, _, _ = select.select([fd], [], [], seconds)
        if not ready:
            break
        try:
            data = os.read(fd, 4096)
        except OSError:  # EIO: the other side closed
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def test_progress_display_draws_on_a_pseudo_terminal():
    master, slave = pty.openpty()
    with open(slave, "w", closefd=True) as tty:
        assert tty.isatty()
        with CheckProgress(tty, enabled=True, delay=0.0) as progress:
            progress("probe reference", 1, 3)
            progress("probe causal", 2, 3)
            import time

            time.sleep(0.5)  # rich redraws a few times a second
    text = _read_all(master, seconds=1.0)
    os.close(master)
    assert "attnlab check: probe causal" in text and "2/3" in text


def test_progress_display_does_nothing_when_disabled(capsys):
    with CheckProgress(sys.stderr, enabled=False, delay=0.0) as progress:
        progress("probe reference", 1, 3)
    assert capsys.readouterr().err == ""


def _check_on_a_pty(tmp_path: Path, *extra: str, env: dict | None = None) -> tuple[int, str, str]:
    """``attnlab check mine.py:slow`` (about 3 s) with stderr on a pseudo-terminal, stdout a pipe."""
    (tmp_path / "mine.py").write_text(CLEAN)
    master, slave = pty.openpty()
    environ = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    environ.update(env or {})
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlab", "check", "mine.py:slow", "--probes", "reference,causal", *extra],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=environ,
    )
    os.close(slave)
    err = _read_all(master)
    os.close(master)
    out = proc.stdout.read().decode()
    proc.stdout.close()
    return proc.wait(timeout=120), out, err


def test_a_long_check_shows_its_progress_on_a_terminal_stderr_only(tmp_path):
    status, out, err = _check_on_a_pty(tmp_path)  # incomplete: two probes only, no core padding probe
    assert status == ExitStatus.INCOMPLETE and out.startswith("attnlab check: mine.py:slow")
    assert "attnlab check: probe" in err  # the display, on the terminal
    assert "attnlab check: probe" not in out and ESC not in out  # stdout is a pipe: plain report
    status, _, err = _check_on_a_pty(tmp_path, "--quiet")
    assert status == ExitStatus.INCOMPLETE and "attnlab check:" not in err
    status, _, err = _check_on_a_pty(tmp_path, env={"NO_COLOR": "1"})
    assert status == ExitStatus.INCOMPLETE and "attnlab check:" not in err


# --- completion --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_script_names_every_subcommand_and_option(capsys, shell):
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    _, _, parsers = build_parser()
    for name in parsers:
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", script), name
    for a in parsers["check"]._actions:
        for flag in a.option_strings:
            assert flag in script, flag


def test_completion_without_shtab_is_an_install_hint(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "shtab", None)
    assert main(["completion", "bash"]) == 2
    err = capsys.readouterr().err
    assert (
        err == "attnlab completion: error: shtab is not installed; it comes with: pip install 'attnlab[completion]'\n"
    )


# --- usage errors before anything heavy is imported --------------------------------------------------------------

USAGE_ERRORS = [
    ["check", "mine.py:attention", "--layout", "nhd"],
    ["check", "mine.py:attention", "--timeout", "-1"],
    ["check", "mine.py:attention", "--mask-form", "varlen", "--mask-convention", "block"],
    ["check", "mine.py:attention", "--probes", "nope"],
    ["check", "mine.py:attention", "--framework", "torch", "--dtypes", "float99"],
    ["check", "nope.py:attention"],
    ["check-model", "bert-tiny", "--seq-len", "2"],
    ["check-model", "bert-tiny", "--attn-implementation", "bogus"],
    ["check-model", "gpt2-tiny", "--break-causal"],
    ["bench", "--sizes", "0"],
    ["bench", "--methods", "torch", "--threads", "0"],
    ["intervene", "--model", "minilm", "--replacement", "x", "hi"],
    ["generate", "--max-new-tokens", "0", "hi"],
    ["train", "--steps", "0"],
    ["cost", "0"],
    ["completion", "fish"],
]

PROBE_MODULES = textwrap.dedent(
    """
    import json, sys
    from attnlab.cli import main
    out = []
    for argv in json.loads(sys.argv[1]):
        status = main(argv)
        out.append([argv, status, sorted(m for m in ("torch", "jax", "transformers") if m in sys.modules)])
    print(json.dumps(out))
    """
)


def test_usage_errors_are_found_before_torch_or_jax_is_imported(user_dir):
    proc = subprocess.run(
        [sys.executable, "-c", PROBE_MODULES, json.dumps(USAGE_ERRORS)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=user_dir,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.splitlines()[-1])
    assert [(argv, status) for argv, status, _ in results] == [(argv, 2) for argv in USAGE_ERRORS]
    assert [(argv, heavy) for argv, _, heavy in results if heavy] == []
    errors = proc.stderr.splitlines()
    assert len(errors) == len(USAGE_ERRORS) and all(": error: " in line for line in errors), errors


# --- standard output closed or broken ----------------------------------------------------------------------------

CLOSED_STDOUT = [
    ["cost", "8", "16"],
    ["cost", "8", "--json"],
    ["explain", "2x2"],
    ["explain", "2x2", "--format", "json"],
    ["demo"],
    ["--help"],
    ["check", "--help"],
    ["completion", "bash"],
    ["check", "mine.py:attention", "--probes", "reference", "--json"],
    ["check-model", "mine.py:prefix_mean", "--kind", "causal-lm", "--vocab-size", "16"],
]


@pytest.mark.parametrize("argv", CLOSED_STDOUT, ids=" ".join)
def test_closed_stdout_is_one_line_not_a_traceback(user_dir, argv):
    """``attnlab ... >&-``: standard output closed when the process starts."""
    proc = subprocess.run(
        ["bash", "-c", 'exec "$@" >&-', "bash", sys.executable, "-m", "attnlab", *argv],
        capture_output=True,
        text=True,
        cwd=user_dir,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr == "attnlab: error: standard output is closed; redirect it to a file or /dev/null\n"


@pytest.mark.parametrize("argv", CLOSED_STDOUT, ids=" ".join)
def test_broken_pipe_ends_quietly(user_dir, argv):
    """``attnlab ... | head -0``: the reader has gone before anything is written."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlab", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=user_dir
    )
    proc.stdout.close()  # the only read end: every write gets EPIPE
    err = proc.stderr.read().decode()
    proc.stderr.close()
    status = proc.wait(timeout=300)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    if argv[0] == "check" and "--help" not in argv:  # check's exit statuses: 4, the report could not be written
        assert status == ExitStatus.CHECKER_FAILURE
        assert err.startswith("attnlab check: could not write the report to stdout: [Errno 32] Broken pipe")
    elif "--help" in argv:  # argparse itself ignores a failed write of the help (and exits 0)
        assert status in (0, 1) and err == ""
    else:
        assert (status, err) == (1, "")
