"""Every argument of ``attnlab cost/demo/explain/heatmap/train/check/check-model/generate/intervene`` is checked
before any work starts: a bad value is one line on stderr naming the flag and exit status 2, never a traceback;
good values exit 0. The commands of issue 12's report are regression tests at the end."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlab.cli import main
from attnlab.cost import causal_pairs

FEW = settings(max_examples=25, deadline=None)
HANDFUL = settings(max_examples=5, deadline=None)


def call(*argv: str) -> tuple[int, str, str]:
    """``main(argv)`` with stdout and stderr captured (no pytest fixture, so hypothesis can call it many times)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def assert_usage_error(argv: list[str], flag: str) -> str:
    code, out, err = call(*argv)
    command = "check-model" if argv[0] == "check-model" else argv[0]
    assert code == 2, (argv, code, out, err)
    assert err.count("\n") == 1 and err.endswith("\n"), err  # one line
    assert err.startswith(f"attnlab {command}: error: "), err
    assert flag in err, (flag, err)
    assert "Traceback" not in err and out == ""
    return err


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """A folder, a plain file (not a folder), and paths that do not exist."""
    d = tmp_path_factory.mktemp("cli")
    (d / "plain.txt").write_text("1 0\n0 1\n")
    return {
        "dir": str(d),
        "file": str(d / "plain.txt"),
        "missing": str(d / "missing" / "x.npy"),
        "missing_file": str(d / "nope.npy"),
        "under_file": str(d / "plain.txt" / "x.png"),  # its "folder" is a file: cannot be written even by root
        "no_folder": str(d / "no" / "such" / "x.png"),
    }


# bad values as text: what a user can type
NOT_NUMBERS = st.sampled_from(["", " ", "x", "1,5", "one", "0x10", "--", "1e", "nan%", "∞"])
NON_FINITE = st.sampled_from(["nan", "inf", "-inf", "NaN", "+inf", "1e400", "-1e400"])
NOT_INTS = st.one_of(NOT_NUMBERS, NON_FINITE, st.sampled_from(["1.5", "2.0001", "1e-3", "1e999999"]))


def below(minimum: int) -> st.SearchStrategy[str]:
    """Ints below ``minimum`` (negative, zero, ...) and text that is no int at all."""
    return st.one_of(st.integers(max_value=minimum - 1).map(str), NOT_INTS)


# ----------------------------------------------------------------------------------------------------------------
# cost


COST_SIZES = ("--n-k", "--batch", "--d-model", "--heads", "--kv-heads", "--layers")


@FEW
@given(
    st.sampled_from(COST_SIZES),
    st.one_of(below(1), st.integers(min_value=10**30 + 1, max_value=10**60).map(str)),
)
def test_cost_bad_sizes(flag, value):
    assert_usage_error(["cost", "16", f"{flag}={value}"], flag)


@FEW
@given(below(1))
def test_cost_bad_lengths(value):
    if value.startswith("-") and not value.lstrip("-").isdigit():
        value = "x" + value  # argparse would read '-inf' as an option; the flag-less N is checked the same way
    assert_usage_error(["cost", "16", value], "N: ")


@FEW
@given(st.sampled_from(["float17", "U", "S", "V", "object", "datetime64", "[", "(", "f8,i4", "", "-1"]))
def test_cost_bad_dtype(value):
    assert_usage_error(["cost", "16", f"--dtype={value}"], "--dtype: ")


@FEW
@given(
    st.lists(st.integers(1, 10**18), min_size=1, max_size=3),
    st.integers(1, 64),
    st.integers(1, 16),
    st.sampled_from([1, 2, 4]),
    st.booleans(),
)
def test_cost_good_values(lengths, d_head, heads, kv_div, causal):
    kv = heads // kv_div if heads % kv_div == 0 else heads
    argv = ["cost", *map(str, lengths), "--d-model", str(d_head * heads), "--heads", str(heads)]
    argv += ["--kv-heads", str(kv), *(["--causal"] if causal else [])]
    code, out, err = call(*argv)
    assert code == 0 and err == ""
    rows = out.splitlines()[3 : 3 + len(lengths)]
    for n, row in zip(lengths, rows, strict=True):
        cells = row.split()
        assert cells[:2] == [str(n), str(n)]
        if causal:
            assert cells[2] == f"{causal_pairs(n):,}" == f"{n * (n + 1) // 2:,}"


