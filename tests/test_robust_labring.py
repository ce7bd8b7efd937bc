"""Property tests: ``attnlab lab`` and ``attnlab ring`` check every argument before any work starts (exit status 2,
one line naming the first bad flag), and the launcher's validators accept exactly what the ranks could run.

Every case here is invalid on purpose, so nothing is ever started (a valid draw is skipped with ``assume``); the
tests run in-process through ``attnlab.cli.main``.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
from unittest import mock

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from attnlab.cli import main
from attnlab.distributed.launch import (
    FAULT_ACTIONS,
    MAX_SPAWNED,
    Fault,
    RingRunConfig,
    check_run,
    torchrun_environment,
)
from attnlab.errors import OptionError, ShapeError
from attnlab.lab.server import start

FEW = settings(max_examples=25, deadline=None)

# flag values as a user types them: numbers (often out of range) and text that is not a number
INT_TEXT = st.one_of(st.integers(-5, 5).map(str), st.integers(-(10**6), 10**6).map(str), st.sampled_from(
    ["x", "1.5", "", "1e3", "0x10", " 7", "+3", "1_000", "٣"]))  # fmt: skip
FLOAT_TEXT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-3, 3).map(str),
    st.sampled_from(["x", "", "1,5", "inf", "-inf", "nan", "1e400", "0.0"]),
)


def as_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def as_float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def run(argv: list[str]) -> tuple[int, str]:
    """``main(argv)``'s exit status and what it wrote to stderr (it must write nothing to stdout)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert out.getvalue() == ""
    return code, err.getvalue()


# --------------------------------------------------------------------------------------------------------------
# attnlab lab


@FEW
@given(port=INT_TEXT, timeout=FLOAT_TEXT)
def test_lab_rejects_every_bad_port_and_timeout_in_one_line(port, timeout):
    p, t = as_int(port), as_float(timeout)
    port_ok = p is not None and 0 <= p <= 65535
    timeout_ok = t is not None and math.isfinite(t) and t > 0
    assume(not (port_ok and timeout_ok))  # a valid pair would start a server
    code, err = run(["lab", f"--port={port}", f"--timeout={timeout}", "--exit-when-ready"])
    first = "--port" if not port_ok else "--timeout"
    assert code == 2
    assert err.startswith(f"attnlab lab: error: {first}: expected ") and err.count("\n") == 1, err


@FEW
@given(port=st.one_of(st.integers(max_value=-1), st.integers(min_value=65536), st.booleans(), st.just(80.0)))
def test_lab_server_start_refuses_bad_ports_before_starting_anything(port):
    with pytest.raises(OptionError, match=r"^port: expected an int in \[0, 65535\], got "):
        start(port)


# --------------------------------------------------------------------------------------------------------------
# attnlab ring

SIZE_FLAGS = [("-n", "-n/--seq-len"), ("-P", "-P/--procs"), ("--batch", "--batch"), ("--heads", "--heads"),
              ("--kv-heads", "--kv-heads"), ("--d-k", "--d-k"), ("--block", "--block")]  # fmt: skip


@FEW
@given(
    sizes=st.lists(
        st.one_of(st.integers(-2, 9).map(str), INT_TEXT), min_size=len(SIZE_FLAGS), max_size=len(SIZE_FLAGS)
    ),
    timeout=st.one_of(st.just("5"), FLOAT_TEXT),
    causal=st.booleans(),
    layout=st.sampled_from([None, "contiguous", "zigzag"]),
)
def test_ring_rejects_every_bad_argument_before_spawning(sizes, timeout, causal, layout):
    values = dict(zip([f for f, _ in SIZE_FLAGS], sizes, strict=True))
    # the model: what the command must refuse, in the order it checks
    problems = [name for (flag, name) in SIZE_FLAGS if (as_int(values[flag]) or 0) < 1]
    t = as_float(timeout)
    if t is None or not math.isfinite(t) or t <= 0:
        problems.append("--timeout")
    if not problems and as_int(values["-P"]) > MAX_SPAWNED:
        problems.append("-P/--procs")
    n, P, h, h_kv = (as_int(values[f]) for f in ("-n", "-P", "--heads", "--kv-heads"))
    if not problems and h % h_kv:
        problems.append("kv_heads")
    kind = layout or ("zigzag" if causal else "contiguous")
    if not problems and n < P * (2 if kind == "zigzag" else 1):
        problems.append("n")
    assume(problems)  # a valid run would spawn ranks
    argv = ["ring", *(f"{flag}={v}" for flag, v in values.items()), f"--timeout={timeout}"]
    argv += (["--causal"] if causal else []) + ([f"--layout={layout}"] if layout else [])
    code, err = run(argv)
    assert code == 2
    assert err.startswith(f"attnlab ring: error: {problems[0]}: ") and err.count("\n") == 1, (problems, err)


