"""Ring attention's pieces in one process: layouts, the lse merge, the tiled forward/backward at P = 1, errors, CLI."""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from procs import descendants, kill_all, state, wait_for, wait_gone, with_default_sigint

import attnlab
from attnlab import masks
from attnlab._process import Terminated, signals_raise
from attnlab.cli import main
from attnlab.distributed import (
    RingLayout,
    launch,
    merge_partials,
    ring_attention,
    ring_attention_backward,
    ring_attention_forward,
)
from attnlab.distributed.launch import SpawnError, format_report, spawn

# --------------------------------------------------------------------------------------------------------------
# layouts


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 90), world=st.integers(1, 9), zig=st.booleans())
def test_layout_partitions_the_sequence(n, world, zig):
    kind = "zigzag" if zig else "contiguous"
    if n < world * (2 if zig else 1):
        with pytest.raises(attnlab.ShapeError, match=rf"n: a '{kind}' layout over P={world} ranks"):
            RingLayout(n, world, kind)
        return
    lay = RingLayout(n, world, kind)
    pos = np.concatenate([lay.positions(r) for r in range(world)])
    assert sorted(pos.tolist()) == list(range(n))
    assert max(lay.sizes()) - min(lay.sizes()) <= (2 if zig else 1)
    x = np.arange(2 * n * 3).reshape(2, n, 3)
    shards = [lay.shard(x, r) for r in range(world)]
    assert all(np.array_equal(s[:, :, 0] // 3 % n, np.broadcast_to(lay.positions(r), s.shape[:2])) for r, s in
               enumerate(shards))  # fmt: skip
    assert np.array_equal(lay.unshard(shards), x)
    t = torch.from_numpy(x)
    assert torch.equal(lay.unshard([lay.shard(t, r) for r in range(world)]), t)


def test_zigzag_pairs_an_early_and_a_late_chunk():
    lay = RingLayout(16, 4, "zigzag")
    assert [lay.chunks(r) for r in range(4)] == [
        ((0, 2), (14, 16)),
        ((2, 4), (12, 14)),
        ((4, 6), (10, 12)),
        ((6, 8), (8, 10)),
    ]
    assert lay.to_string().splitlines()[3] == "rank 3: ⬚ ⬚ ⬚ ⬚ ⬚ ⬚ 3 3 3 3 ⬚ ⬚ ⬚ ⬚ ⬚ ⬚"


def test_layout_errors_name_the_argument():
    with pytest.raises(attnlab.OptionError, match=r"layout: expected one of 'contiguous', 'zigzag', got 'ring'"):
        RingLayout(8, 2, "ring")
    with pytest.raises(attnlab.OptionError, match=r"world_size: expected an int >= 1, got 0"):
        RingLayout(8, 0)
    with pytest.raises(attnlab.OptionError, match=r"rank: expected an int in \[0, 1\], got 2"):
        RingLayout(8, 2).chunks(2)
    with pytest.raises(
        attnlab.ShapeError, match=r"x: expected \[..., n=8, d\] to shard along axis -2, got shape \(7, 3\)"
    ):
        RingLayout(8, 2).shard(np.zeros((7, 3)), 0)
    with pytest.raises(attnlab.ShapeError, match=r"shards\[1\]: expected \[..., n_r=4, d\] for rank 1"):
        RingLayout(8, 2).unshard([np.zeros((4, 1)), np.zeros((3, 1))])


# --------------------------------------------------------------------------------------------------------------
# the lse merge


@settings(max_examples=60, deadline=None)
@given(
    n_k=st.integers(2, 12),
    cut=st.integers(1, 11),
    seed=st.integers(0, 2**16),
    block_a=st.booleans(),
    block_b=st.booleans(),
)
def test_merging_two_key_sets_equals_attention_over_their_union(n_k, cut, seed, block_a, block_b):
    cut = min(cut, n_k - 1)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, m, 4, generator=g, dtype=torch.float64) for m in (5, n_k, n_k))
    allowed = torch.rand(2, 3, 5, n_k, generator=g) < 0.7
    if block_a:
        allowed[..., :cut] = False
    if block_b:
        allowed[..., cut:] = False
    parts = []
    for sl in (slice(0, cut), slice(cut, n_k)):
        t = attnlab.attention_trace(q, k[..., sl, :], v[..., sl, :], allowed[..., sl], masked_rows="zero")
        parts.append((t.output, t.lse))
    out, lse = merge_partials(*parts[0], *parts[1])
    full = attnlab.attention_trace(q, k, v, allowed, masked_rows="zero")
    assert torch.allclose(out, full.output, atol=1e-12)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(full.lse))
    assert not torch.isnan(out).any()
    fin = torch.isfinite(full.lse)
    assert torch.allclose(lse[fin], full.lse[fin], atol=1e-12)