def test_cost_cross_checks():
    assert_usage_error(["cost", "16", "--heads", "7"], "--heads: 7 heads do not divide --d-model=512")
    assert_usage_error(["cost", "16", "--kv-heads", "3"], "--kv-heads: 3 does not divide --heads=8")
    assert_usage_error(["cost", "16", "--kv-heads", "16"], "--kv-heads: 16 does not divide --heads=8")


# ----------------------------------------------------------------------------------------------------------------
# explain (and the inputs heatmap shares with it)


EXPLAIN_BAD = st.one_of(
    st.tuples(st.just("--heads"), below(1)),
    st.tuples(st.just("--heads"), st.integers(2**20 + 1, 10**40).map(str)),
    st.tuples(st.just("--width"), below(20)),
    st.tuples(st.just("--tiled"), below(1)),
    st.tuples(st.just("--padding"), below(0)),
    st.tuples(st.just("--padding"), st.integers(3, 10**20).map(str)),  # 2x2 has n_k = 2
    st.tuples(st.just("--temperature"), st.one_of(NOT_NUMBERS, NON_FINITE)),
    st.tuples(st.just("--temperature"), st.sampled_from(["0", "-0", "-1", "-1e-300", "1e-320", "5e-324", "1e-308"])),
    st.tuples(st.just("--shift"), st.one_of(NOT_NUMBERS, NON_FINITE)),
    st.tuples(st.just("--scale"), st.one_of(NOT_NUMBERS, NON_FINITE)),
    st.tuples(st.just("--mistake"), st.sampled_from(["", "nope", "no_scale"])),
    st.tuples(st.just("--format"), st.sampled_from(["", "html", "TEXT"])),
    st.tuples(st.just("--masked-rows"), st.sampled_from(["", "ignore"])),
)


@FEW
@given(EXPLAIN_BAD)
def test_explain_bad_values(flag_value):
    flag, value = flag_value
    assert_usage_error(["explain", "2x2", f"{flag}={value}"], f"{flag}: ")


@HANDFUL
@given(EXPLAIN_BAD)
def test_heatmap_shares_the_input_checks(flag_value):
    flag, value = flag_value
    if flag in ("--heads", "--width", "--tiled", "--mistake", "--format"):
        flag, value = "--temperature", "nan"  # explain's output options: heatmap has none of them
    assert_usage_error(["heatmap", "2x2", f"{flag}={value}", "-o", "never-written.svg"], f"{flag}: ")
    assert not Path("never-written.svg").exists()


def test_explain_bad_files_and_sources(files):
    assert_usage_error(["explain", "--inputs", files["missing_file"]], "--inputs: no such file")
    assert_usage_error(["explain", "--inputs", files["dir"]], "--inputs: ")
    assert_usage_error(["explain", "--q", files["missing_file"], "--k", "1", "--v", "1"], "--q: no such file")
    assert_usage_error(["explain", "--q", "1,0", "--k", "1,0", "--v", "1", "--mask", files["missing_file"]], "--mask")
    assert_usage_error(["explain", "nope"], "EXAMPLE: no worked example 'nope'")
    assert_usage_error(["explain"], "give a named example")
    # a library message that draws masks (several lines) becomes a one-line option error on the command line
    assert_usage_error(
        ["explain", "--q", "1,0;0,1;1,1", "--k", "1,0;0,1", "--v", "1;2", "--causal"],
        "on the command line: --causal-align top_left or --causal-align bottom_right",
    )


@FEW
@given(
    st.sampled_from(["2x2", "2x2-causal", "causal-4", "one-query", "mask-order"]),
    st.floats(1e-3, 1e3),
    st.floats(-1e3, 1e3),
    st.integers(1, 64),
    st.integers(20, 200),
    st.one_of(st.none(), st.integers(1, 5)),
)
def test_explain_good_values(name, temperature, shift, heads, width, tiled):
    argv = ["explain", name, "--temperature", repr(temperature), f"--shift={shift!r}", "--heads", str(heads)]
    argv += ["--width", str(width), "--format", "text"]
    argv += ["--tiled", str(tiled)] if tiled else ["--mistake", "sqrt-d-model"]
    code, out, err = call(*argv)
    assert code == 0, err
    assert err == "" and out


