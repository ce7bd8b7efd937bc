"""The robustness suite covers every public function and every CLI command (issue 12).

Each ``tests/test_robust_*.py`` file drives one area with generated careless and hostile inputs: every call either
raises a named :class:`attnlab.AttnlabError` or returns a finite result equal to an independent float64 reference,
inputs unchanged, no traceback. This file checks that no public callable or command is left out of that suite, and
covers the few small ones no other area owns (RoPE, the cost model's helpers, ``masks.to_string``, ``bench``).
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnlab
from attnlab import cost, masks
from attnlab.cli import main
from attnlab.commands import COMMANDS

HERE = Path(__file__).parent
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _robust_text() -> str:
    return "".join(p.read_text(encoding="utf-8") for p in sorted(HERE.glob("test_robust_*.py")))


def _public_callables(module, names) -> list[str]:
    out = []
    for n in names:
        obj = getattr(module, n)
        if type(obj).__module__ == "typing":  # a Literal alias such as masks.Align, not a function
            continue
        if inspect.isfunction(obj) or (callable(obj) and not inspect.isclass(obj) and not inspect.ismodule(obj)):
            out.append(n)
    return out


def test_every_public_function_is_driven_by_the_robustness_suite():
    text = _robust_text()
    missing = []
    for module in (attnlab, masks, cost, attnlab.invariants):
        for n in _public_callables(module, module.__all__):
            if not re.search(rf"\b{re.escape(n)}\b", text):
                missing.append(f"{module.__name__}.{n}")
    assert missing == [], f"public functions no tests/test_robust_*.py file calls: {missing}"


def test_every_cli_command_is_driven_by_the_robustness_suite():
    text = _robust_text()
    names = [importlib.import_module(f"attnlab.commands.{c}").NAME for c in COMMANDS]
    missing = [n for n in names if not re.search(rf"[\"']{re.escape(n)}[\"']", text)]
    assert missing == [], f"commands no tests/test_robust_*.py file runs: {missing}"


# --- RoPE -------------------------------------------------------------------------------------------------------


@SETTINGS
@given(
    n=st.integers(1, 6),
    half=st.integers(1, 4),
    offset=st.integers(0, 10**6),
    magnitude=st.sampled_from([1e-30, 1.0, 1e10, 1e30]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_apply_rope_is_a_rotation_of_each_pair(n, half, offset, magnitude, dtype, seed):
    """rope_tables / apply_rope: every pair (i, i + d/2) is rotated, so its norm is kept (float64 reference)."""
    d = 2 * half
    x = (np.random.default_rng(seed).standard_normal((2, n, d)) * magnitude).astype(dtype)
    before = x.copy()
    tables = attnlab.rope_tables(np.arange(offset, offset + n), d, dtype=dtype)
    y = attnlab.apply_rope(x, tables)
    np.testing.assert_array_equal(x, before)
    assert y.shape == x.shape and np.isfinite(y).all()
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    norm_in = np.hypot(x64[..., :half], x64[..., half:])
    norm_out = np.hypot(y64[..., :half], y64[..., half:])
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(norm_out, norm_in, rtol=rtol, atol=0)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: attnlab.rope_tables(np.arange(4), 7), attnlab.ShapeError, "head_dim"),
        (lambda: attnlab.rope_tables([0.5, 1.5], 8), attnlab.DTypeError, "positions: expected integers"),
        (
            lambda: attnlab.rope_tables(np.arange(4), 8, base=-1),
            attnlab.OptionError,
            "base: expected a finite number > 1",
        ),
        (lambda: attnlab.rope_tables(np.arange(4), 8, base="x"), attnlab.OptionError, "base: expected a finite number"),
        (lambda: attnlab.apply_rope(np.ones((4, 6)), attnlab.rope_tables(np.arange(4), 8)), attnlab.ShapeError, "x"),
        (lambda: attnlab.permutation_demo(1), attnlab.OptionError, "n: expected an int >= 2"),
    ],
)
def test_rope_bad_input_is_named(call, error, message):
    with pytest.raises(error, match=message):
        call()


@SETTINGS
@given(n=st.integers(2, 7), seed=st.integers(0, 100))
def test_permutation_demo_outputs_are_permuted_without_positions(n, seed):
    demo = attnlab.permutation_demo(n, 8, seed=seed)
    assert "RoPE" in demo.text()


# --- masks.to_string --------------------------------------------------------------------------------------------


@SETTINGS
@given(n_q=st.integers(1, 6), n_k=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_to_string_draws_every_entry(n_q, n_k, seed):
    m = np.random.default_rng(seed).random((n_q, n_k)) < 0.5
    before = m.copy()
    lines = masks.to_string(m).splitlines()
    np.testing.assert_array_equal(m, before)
    assert len(lines) == n_q
    assert [line.split() for line in lines] == [["■" if a else "⬚" for a in row] for row in m]


@pytest.mark.parametrize("bad", [np.ones((2, 2)), None, "mask", np.zeros((2, 2), np.int32)])
def test_to_string_refuses_what_is_not_a_mask(bad):
    with pytest.raises(attnlab.AttnlabError, match="mask"):
        masks.to_string(bad)


# --- the cost model's helpers -----------------------------------------------------------------------------------


@SETTINGS
@given(
    n_q=st.integers(1, 10**18),
    n_k=st.integers(1, 10**18),
    batch=st.integers(1, 10**6),
    heads=st.integers(1, 1024),
)
def test_score_elements_and_the_causal_count_are_exact_integers(n_q, n_k, batch, heads):
    assert cost.score_elements(n_q, n_k, batch=batch, heads=heads) == n_q * n_k * batch * heads
    c = cost.attention_cost(n_q, n_k, causal=True, batch=1, heads=8, d_model=512)
    m = min(n_q, n_k)
    exact = m * n_k - m * (m - 1) // 2  # query i (top-left) sees min(i + 1, n_k) keys
    assert isinstance(c.pairs, int) and c.pairs == exact == cost.causal_pairs(n_q, n_k)


@SETTINGS
@given(
    batch=st.integers(1, 10**4),
    seq_len=st.integers(1, 10**7),
    layers=st.integers(1, 200),
    kv_heads=st.integers(1, 128),
    head_dim=st.integers(1, 512),
    dtype=st.sampled_from(["float16", "bfloat16", "float32", "float64", "int8"]),
)
def test_kv_cache_bytes_is_the_formula(batch, seq_len, layers, kv_heads, head_dim, dtype):
    got = cost.kv_cache_bytes(
        batch=batch, seq_len=seq_len, layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype
    )
    per = cost.bytes_per_element(dtype)
    assert per == {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1}[dtype]
    assert got == 2 * batch * seq_len * layers * kv_heads * head_dim * per


@SETTINGS
@given(d_head=st.integers(1, 10**4), heads=st.integers(1, 64))
def test_crossover_length_is_an_exact_int(d_head, heads):
    got = cost.crossover_length(d_head * heads, heads=heads)
    assert isinstance(got, int) and got == 2 * d_head * heads  # d_model + h_kv · d_head with h_kv = h


@pytest.mark.parametrize(
    "call",
    [
        lambda: cost.score_elements(0),
        lambda: cost.score_elements(True),
        lambda: cost.score_elements(2.5),
        lambda: cost.kv_cache_bytes(batch=0, seq_len=1, layers=1, kv_heads=1, head_dim=1),
        lambda: cost.bytes_per_element("U4"),
        lambda: cost.bytes_per_element(object),
        lambda: cost.crossover_length(-3),
        lambda: cost.attention_cost(8, heads=math.nan),
    ],
)
def test_cost_bad_input_is_named(call):
    with pytest.raises(attnlab.AttnlabError):
        call()


@SETTINGS
@given(n=st.integers(1, 300), window=st.integers(1, 400))
def test_window_pairs_counts_the_window_mask(n, window):
    """``cost.window_pairs`` is the number of (query, key) pairs a causal sliding window allows, counted here on the
    mask itself."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    assert cost.window_pairs(n, window) == int(np.sum((j <= i) & (i - j < window)))