# --------------------------------------------------------------------------------------------------------------
# one rank: the tiled forward and backward against the core and autograd


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 23),
    h_kv=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 3]),
    d_k=st.integers(1, 6),
    d_v=st.integers(1, 5),
    causal=st.sampled_from([False, True]),
    block_q=st.integers(1, 9),
    block_k=st.integers(1, 9),
    seed=st.integers(0, 2**16),
)
def test_one_rank_equals_the_core_forward_and_backward(n, h_kv, group, d_k, d_v, causal, block_q, block_k, seed):
    g = torch.Generator().manual_seed(seed)
    h = h_kv * group
    q = torch.randn(2, h, n, d_k, generator=g, dtype=torch.float64)
    k = torch.randn(2, h_kv, n, d_k, generator=g, dtype=torch.float64)
    v = torch.randn(2, h_kv, n, d_v, generator=g, dtype=torch.float64)
    dO = torch.randn(2, h, n, d_v, generator=g, dtype=torch.float64)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out = ring_attention(*leaves, causal=causal, block_q=block_q, block_k=block_k)
    out.backward(dO)
    ref_leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    rq, rk, rv = ref_leaves
    ref = attnlab.scaled_dot_product_attention(
        rq, rk.repeat_interleave(group, dim=-3), rv.repeat_interleave(group, dim=-3), causal=causal
    )
    ref.backward(dO)
    assert torch.allclose(out, ref, atol=1e-12)
    for got, want in zip(leaves, ref_leaves, strict=True):
        assert torch.allclose(got.grad, want.grad, atol=1e-11)
    res = ring_attention_forward(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
    tiles = math.ceil(n / block_q) * math.ceil(n / block_k)
    assert res.stats.tiles_computed + res.stats.tiles_skipped == tiles
    assert res.stats.bytes_sent == 0 and res.stats.world_size == 1


def test_float32_meets_the_flash_attention_rule_with_padding():
    g = torch.Generator().manual_seed(3)
    q64, k64, v64, dO64 = (torch.randn(3, 4, 50, 16, generator=g, dtype=torch.float64) * 3 for _ in range(4))
    lengths, qlens = [50, 31, 7], [50, 40, 7]
    mask = torch.from_numpy(masks.key_padding(lengths, 50) & masks.query_padding(qlens, 50))

    def core(dtype):
        leaves = [x.detach().clone().to(dtype).requires_grad_(True) for x in (q64, k64, v64)]
        o = attnlab.scaled_dot_product_attention(*leaves, mask, causal=True, masked_rows="zero")
        o.backward(dO64.to(dtype))
        return [o.detach().double()] + [x.grad.double() for x in leaves]

    leaves = [x.float().requires_grad_(True) for x in (q64, k64, v64)]
    o = ring_attention(*leaves, causal=True, key_lengths=lengths, query_lengths=qlens, masked_rows="zero", block_q=8,
                       block_k=16)  # fmt: skip
    o.backward(dO64.float())
    got = [o.detach().double()] + [x.grad.double() for x in leaves]
    ref, naive = core(torch.float64), core(torch.float32)
    for name, a, b, c, factor in zip(("out", "dq", "dk", "dv"), got, ref, naive, (2, 3, 3, 3), strict=True):
        err, base = float((a - b).abs().max()), float((c - b).abs().max())
        assert err <= factor * base + 1e-6, f"{name}: {err:.3g} vs naive float32 {base:.3g}"


def test_functional_backward_matches_autograd_and_keeps_inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v, dO = (torch.randn(1, 2, 9, 3, generator=g) for _ in range(4))
    saved = [x.clone() for x in (q, k, v, dO)]
    fwd = ring_attention_forward(q, k, v, causal=True, block_q=4, block_k=2)
    grads = ring_attention_backward(fwd, dO)
    with pytest.raises(attnlab.DTypeError, match=r"^result: expected the RingResult .* got Tensor"):
        ring_attention_backward(dO, q)  # the old (dO, q, k, v, output, lse) spelling is gone (0.2.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'causal'"):
        ring_attention_backward(fwd, dO, causal=True)  # the result holds the forward's options
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    ring_attention(*leaves, causal=True).backward(dO)
    for a, b in zip((grads.dq, grads.dk, grads.dv), leaves, strict=True):
        assert torch.allclose(a, b.grad, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(saved, (q, k, v, dO), strict=True))
    assert grads.dq.dtype == torch.float32 and fwd.lse.dtype == torch.float32


def test_key_lengths_is_the_only_spelling():
    """``key_lengths=`` hides padded keys; the ring's old ``lengths=`` is gone (0.2.0)."""
    q = torch.randn(2, 1, 6, 4, dtype=torch.float64)
    new = ring_attention_forward(q, q, q, key_lengths=[6, 3])
    ref = attnlab.scaled_dot_product_attention(q, q, q, mask=masks.key_padding([6, 3], 6))
    assert torch.allclose(new.output, ref, atol=1e-12)
    for fn in (ring_attention_forward, ring_attention):
        with pytest.raises(TypeError, match="unexpected keyword argument 'lengths'"):
            fn(q, q, q, lengths=[6, 3])


def test_masked_rows_policy_at_one_rank():
    q = torch.randn(2, 1, 6, 4)
    with pytest.raises(attnlab.MaskedRowError, match=r"6 query row\(s\) may attend to no key at all") as err:
        ring_attention(q, q, q, key_lengths=[6, 0])
    assert err.value.rows[0] == (1, 0, 0)
    zero = ring_attention_forward(q, q, q, key_lengths=[6, 0], masked_rows="zero")
    assert torch.all(zero.output[1] == 0) and torch.isneginf(zero.lse[1]).all()
    nan = ring_attention_forward(q, q, q, key_lengths=[6, 0], masked_rows="nan")
    assert torch.isnan(nan.output[1]).all() and not torch.isnan(nan.output[0]).any()


# --------------------------------------------------------------------------------------------------------------
# errors


def test_errors_name_the_argument_and_shapes():
    q = torch.randn(1, 4, 5, 3)
    with pytest.raises(attnlab.ShapeError, match=r"k: h_kv=3 key/value heads \(dim -3\) must divide q's h=4"):
        ring_attention(q, torch.randn(1, 3, 5, 3), torch.randn(1, 3, 5, 3))
    with pytest.raises(attnlab.ShapeError, match=r"k: last dim d_k=2 does not match q's d_k=3"):
        ring_attention(q, torch.randn(1, 4, 5, 2), torch.randn(1, 4, 5, 2))
    with pytest.raises(attnlab.ShapeError, match=r"q: expected at least 3 dims \[..., h, n_r, d_k\]"):
        ring_attention(torch.randn(5, 3), torch.randn(5, 3), torch.randn(5, 3))
    with pytest.raises(attnlab.DTypeError, match=r"q: ring attention runs on torch tensors, got ndarray"):
        ring_attention(np.zeros((1, 2, 3)), q, q)
    with pytest.raises(attnlab.ShapeError, match=r"key_lengths: 2 entries, expected one per sequence \(B=1"):
        ring_attention(q, q, q, key_lengths=[5, 5])
    with pytest.raises(attnlab.ShapeError, match=r"key_lengths: entry 0 is 9; expected 0 <= length <= n_k=5"):
        ring_attention(q, q, q, key_lengths=[9])
    with pytest.raises(attnlab.OptionError, match=r"block_q: expected an int >= 1, got 0"):
        ring_attention(q, q, q, block_q=0)
    with pytest.raises(attnlab.MaskError, match=r"masked_rows: expected one of 'raise', 'zero', 'nan'"):
        ring_attention(q, q, q, masked_rows="skip")
    with pytest.raises(attnlab.MaskError, match=r"causal=True: n_q=5 != n_k=7"):
        ring_attention(q, torch.randn(1, 4, 7, 3), torch.randn(1, 4, 7, 3), causal=True)
    bad = torch.randn(1, 2, 5, 3)
    bad[0, 1, 4, 2] = math.inf
    with pytest.raises(attnlab.NonFiniteError, match=r"k: holds inf at index \(0, 1, 4, 2\)"):
        ring_attention(q, bad, bad)  # GQA 4:2: the index is in the caller's shape
    with pytest.raises(attnlab.AttnlabError, match=r"group: a process group was passed"):
        ring_attention(q, q, q, group=object())


def test_missing_rank_is_reported_not_awaited():
    t0 = time.monotonic()
    with pytest.raises(SpawnError, match=r"(?s)^rank 1 of 2 failed at step 1 \(running\):\n.*ZeroDivisionError: boom"):
        spawn(_fail_on_rank_1, 2, timeout=60, op_timeout=30, threads=1)
    assert time.monotonic() - t0 < 25  # rank 0 waits in a barrier: it is stopped, not awaited for op_timeout
    assert _ranks_of(os.getpid()) == set()


def test_spawn_retries_when_the_free_port_was_taken(monkeypatch):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = [taken.getsockname()[1]]
        real = launch.free_port
        monkeypatch.setattr(launch, "free_port", lambda: ports.pop() if ports else real())
        assert spawn(_rank_squared, 2, timeout=60, op_timeout=10, threads=1) == [0, 1]
        assert ports == []


def _rank_squared(rank: int, world: int) -> int:
    return rank * rank


def _fail_on_rank_1(rank: int, world: int) -> int:
    import torch.distributed as dist

    if rank == 1:
        raise ZeroDivisionError("boom")
    dist.barrier()  # would wait for rank 1 until op_timeout
    return rank


# --------------------------------------------------------------------------------------------------------------
# the CLI


def test_cli_ring_runs_two_ranks_and_checks(capsys):
    code = main(["ring", "-n", "24", "-P", "2", "--heads", "4", "--kv-heads", "2", "--d-k", "8", "--d-v", "4",
                 "--causal", "--backward", "--block", "4"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == (
        "ring attention: n=24 P=2 (gloo, cpu) layout=zigzag causal=True batch=1 heads=4 kv_heads=2 d_k=8 d_v=4 "
        "float32 block=4 forward+backward"
    )
    header = ["rank", "shard", "time", "waiting", "peak", "mem", "sent", "received", "tiles", "skipped", "GFLOP"]
    assert lines[1].split() == header
    # each rank holds 12 positions of k, v (2 heads · (8 + 4) = 24 floats each); it sends k, v once in the forward
    # and once in the backward, and dk, dv twice (P hops): 4 · 12 · 24 · 4 B = 4.5 KiB
    for r, line in enumerate(lines[2:4]):
        cols = line.split()
        assert cols[:2] == [str(r), "12"] and cols[6:10] == ["4.5", "KiB", "4.5", "KiB"], line
    assert re.match(r"time \(slowest rank\): [\d.]+ ms; peak memory \(RSS high-water, shards included\) max", lines[4])
    assert lines[5].startswith("check vs float64 single-process reference: PASS: max abs error output ")


def test_cli_ring_rejects_bad_heads(capsys):
    assert main(["ring", "-n", "8", "--heads", "4", "--kv-heads", "3"]) == 2
    assert capsys.readouterr().err == "attnlab ring: error: kv_heads: 3 key/value heads must divide heads=4\n"


# --------------------------------------------------------------------------------------------------------------
# the launcher: validation before spawning, dead and stopped ranks, being killed, torchrun without peers


def _ranks_of(pid: int) -> set[int]:
    """The living rank processes (multiprocessing's spawn children) below ``pid``."""
    out = set()
    for p in descendants(pid):
        try:
            if b"multiprocessing.spawn" in Path(f"/proc/{p}/cmdline").read_bytes():
                out.add(p)
        except OSError:
            pass
    return out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-n", "3", "-P", "2", "--causal"], "n: a 'zigzag' layout over P=2 ranks cuts the sequence into 4 chunks, so"),
        (["-n", "3", "-P", "4"], "n: a 'contiguous' layout over P=4 ranks cuts the sequence into 4 chunks, so"),
        (["--timeout", "-5"], "--timeout: expected a finite number > 0, got -5.0"),
        (["--timeout", "inf"], "--timeout: expected a finite number > 0, got inf"),
        (["-P", "0"], "-P/--procs: expected an int >= 1, got 0"),
        (["-P", "65"], "-P/--procs: expected an int <= 64, got 65"),
        (["-n", "1e3"], "-n/--seq-len: expected an int >= 1, got '1e3'"),
        (["--block", "0"], "--block: expected an int >= 1, got 0"),
        (["--inject-fault", "2:1:kill"], "--inject-fault: rank 2 is not one of the 2 spawned ranks"),
        (["--inject-fault", "1:1:melt"], "fault action: expected one of 'kill', 'stop', 'exit', 'raise', got 'melt'"),
    ],
)
def test_cli_ring_checks_every_argument_before_spawning(capsys, argv, message):
    t0 = time.monotonic()
    assert main(["ring", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnlab ring: error: {message}") and err.count("\n") == 1, err
    assert time.monotonic() - t0 < 2 and _ranks_of(os.getpid()) == set()  # nothing was started


KILLED = "attnlab ring: error: rank 1 of 2 died at step 3 (pass 1: forward) (killed by SIGKILL); every rank was stopped"


def test_cli_ring_reports_a_killed_rank_and_stops_the_others(capsys):
    code = main(["ring", "-n", "24", "-P", "2", "--block", "4", "--inject-fault", "1:3:kill"])
    assert code == 1
    assert capsys.readouterr().err == KILLED + "\n"
    assert _ranks_of(os.getpid()) == set()


def test_docs_failure_messages_are_real(capsys):
    import shlex

    doc = (Path(__file__).resolve().parents[1] / "docs" / "distributed.md").read_text()
    section = doc[doc.index("### Bad arguments, timeouts, dead ranks and clean-up") :]
    first, _, second = section.split("```")[1:4]
    lines = first.strip().splitlines()
    if lines[0] in ("console", "text", "bash"):  # the block's language tag
        lines = lines[1:]
    assert len(lines) == 4
    for cmd, shown in zip(lines[::2], lines[1::2], strict=True):
        assert main(shlex.split(cmd.removeprefix("$ "))[1:]) == 2
        assert capsys.readouterr().err == shown + "\n"
    shown = second.strip().splitlines()
    assert shown[1 if shown[0] in ("console", "text") else 0] == KILLED  # after the block's language tag


def test_cli_ring_reports_a_stopped_rank_after_the_timeout(capsys):
    t0 = time.monotonic()
    code = main(["ring", "-n", "24", "-P", "2", "--block", "4", "--timeout", "2", "--inject-fault", "1:4:stop"])
    assert code == 1
    assert capsys.readouterr().err == (
        "attnlab ring: error: rank 1 of 2 did not answer within 2 s at step 4 (gathering on rank 0); "
        "every rank was stopped\n"
    )
    assert time.monotonic() - t0 < 40  # start-up (torch in two processes) + 2 s, not the old 600 s
    assert _ranks_of(os.getpid()) == set()


# SIGTERM and SIGHUP take the same path as SIGINT once signals_raise has turned them into a KeyboardInterrupt (tested
# below, in-process); SIGINT to the group also checks that the ranks ignore it (no traceback from them)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_killing_attnlab_ring_takes_its_ranks_with_it(sig):
    # rank 1 stops itself at its first step, so the run is alive (and would stay so for --timeout 60 s) when killed
    cmd = [sys.executable, "-m", "attnlab", "ring", "-n", "24", "-P", "2", "--inject-fault", "1:1:stop"]
    proc = subprocess.Popen(
        with_default_sigint(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    ranks: set[int] = set()
    try:

        def one_stopped() -> set[int] | None:
            rs = _ranks_of(proc.pid)
            return rs if len(rs) == 2 and "T" in {state(r) for r in rs} else None

        ranks = wait_for(one_stopped, 60, "two ranks, one of them stopped")
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # Ctrl-C in a terminal: the whole group, ranks included
        else:
            os.kill(proc.pid, sig)
        proc.wait(10)
        assert wait_gone(ranks, 5) == set(), "ranks outlived attnlab ring"
        if sig != signal.SIGKILL:
            assert proc.returncode == 128 + sig
            what = "interrupted by Ctrl-C" if sig == signal.SIGINT else "stopped by SIGTERM"
            assert proc.stderr.read() == f"attnlab ring: {what}; every rank was stopped\n"  # no rank's traceback
    finally:
        kill_all(ranks | {proc.pid})
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.parametrize("rank", [0, 1])
def test_torchrun_environment_without_peers_fails_in_one_line(monkeypatch, capsys, rank):
    port = launch.free_port()
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    t0 = time.monotonic()
    assert main(["ring", "-n", "8", "--timeout", "1"]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith(
            f"attnlab ring: error: rank {rank} of 2 waited 1 s for the other ranks at 127.0.0.1:{port} "
            "(MASTER_ADDR:MASTER_PORT) and gave up: Dist"
        )
        and err.count("\n") == 1
    ), err
    assert time.monotonic() - t0 < 15
    import torch.distributed as dist

    assert not dist.is_initialized()


def test_torchrun_rank_pointed_at_a_silent_port_honours_timeout(monkeypatch, capsys):
    """A port that accepts connections and says nothing (not a TCPStore): torch's client would wait forever."""
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(server.accept()[0])

    def close() -> None:
        server.close()
        for c in accepted:
            c.close()  # the abandoned rendezvous thread (or, unfixed, the hung join) sees the connection close

    threading.Thread(target=accept, daemon=True).start()
    bound = threading.Timer(20.0, close)  # bounds this test even where --timeout is ignored
    bound.start()
    port = server.getsockname()[1]
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(launch, "_JOIN_GRACE_S", 1.0, raising=False)
    t0 = time.monotonic()
    try:
        assert main(["ring", "-n", "8", "--timeout", "2"]) == 1
        elapsed = time.monotonic() - t0
    finally:
        bound.cancel()
        close()
    err = capsys.readouterr().err
    assert err == (
        f"attnlab ring: error: rank 1 of 2 waited 2 s for the other ranks at 127.0.0.1:{port} (MASTER_ADDR:"
        "MASTER_PORT) and gave up: something accepts connections there but does not answer as torch.distributed's "
        "TCPStore (is MASTER_PORT another program's port?)\n"
    )
    assert accepted  # it did connect: the silence, not a refused connection, was the problem
    assert elapsed < 2 + 1 + 5


def test_torchrun_environment_is_checked_before_joining(monkeypatch, capsys):
    for key, value in {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    assert main(["ring", "-n", "8"]) == 2
    assert capsys.readouterr().err == "attnlab ring: error: RANK: expected an int in [0, 1], got 2\n"
    monkeypatch.setenv("RANK", "0")
    assert main(["ring", "-n", "3", "--causal"]) == 2  # the layout for WORLD_SIZE, not -P
    assert "over P=2 ranks" in capsys.readouterr().err
    monkeypatch.setenv("MASTER_PORT", "x")
    assert main(["ring", "-n", "8"]) == 2
    assert capsys.readouterr().err == "attnlab ring: error: MASTER_PORT: expected an int, got 'x' (torchrun sets it)\n"


def test_signals_raise_turns_sigterm_and_sighup_into_terminated():
    before = signal.getsignal(signal.SIGHUP)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(Terminated, match=f"stopped by {sig.name}") as err, signals_raise():
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the handler raises before this ends
        assert err.value.signum == sig and isinstance(err.value, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGHUP) is before


def test_ring_imports_stay_lazy():
    import subprocess

    code = "import sys, attnlab.commands.ring; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    assert callable(format_report)


def test_docs_layout_picture_is_real():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "distributed.md").read_text()
    start = doc.index('>>> print(RingLayout(16, 4, "zigzag").to_string())\n') + len(
        '>>> print(RingLayout(16, 4, "zigzag").to_string())\n'
    )
    drawn = doc[start:].split("```")[0].strip()
    assert drawn == RingLayout(16, 4, "zigzag").to_string()