# ----------------------------------------------------------------------------------------------------------------
# heatmap


@FEW
@given(
    st.one_of(
        st.tuples(st.just("--dpi"), st.one_of(below(10), st.integers(1201, 10**9).map(str))),
        st.tuples(st.just("--layer"), below(0)),
        st.tuples(st.just("--head"), below(0)),
        st.tuples(st.just("--kind"), st.sampled_from(["", "bars", "Weights"])),
        st.tuples(st.just("--model"), st.sampled_from(["", "gpt2", "SmolLM2"])),
        st.tuples(st.just("--output"), st.sampled_from(["x.gif", "x", "x.PNG.txt", ".png/", ""])),
    )
)
def test_heatmap_bad_values(flag_value):
    flag, value = flag_value
    assert_usage_error(["heatmap", "causal-4", f"{flag}={value}"], f"{flag}: ")


def test_heatmap_bad_paths_and_sources(files):
    for key in ("under_file", "no_folder"):
        assert_usage_error(["heatmap", "causal-4", "-o", files[key]], "--output: ")
    assert_usage_error(["heatmap", "causal-4", "-o", files["dir"]], "--output: ")
    assert_usage_error(["heatmap", "--weights", files["missing_file"]], "--weights: no such file")
    assert_usage_error(["heatmap", "--weights", files["dir"]], "--weights: ")
    assert_usage_error(["heatmap", "--weights", files["file"], "causal-4", "-o", "x.svg"], "one source at a time")
    assert_usage_error(["heatmap", "causal-4", "--head", "1", "-o", "x.svg"], "--head: applies to --model only")
    assert_usage_error(["heatmap", "causal-4", "--layer", "0", "-o", "x.svg"], "--layer: applies to --model only")
    assert_usage_error(["heatmap", "--model", "minilm", "-o", "x.svg"], "--text: give the prompt")
    assert_usage_error(["heatmap", "--model", "minilm", "--text", " ", "-o", "x.svg"], "--text: expected some text")
    assert_usage_error(["heatmap", "causal-4", "--kind", "growth", "-o", "x.svg"], "--kind growth")


def test_heatmap_weights_files_that_cannot_be_read(tmp_path):
    (tmp_path / "pickled.npy").write_bytes(b"not an npy file at all")
    (tmp_path / "text.npy").write_text("1 2")
    np.save(tmp_path / "strings.npy", np.array([["a", "b"]]))
    np.save(tmp_path / "nan.npy", np.array([[np.nan, 1.0]]))
    np.save(tmp_path / "vector.npy", np.array([1.0, 2.0]))
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00\x01")
    for name in ("pickled.npy", "text.npy", "strings.npy", "nan.npy", "vector.npy", "binary.csv"):
        assert_usage_error(["heatmap", "--weights", str(tmp_path / name), "-o", str(tmp_path / "w.png")], "--weights")
    assert not (tmp_path / "w.png").exists()


def test_heatmap_picture_too_large_for_a_png(tmp_path):
    np.save(tmp_path / "big.npy", np.full((2, 40, 40), 1 / 40))  # 2 heads of 40 x 40: ~32 x 13 inches
    argv = ["heatmap", "--weights", str(tmp_path / "big.npy"), "--dpi", "1200", "-o", str(tmp_path / "b.png")]
    err = assert_usage_error(argv, "--dpi: 1200 dpi makes this")
    assert "in all (use --dpi" in err and not (tmp_path / "b.png").exists()
    w_in, h_in, most = (float(x) for x in re.search(r"this ([\d.]+) x ([\d.]+) inch .* --dpi (\d+) or", err).groups())
    assert 10 <= most < 1200 and w_in * most * h_in * most <= 2**26 * 1.01  # the advice fits (inches shown rounded)


@HANDFUL
@given(st.integers(10, 200), st.sampled_from(["weights", "mask", "last-row"]), st.sampled_from(["png", "svg"]))
def test_heatmap_good_values(tmp_path_factory, dpi, kind, ext):
    path = tmp_path_factory.mktemp("hm") / f"h.{ext}"
    code, out, err = call("heatmap", "causal-4", "--kind", kind, "--dpi", str(dpi), "-o", str(path))
    assert code == 0 and err == "" and out == f"wrote {path}\n"
    assert path.stat().st_size > 0