# --------------------------------------------------------------------------------------------------------------
# the launcher's validators


@FEW
@given(n=st.integers(1, 80), world=st.integers(1, 12), kind=st.sampled_from(["contiguous", "zigzag"]))
def test_check_run_accepts_exactly_the_layouts_that_exist(n, world, kind):
    cfg = RingRunConfig(n=n, layout=kind, causal=kind == "zigzag")
    if n >= world * (2 if kind == "zigzag" else 1):
        check_run(cfg, world)
    else:
        with pytest.raises(ShapeError, match=rf"^n: a '{kind}' layout over P={world} ranks cuts the sequence"):
            check_run(cfg, world)


@FEW
@given(
    field=st.sampled_from(["n", "batch", "heads", "kv_heads", "d_k", "d_v", "block", "repeats"]),
    value=st.one_of(st.integers(-3, 0), st.just(2.0), st.just("4"), st.booleans(), st.none()),
)
def test_run_config_refuses_non_positive_or_non_int_sizes(field, value):
    with pytest.raises(OptionError, match=rf"^{field}: expected an int >= 1, got "):
        RingRunConfig(**{field: value})


@FEW
@given(heads=st.integers(1, 12), kv_heads=st.integers(1, 12))
def test_run_config_needs_kv_heads_to_divide_heads(heads, kv_heads):
    if heads % kv_heads == 0:
        assert RingRunConfig(heads=heads, kv_heads=kv_heads).kv_heads == kv_heads
    else:
        with pytest.raises(ShapeError, match=rf"^kv_heads: {kv_heads} key/value heads must divide heads={heads}$"):
            RingRunConfig(heads=heads, kv_heads=kv_heads)


@FEW
@given(rank=st.integers(-2, 5), step=st.integers(-2, 9), action=st.sampled_from([*FAULT_ACTIONS, "melt", ""]))
def test_fault_parse_round_trips_or_names_the_problem(rank, step, action):
    text = f"{rank}:{step}:{action}"
    if rank >= 0 and step >= 0 and action in FAULT_ACTIONS:
        assert Fault.parse(text) == Fault(rank, step, action)
    else:
        with pytest.raises(OptionError, match=r"^fault (rank|step|action): expected "):
            Fault.parse(text)


@FEW
@given(text=st.text(alphabet="01:k-x ", max_size=8).filter(lambda t: t.count(":") != 2))
def test_fault_parse_refuses_other_shapes(text):
    with pytest.raises(OptionError, match=r"^fault: expected RANK:STEP:ACTION \(e\.g\. 1:3:kill\), got "):
        Fault.parse(text)


@FEW
@given(rank=INT_TEXT, world=INT_TEXT, port=INT_TEXT, addr=st.sampled_from(["127.0.0.1", "node0", ""]))
def test_torchrun_environment_is_read_or_refused_by_name(rank, world, port, addr):
    env = {"RANK": rank, "WORLD_SIZE": world, "MASTER_PORT": port, "MASTER_ADDR": addr}
    r, w, p = as_int(rank), as_int(world), as_int(port)
    with mock.patch.dict(os.environ, env):
        if w is None or w < 1:
            bad = "WORLD_SIZE"
        elif r is None or not 0 <= r < w:
            bad = "RANK"
        elif p is None or not 1 <= p <= 65535:
            bad = "MASTER_PORT"
        elif not addr:
            bad = "MASTER_ADDR"
        else:
            assert torchrun_environment() == (r, w, addr, p)
            return
        with pytest.raises(OptionError, match=rf"^{bad}: expected "):
            torchrun_environment()