@pytest.mark.parametrize("args", [(0, 2), (4, 0), (True, 2), (2.5, 1), (4, math.nan), ("4", 2)])
def test_window_pairs_bad_input_is_named(args):
    with pytest.raises(attnlab.AttnlabError, match=r"^(n|window):"):
        cost.window_pairs(*args)


# --- attnlab worksheet: bad flags refused before anything is written -------------------------------------------


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--item", "0"], "--item"),
        (["--item", "44"], "--item"),
        (["--item", "x"], "--item"),
        (["--lang", "fr"], "--lang"),
        (["--format", "pdf"], "--format"),
    ],
)
def test_worksheet_bad_flags_are_named(argv, flag, tmp_path, capsys):
    out = tmp_path / "w.html"
    assert main(["worksheet", "-o", str(out), *argv]) == 2
    assert flag in capsys.readouterr().err and not out.exists()


def test_worksheet_writes_one_item(tmp_path):
    out = tmp_path / "w.md"
    assert main(["worksheet", "-o", str(out), "--item", "3", "--lang", "zh"]) == 0
    assert out.read_text(encoding="utf-8").strip()


# --- attnlab bench: every option checked before any timing ------------------------------------------------------


@SETTINGS
@given(
    argv=st.sampled_from(
        [
            ["--sizes", "0"],
            ["--sizes", "-5"],
            ["--sizes", "nan"],
            ["--d", "0"],
            ["--heads", "-1"],
            ["-r", "0"],
            ["--decode", "-5"],
            ["--json", "/nonexistent/dir/x.json"],
            ["--methods", "nope"],
            ["--isolate", "0"],
            ["--long", "abc"],
        ]
    )
)
def test_bench_bad_options_exit_2_with_one_line(capsys, argv):
    assert main(["bench", *argv, "--no-progress"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("attnlab bench: error: "), err


# --- mask constructors: bounded memory ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda: masks.causal(10**6), "causal"),
        (lambda: masks.window(10**6, left=4), "window"),
        (lambda: masks.segments(np.zeros(10**6, np.int64)), "segments"),
    ],
)
def test_mask_constructors_refuse_dense_masks_beyond_the_limit(call, what):
    """Issue 12: masks.causal(10**6) asked NumPy for 931 GiB; now a named MemoryLimitError before allocating."""
    with pytest.raises(attnlab.MemoryLimitError, match=rf"{what}: a dense mask of shape \(1000000, 1000000\) needs"):
        call()