def test_heatmap_write_failure_is_one_line(tmp_path, monkeypatch):
    from attnlab import plot

    def refuse(fig, path, *, dpi):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(plot, "save", refuse)
    assert_usage_error(["heatmap", "2x2", "-o", str(tmp_path / "x.svg")], "--output: cannot write")


# ----------------------------------------------------------------------------------------------------------------
# train


TRAIN_BAD = st.one_of(
    st.tuples(st.sampled_from(["--steps", "--batch", "--heads", "--every"]), below(1)),
    st.tuples(st.sampled_from(["--pairs", "--keys", "--values"]), below(2)),
    st.tuples(st.just("--seed"), below(0)),
    st.tuples(st.just("--lr"), st.one_of(NOT_NUMBERS, NON_FINITE, st.sampled_from(["0", "-0.1", "1.5", "1e9"]))),
    st.tuples(st.just("--dropout"), st.one_of(NOT_NUMBERS, NON_FINITE, st.sampled_from(["1", "1.0", "-0.1", "2"]))),
)


@FEW
@given(TRAIN_BAD)
def test_train_bad_values(flag_value):
    flag, value = flag_value
    assert_usage_error(["train", f"{flag}={value}"], f"{flag}: ")


def test_train_cross_checks():
    assert_usage_error(["train", "--pairs", "9", "--keys", "8"], "--keys: expected an int >= --pairs=9")
    err = assert_usage_error(["train", "--batch", "100000", "--pairs", "100", "--keys", "100"], "--batch, --pairs")
    assert "at most 67108864" in err


@HANDFUL
@given(
    st.integers(1, 3),
    st.integers(1, 8),
    st.integers(2, 4),
    st.integers(0, 4),
    st.integers(2, 5),
    st.integers(1, 2),
    st.floats(1e-4, 1.0),
    st.floats(0.0, 0.9),
    st.integers(0, 2**64),
)
def test_train_good_values(steps, batch, pairs, extra_keys, values, heads, lr, dropout, seed):
    argv = ["train", "--steps", str(steps), "--batch", str(batch), "--pairs", str(pairs)]
    argv += ["--keys", str(pairs + extra_keys), "--values", str(values), "--heads", str(heads)]
    argv += ["--lr", repr(lr), "--dropout", repr(dropout), "--seed", str(seed), "--every", "1"]
    code, out, err = call(*argv)
    assert code == 0 and err == ""
    assert out.startswith("chance loss ln(n_values) = ")


def test_train_retrieval_checks_its_options():
    from attnlab.commands.train import train_retrieval
    from attnlab.errors import OptionError

    for kw, message in (
        ({"lr": float("nan")}, "lr: expected a finite number > 0, got nan"),
        ({"dropout_p": 1.0}, "dropout_p: expected 0 <= dropout_p < 1, got 1.0"),
        ({"n_pairs": 9, "n_keys": 8}, "n_keys: expected an int >= 9, got 8"),
        ({"seed": -1}, "seed: expected an int >= 0, got -1"),
    ):
        with pytest.raises(OptionError, match=re.escape(message)):
            train_retrieval(steps=1, batch=2, **kw)


# ----------------------------------------------------------------------------------------------------------------
# check, check-model, demo


@FEW
@given(
    st.one_of(
        st.tuples(st.just("--timeout"), st.one_of(NOT_NUMBERS, NON_FINITE, st.sampled_from(["0", "-1", "86401"]))),
        st.tuples(st.just("--seed"), below(0)),
        st.tuples(st.just("--width"), below(20)),
        st.tuples(st.just("--framework"), st.sampled_from(["", "tf", "NumPy"])),
        st.tuples(st.just("--layout"), st.sampled_from(["", "nhd"])),
    )
)
def test_check_bad_values(flag_value):
    flag, value = flag_value
    assert_usage_error(["check", "no_such_file.py:f", f"{flag}={value}"], f"{flag}: ")


