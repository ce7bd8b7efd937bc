"""Smoke runs of the benchmark plumbing with tiny sizes: structure of the table and JSON, never timings."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from attnlab import bench
from attnlab.cli import main
from attnlab.kernels import threads
from attnlab.kernels.tiled import flash_attention, gemm_floor


def test_run_bench_table_structure(tmp_path):
    seen = []
    r = bench.run_bench(
        sizes=(64, 96),
        d=(16,),
        heads=2,
        causal=(False, True),
        repetitions=2,
        backward=True,
        block_q=32,
        block_k=32,
        decode_contexts=(64, 128),
        progress=lambda desc, done, total: seen.append((done, total)),
    )
    assert seen[-1][0] == seen[-1][1] and [d for d, _ in seen] == list(range(1, len(seen) + 1))
    fwd = [row for row in r.rows if row.pass_ == "forward"]
    bwd = [row for row in r.rows if row.pass_ == "backward"]
    assert len(fwd) == 2 * 2 * 4 and len(bwd) == 2 * 2 * 4
    for row in fwd:
        assert len(row.times) == 2 and row.median_s > 0 and row.gflops > 0 and row.gemm_fraction > 0
        assert row.vs_torch is not None and row.vs_floor is not None
    torch_rows = [row for row in r.rows if row.method == "torch"]
    assert all(row.vs_torch == 1.0 for row in torch_rows)
    floor_bwd = [row for row in bwd if row.method == "floor"]
    assert all(row.median_s is None and "skipped" in row.note for row in floor_bwd)
    assert [d.context for d in r.decode] == [64, 128] and all(d.speedup > 0 for d in r.decode)
    text = r.table()
    lines = text.splitlines()
    assert lines[0].startswith("attnlab bench ") and "GEMM rate" in lines[0]
    assert lines[1].startswith("BLAS: ") and "kernel" in lines[1]
    assert lines[2].startswith("PyTorch: torch ")
    assert lines[4].split() == ["pass", "n", "d", "causal", "method", "median", "ms", "min", "ms", "GFLOP/s", "%GEMM",
                                "×torch", "×floor", "peak", "MB"]  # fmt: skip
    assert lines[5].split()[:5] == ["forward", "64", "16", "no", "naive"]
    assert any(line.split()[:2] == ["context", "decode"] for line in lines)
    assert any(line.startswith("decode step ≈ ") for line in lines)
    path = tmp_path / "b.json"
    r.write_json(str(path))
    data = json.loads(path.read_text())
    assert data["config"]["sizes"] == [64, 96] and len(data["rows"]) == 32 and data["blas_line"].startswith("BLAS")
    png = tmp_path / "b.png"
    bench.plot(r, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_naive_skipped_above_memory_limit_and_bad_method():
    r = bench.run_bench(sizes=(64,), d=(8,), heads=1, causal=(False,), repetitions=1, naive_max_gb=1e-9,
                        methods=("naive", "tiled"))  # fmt: skip
    naive = next(row for row in r.rows if row.method == "naive")
    assert naive.median_s is None and "exceed" in naive.note
    tiled_row = next(row for row in r.rows if row.method == "tiled")
    assert tiled_row.vs_torch is None and tiled_row.vs_floor is None
    with pytest.raises(ValueError, match="methods: unknown method 'fast'"):
        bench.run_bench(sizes=(32,), d=(8,), heads=1, causal=(False,), repetitions=1, methods=("fast",))


def test_decode_fit_recovers_a_line():
    rows = [bench.DecodeRow(c, 1e-5 + 2e-8 * c, 1.0, 1.0, 0.0) for c in (1024, 2048, 4096, 8192)]
    a, b, worst = bench.decode_fit(rows)
    assert a == pytest.approx(1e-5) and b == pytest.approx(2e-8) and worst < 1e-9
    assert bench.decode_fit(rows[:1]) is None


def test_long_context_runs_in_a_fresh_process():
    lr = bench.long_context(2048, d=16)
    assert lr.n == 2048 and lr.seconds > 0 and 10 < lr.peak_rss_mb < 512
    assert lr.dense_scores_gib == pytest.approx(2048 * 2048 * 4 / 2**30)


def test_peak_memory_sees_a_big_allocation_even_when_reused():
    _, mb = bench.peak_rss_growth(lambda: np.ones(64 * 2**20 // 8).sum())
    if sys.platform.startswith("linux"):
        assert 50 < mb < 200
    for _ in range(2):  # the second time the freed memory may be reused: tracemalloc still sees it
        _, mb = bench.peak_memory(lambda: np.ones(32 * 2**20 // 8).sum())
        assert 30 < mb < 150


def test_gemm_floor_is_the_blocked_products():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 50, 8)) for _ in range(3))
    got = gemm_floor(q, k, v, block_q=16, block_k=16)
    np.testing.assert_allclose(got, (q @ np.swapaxes(k, -1, -2) / np.sqrt(8)) @ v, atol=1e-12)
    got_c = gemm_floor(q, k, v, causal=True, block_q=16, block_k=16)
    assert got_c.shape == (2, 50, 8)  # whole blocks beyond the diagonal skipped, as in the kernel


def test_threads_and_blas_report(monkeypatch):
    info = threads.blas_report()
    assert info.library in ("openblas", "mkl", "blis", "flexiblas") and info.line().startswith("BLAS: ")
    assert threads.resolve_threads(None) == threads.available_cores()
    assert threads.run_tasks(lambda x: x * x, range(10), 2) == [x * x for x in range(10)]
    with threads.pinned_blas(1):
        from threadpoolctl import threadpool_info

        assert all(i["num_threads"] == 1 for i in threadpool_info() if i["user_api"] == "blas")
    # without threadpoolctl: one thread, BLAS untouched, and the report says why it knows nothing
    monkeypatch.setattr(threads, "_has_threadpoolctl", lambda: False)
    assert threads.resolve_threads(None) == 1
    assert threads.blas_report().library.startswith("unknown (install attnlab[fast]")
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 40, 8))
    np.testing.assert_allclose(flash_attention(q, q, q, block_q=8).output, flash_attention(q, q, q).output)


def test_bench_command(capsys, tmp_path):
    js = tmp_path / "r.json"
    rc = main(["bench", "--sizes", "32", "64", "--d", "8", "--heads", "1", "-r", "1", "--causal", "yes",
               "--methods", "tiled", "floor", "--json", str(js), "--no-progress"])  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in out if line.startswith("forward")]
    assert [(r[1], r[4]) for r in rows] == [("32", "tiled"), ("32", "floor"), ("64", "tiled"), ("64", "floor")]
    assert out[-1] == f"wrote {js}" and json.loads(js.read_text())["config"]["causal"] == [True]
    rc = main(["bench", "--sizes", "32", "--d", "8", "--heads", "1", "-r", "1", "--methods", "tiled"])
    captured = capsys.readouterr()
    assert rc == 0 and "forward" in captured.out
    assert main(["bench", "--sizes", "32", "-r", "0", "--no-progress"]) == 2
    assert "repetitions: expected an int >= 1, got 0" in capsys.readouterr().err