@FEW
@given(
    st.one_of(
        st.tuples(st.just("--seq-len"), st.one_of(below(4), st.integers(2**20 + 1, 10**30).map(str))),
        st.tuples(st.just("--vocab-size"), st.one_of(below(2), st.integers(2**31, 10**30).map(str))),
        st.tuples(st.just("--seed"), below(0)),
        st.tuples(st.just("--width"), below(20)),
        st.tuples(st.just("--kind"), st.sampled_from(["", "decoder"])),
    )
)
def test_check_model_bad_values(flag_value):
    flag, value = flag_value
    assert_usage_error(["check-model", "gpt2-tiny", f"{flag}={value}"], f"{flag}: ")


def test_check_model_usage_errors(files):
    assert_usage_error(["check-model", "gpt2-tiny", "--break-causal"], "--break-causal: applies to smollm2 only")
    assert_usage_error(["check-model", "gpt5"], "unknown model 'gpt5'")
    assert_usage_error(["check-model", f"{files['missing_file']}:f"], "does not exist")


def test_demo_takes_no_options():
    assert_usage_error(["demo", "--fast"], "unrecognized arguments: --fast")
    assert call("demo")[0] == 0


@FEW
@given(shell=st.text(min_size=1, max_size=8).filter(lambda s: s not in ("bash", "zsh") and not s.startswith("-")))
def test_completion_takes_bash_or_zsh_only(shell):
    code, out, err = call("completion", shell)
    assert (code, out) == (2, "") and err.startswith("attnlab completion: error: shell: invalid choice"), err
    assert call("completion", "zsh")[0] == 0


# ----------------------------------------------------------------------------------------------------------------
# generate and intervene: every value they can check without the model fails before it is loaded


@pytest.fixture
def no_model(monkeypatch):
    from attnlab.models import gguf, minilm

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(gguf, "load_smollm2", refuse)
    monkeypatch.setattr(minilm.MiniLM, "load", classmethod(refuse))


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(
        st.tuples(st.just("--max-new-tokens"), below(1)),
        st.tuples(st.just("--threads"), st.one_of(below(1), st.integers(1025, 10**20).map(str))),
        st.tuples(st.just("--attention"), st.sampled_from(["", "flash"])),
    )
)
def test_generate_bad_values(no_model, flag_value):
    flag, value = flag_value
    assert_usage_error(["generate", "Hello", f"{flag}={value}"], f"{flag}: ")


def test_generate_and_intervene_bad_text(no_model, files):
    assert_usage_error(["generate", ""], "prompt: expected some text")
    assert_usage_error(["intervene", "  "], "text: expected some text")
    assert_usage_error(["intervene", "Hello there", "--target", "-1"], "--target: expected an int >= 0, got -1")
    assert_usage_error(["intervene", "Hello there", "--layer=-2"], "--layer: expected an int >= 0, got -2")
    assert_usage_error(["intervene", "Hello there", "--plot", "x.gif"], "--plot: ")
    assert_usage_error(["intervene", "Hello there", "--plot", files["under_file"]], "--plot: ")
    assert_usage_error(["intervene", "Hi there", "--model", "minilm", "--target-token", "x"], "--target-token: applies")
    assert_usage_error(["intervene", "Hi there", "--method", "swap"], "--method: invalid choice")


def test_generate_max_new_tokens_beyond_the_context(smollm2, monkeypatch):
    from attnlab.models import llama

    def refuse(*args, **kwargs):
        raise AssertionError("generate ran before --max-new-tokens was checked against the context")

    monkeypatch.setattr(llama, "generate", refuse)
    err = assert_usage_error(["generate", "The capital of France is", "-n", "1000000000000"], "--max-new-tokens: ")
    assert "expected an int in [1, 8187]" in err and "the prompt is 5 of SmolLM2-135M-Instruct's 8192" in err


# ----------------------------------------------------------------------------------------------------------------
# how errors are printed


def test_internal_errors_keep_their_traceback(monkeypatch):
    from attnlab.commands import cost

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in attnlab")

    monkeypatch.setattr(cost, "cost_text", broken)
    with pytest.raises(RuntimeError, match="a bug in attnlab"):
        main(["cost", "16"])


def test_library_errors_are_one_line_even_when_they_draw(monkeypatch):
    from attnlab.commands import cost
    from attnlab.errors import MaskError

    def drawing(*args, **kwargs):
        raise MaskError("causal: n_q=3 != n_k=2, placed how?\n  ■ ⬚\n  ■ ■\n  pass causal='top_left'")

    monkeypatch.setattr(cost, "cost_text", drawing)
    code, out, err = call("cost", "16")
    assert code == 2 and out == ""
    assert err == "attnlab cost: error: causal: n_q=3 != n_k=2, placed how? ■ ⬚ ■ ■ pass causal='top_left'\n"
    from attnlab.errors import one_line

    assert one_line(ValueError("a\n\n  b  ")) == "a b"


def test_argparse_errors_have_the_same_one_line_form():
    assert call("cost") == (2, "", "attnlab cost: error: the following arguments are required: N\n")
    assert call("train", "--batch", "x") == (2, "", "attnlab train: error: --batch: expected an int >= 1, got 'x'\n")
    assert (
        call("cost", "16", "-B", "0")[2] == f"attnlab cost: error: --batch: expected an int in [1, {10**30}], got 0\n"
    )
    assert call("cost", "16", "--nope")[2] == "attnlab cost: error: unrecognized arguments: --nope\n"
    assert call("--nope")[2] == "attnlab: error: unrecognized arguments: --nope\n"
    # Python 3.11's argparse would store [] for `--flag=--` without checking it
    assert call("cost", "16", "--n-k=--")[2] == "attnlab cost: error: --n-k: expected a value, got '--'\n"
    assert (
        call("explain", "2x2", "--mistake=--")[2] == "attnlab explain: error: --mistake: expected a value, got '--'\n"
    )
    assert call("explain", "2x2", "--temperature", "-inf")[2] == (
        "attnlab explain: error: --temperature: expected one argument\n"  # '-inf' reads as an option: use --x=-inf
    )


# ----------------------------------------------------------------------------------------------------------------
# issue 12, item 6: the report's commands


def test_report_cost_causal_is_a_formula():
    code, out, err = call("cost", "1000000000000", "--causal")
    assert code == 0 and err == ""
    assert "500,000,000,000,500,000,000,000" in out.splitlines()[3]
    code, out, _ = call("cost", "3000000000", "--causal")
    assert code == 0 and "4,500,000,001,500,000,000" in out


def test_report_bad_values():
    assert_usage_error(["heatmap", "causal-4", "--dpi", "100000"], "--dpi: expected an int in [10, 1200], got 100000")
    assert_usage_error(
        ["explain", "2x2", "--temperature", "1e-320"],
        "--temperature: expected a finite number >= 2.2250738585072014e-308, got 1e-320",
    )
    assert_usage_error(["train", "--lr", "nan"], "--lr: expected a finite number in (0, 1], got nan")
    assert_usage_error(["train", "--dropout", "1"], "--dropout: expected a probability 0 <= p < 1, got 1.0")
    assert_usage_error(["explain", "2x2", "--heads", "-3"], "--heads: expected an int in [1, 1048576], got -3")
    assert_usage_error(["intervene", "The capital of France is", "--target", "-1"], "--target: expected an int >= 0")
    assert_usage_error(["heatmap", "causal-4", "--head", "-1"], "--head: expected an int >= 0, got -1")


def test_report_check_model_seq_len_beyond_the_model_is_a_usage_error(monkeypatch):
    from attnlab.checker import model as check_model_module

    def refuse(*args, **kwargs):
        raise AssertionError("the model was checked before --seq-len was")

    monkeypatch.setattr(check_model_module, "check_model", refuse)
    err = assert_usage_error(["check-model", "gpt2-tiny", "--seq-len", "100000"], "--seq-len: ")
    assert err == (
        "attnlab check-model: error: --seq-len: expected an int in [4, 64] (gpt2-tiny takes at most 64 positions), "
        "got 100000\n"
    )
    assert "BUG" not in err


def test_readme_shows_the_real_error_lines():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = readme.split("exit with status 2:\n\n```")[1].split("```")[0].splitlines()[1:]  # after the language tag
    for command, shown in zip(block[::2], block[1::2], strict=True):
        argv = command.removeprefix("$ attnlab ").split()
        code, out, err = call(*argv)
        assert code == 2 and out == "" and err == shown + "\n", (command, err)
