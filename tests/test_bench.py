"""Smoke runs of the benchmark plumbing with tiny sizes: structure of the table and JSON, never timings."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from attnlab import bench
from attnlab.bench import gemm_floor
from attnlab.cli import main
from attnlab.errors import OptionError
from attnlab.kernels import threads
from attnlab.kernels.tiled import flash_attention


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
    assert lines[1] == r.cpu.line() and lines[1].startswith(f"CPU: {r.cpu.model}, {r.cpu.isa}; NumPy float32 exp2: ")
    assert lines[2].startswith("BLAS: ") and "kernel" in lines[2]
    assert lines[3].startswith("PyTorch: torch ")
    assert lines[4].startswith("timing: every method in this process")
    assert lines[6].split() == ["pass", "n", "d", "causal", "method", "median", "ms", "min", "ms", "GFLOP/s", "%GEMM",
                                "×torch", "×floor", "peak", "MB"]  # fmt: skip
    assert lines[7].split()[:5] == ["forward", "64", "16", "no", "naive"]
    assert all(row.min_s == min(row.times) for row in fwd)
    assert any(line.split()[:2] == ["context", "decode"] for line in lines)
    assert any(line.startswith("decode step ≈ ") for line in lines)
    path = tmp_path / "b.json"
    r.write_json(str(path))
    data = json.loads(path.read_text())
    assert data["config"]["sizes"] == [64, 96] and len(data["rows"]) == 32 and data["blas_line"].startswith("BLAS")
    assert data["cpu"]["model"] == r.cpu.model and data["cpu"]["isa"] == r.cpu.isa and data["cpu_line"] == lines[1]
    assert data["timing"] == lines[4] and data["config"]["isolate"] is None
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
    with pytest.raises(OptionError, match="methods: unknown method 'fast'"):
        bench.run_bench(sizes=(32,), d=(8,), heads=1, causal=(False,), repetitions=1, methods=("fast",))


def test_bench_options_are_one_checked_frozen_value():
    o = bench.BenchOptions(sizes=[32, np.int64(48)], d=[8], heads=1, causal=[True], repetitions=1, methods=["tiled"])
    assert o.sizes == (32, 48) and type(o.sizes[1]) is int and o.causal == (True,) and o.methods == ("tiled",)
    assert o.kernel_options() == {"block_q": None, "block_k": None, "num_threads": None}
    assert o.to_json()["sizes"] == [32, 48] and o.to_json()["decode_contexts"] == []
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.heads = 2  # type: ignore[misc]
    assert not hasattr(bench, "check_bench_options")  # an alias of BenchOptions(**fields), removed in 0.2.0
    for bad, message in (
        ({"heads": 0}, "^heads: expected an int >= 1, got 0$"),
        ({"causal": (1,)}, r"^causal: expected a non-empty list of bools, got \(1,\)$"),
        ({"backward": 1}, "^backward: expected one of False, True, got 1$"),
        ({"decode_contexts": (10,), "repetitions": 1}, "^decode_contexts: expected an int >= 11, got 10$"),
        ({"sizes": "64"}, "^sizes: expected a non-empty list of ints >= 1, got '64'$"),
    ):
        with pytest.raises(OptionError, match=message):
            bench.BenchOptions(**bad)
    r = bench.run_bench(o, heads=2)  # keywords beside the value replace its fields
    assert [(row.method, row.heads, row.n) for row in r.rows] == [("tiled", 2, 32), ("tiled", 2, 48)]
    assert r.config["heads"] == 2 and r.config["sizes"] == [32, 48] and r.config["kernel"]
    with pytest.raises(OptionError, match=r"^options: expected a BenchOptions, got dict$"):
        bench.run_bench({"heads": 2})
    with pytest.raises(OptionError, match=r"^contexts: expected an int >= 11, got 10$"):
        bench.decode_scaling((10,))  # too short for the timed steps: named, not an IndexError
    with pytest.raises(OptionError, match=r"^n: expected an int >= 1, got '4096'$"):
        bench.long_context("4096")


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
    # the RSS peak in a fresh process: in a long-lived one (an xdist worker after hundreds of tests) the allocator
    # may hand back pages that are already resident, and the peak need not rise
    code = (
        "import numpy as np; from attnlab import bench; print(bench.peak_rss_growth(lambda: np.ones(2**23).sum())[1])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    if sys.platform.startswith("linux"):
        assert 50 < float(out) < 200, out
    for _ in range(2):  # the second time the freed memory may be reused: tracemalloc still sees it
        _, mb = bench.peak_memory(lambda: np.ones(32 * 2**20 // 8).sum())
        assert 30 < mb < 150


def test_gemm_floor_lives_in_the_benchmark_only():
    """The floor is the benchmark's yardstick: attnlab.bench.gemm_floor; the kernels' old path is gone (0.2.0)."""
    from attnlab.kernels import tiled

    with pytest.raises(AttributeError, match="gemm_floor"):
        tiled.gemm_floor  # noqa: B018 (the attribute access is the test)


def test_gemm_floor_is_the_blocked_products():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 50, 8)) for _ in range(3))
    got = gemm_floor(q, k, v, block_q=16, block_k=16)
    np.testing.assert_allclose(got, (q @ np.swapaxes(k, -1, -2) / np.sqrt(8)) @ v, atol=1e-12)
    got_c = gemm_floor(q, k, v, causal=True, block_q=16, block_k=16)
    assert got_c.shape == (2, 50, 8)  # whole blocks beyond the diagonal skipped, as in the kernel


def test_threads_and_blas_report(kernel_config):
    info = threads.blas_report()
    assert info.library in ("openblas", "mkl", "blis", "flexiblas") and info.line().startswith("BLAS: ")
    assert threads.resolve_threads(None) == threads.available_cores()
    assert threads.run_tasks(lambda x: x * x, range(10), 2) == [x * x for x in range(10)]
    with threads.pinned_blas(1):
        from threadpoolctl import threadpool_info

        # NumPy's BLAS, the one the kernels call (a BLAS loaded after the first pin, e.g. SciPy's through torch or
        # transformers, is not in threads.py's cached controller)
        numpy_blas = [i for i in threadpool_info() if i["user_api"] == "blas" and "numpy" in i["filepath"]]
        assert numpy_blas and all(i["num_threads"] == 1 for i in numpy_blas)
    # without threadpoolctl: one thread, BLAS untouched, and the report says why it knows nothing
    kernel_config(use_threadpoolctl=False)
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
    assert "--repetitions: expected an int >= 1, got 0" in capsys.readouterr().err


def test_cpu_report_names_the_cpu_and_what_each_library_uses():
    cpu = bench.cpu_report()
    assert cpu.model and cpu.model != "unknown CPU"
    if sys.platform.startswith("linux"):
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
        assert cpu.isa == ("AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else cpu.isa)
    assert cpu.numba is None or cpu.numba.endswith(")")
    assert bench._isa({"sse2", "avx", "avx2", "fma"}) == "AVX2"
    assert bench._isa({"sse2", "avx2", "avx512f"}) == "AVX-512"
    assert bench._isa({"+sse4.2"[1:]}) == "SSE4.2"


def test_cpu_report_follows_the_environment():
    """With AVX-512 switched off for NumPy and numba (tests/test_fused.py's run), the report says so."""
    code = "from attnlab.bench import cpu_report; import json; c = cpu_report(); print(json.dumps([c.numpy, c.numba]))"
    env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR", "NUMBA_CPU_NAME": "haswell",
           "NUMBA_CPU_FEATURES": ""}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    numpy_target, numba_target = json.loads(out.stdout)
    assert not numpy_target.startswith("X86_V4")
    assert numba_target == "haswell (AVX2)"
    line = bench.CpuInfo("Some CPU", "AVX2", "baseline(X86_V2)", "haswell (AVX2)", (("NUMBA_CPU_NAME", "haswell"),))
    assert line.line() == (
        "CPU: Some CPU, AVX2; NumPy float32 exp2: baseline(X86_V2); numba: haswell (AVX2); env: NUMBA_CPU_NAME=haswell"
    )


def test_isolate_alternates_fresh_processes_and_reports_medians(monkeypatch):
    """The schedule, without processes: P rounds, each method once per round, the first method rotating; the median
    of the processes' medians, the ratios from those medians, the fastest call of any process as min."""
    calls = []
    fake = {"tiled": [[0.30, 0.10], [0.20, 0.20], [0.90, 0.50]], "floor": [[0.10, 0.10], [0.30, 0.10], [0.20, 0.20]]}

    def run_isolated(spec):
        calls.append((spec["method"], spec["n"], spec["seed"], spec["repetitions"]))
        i = sum(1 for c in calls if c[:2] == (spec["method"], spec["n"])) - 1
        return {"times": fake[spec["method"]][i], "peak_mb": 1.5}

    monkeypatch.setattr(bench, "_run_isolated", run_isolated)
    r = bench.run_bench(sizes=(32,), d=(8,), heads=1, causal=(True,), repetitions=2,
                        methods=("tiled", "floor", "naive"), naive_max_gb=1e-9, isolate=3)  # fmt: skip
    assert [c[0] for c in calls] == ["tiled", "floor", "floor", "tiled", "tiled", "floor"]
    assert {c[2:] for c in calls} == {(0, 2)}  # same inputs (seed) for every method, `repetitions` calls each
    tiled, floor, naive = r.rows
    assert tiled.times == (0.2, 0.2, 0.7) and tiled.median_s == 0.2 and tiled.min_s == 0.1
    assert floor.times == (0.1, 0.2, 0.2) and floor.median_s == 0.2 and floor.vs_floor == 1.0
    assert tiled.vs_floor == 1.0 and tiled.peak_mb == 1.5
    assert naive.median_s is None and "exceed" in naive.note
    assert r.config["isolate"] == 3 and r.timing().startswith("timing: each method in fresh processes, 3 per method")


def test_isolate_runs_each_method_in_its_own_process():
    """For real: one process per method; a torch process is the only one that imports torch."""
    r = bench.run_bench(sizes=(64,), d=(8,), heads=1, causal=(False,), repetitions=2, methods=("tiled", "naive"),
                        isolate=1)  # fmt: skip
    for row in r.rows:
        assert len(row.times) == 1 and row.median_s > 0 and row.min_s <= row.median_s and row.peak_mb is not None
    spec = {"seed": 0, "batch": 1, "heads": 1, "n": 16, "d": 8, "causal": True, "backward": False,
            "kw": {"block_q": None, "block_k": None, "num_threads": None}, "repetitions": 1}  # fmt: skip
    code = (
        "import sys, json; from attnlab.bench import _isolated_child; "
        f"_isolated_child({json.dumps(json.dumps({**spec, 'method': 'tiled'}))}); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[-1] == "False" and len(json.loads(out[-2])["times"]) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--json", "/nonexistent/x.json"], "--json: the folder '/nonexistent' does not exist"),
        (["--plot", "/nonexistent/x.png"], "--plot: the folder '/nonexistent' does not exist"),
        (["--json", "."], "--json: '.' is a directory; expected a file path"),
        (["--decode", "-5"], "--decode: each context must be >= 11 tokens (the timed steps need them), got -5"),
        (["--decode", "64", "12", "-r", "12"], "--decode: each context must be >= 14 tokens"),
        (["--sizes", "0"], "--sizes: expected an int >= 1, got 0"),
        (["--d", "64", "-1"], "--d: expected an int >= 1, got -1"),
        (["--heads", "0"], "--heads: expected an int >= 1, got 0"),
        (["--batch", "0"], "--batch: expected an int >= 1, got 0"),
        (["-r", "-2"], "--repetitions: expected an int >= 1, got -2"),
        (["--block-q", "0"], "--block-q: expected an int >= 1, got 0"),
        (["--block-k", "-1"], "--block-k: expected an int >= 1, got -1"),
        (["--threads", "0"], "--threads: expected an int >= 1, got 0"),
        (["--naive-max-gb", "-1"], "--naive-max-gb: expected a number >= 0.0, got -1.0"),
        (["--naive-max-gb", "nan"], "--naive-max-gb: expected a number >= 0.0, got nan"),
        (["--long", "0"], "--long: expected an int >= 1, got 0"),
        (["--isolate", "0"], "--isolate: expected an int >= 1, got 0"),
    ],
)
def test_every_option_is_checked_before_any_work(monkeypatch, capsys, argv, message):
    """One line on stderr, exit status 2, and nothing measured first."""

    def no_work(*args, **kwargs):
        raise AssertionError("run_bench was called")

    monkeypatch.setattr(bench, "run_bench", no_work)
    monkeypatch.setattr(bench, "gemm_rate", no_work)
    t = time.perf_counter()
    assert main(["bench", *argv]) == 2
    assert time.perf_counter() - t < 5
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnlab bench: error: " + message), lines


def test_unwritable_output_is_refused_before_the_run(monkeypatch, capsys, tmp_path):
    if os.geteuid() == 0:  # root writes anywhere: make the folder a file instead
        target = tmp_path / "file"
        target.write_text("")
        path, message = str(target / "x.json"), "does not exist"
    else:  # pragma: no cover - the CI runs as root
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        path, message = str(ro / "x.json"), "is not writable"
    monkeypatch.setattr(bench, "run_bench", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("ran")))
    assert main(["bench", "--json", path]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("methods", ["naive", "tiled"])
def test_a_size_beyond_the_machine_is_a_memory_limit_error_before_any_work(capsys, methods):
    """``--sizes 100000000`` once allocated q first and died in NumPy with a traceback."""
    assert main(["bench", "--sizes", "100000000", "--methods", methods, "--no-progress"]) == 1
    out = capsys.readouterr()
    assert out.err.startswith("attnlab bench: error: --sizes: n=100000000 needs 763 GiB for its float32 arrays")
    assert "more than this machine's" in out.err and "Traceback" not in out.err and out.out == ""
    from attnlab.errors import MemoryLimitError

    with pytest.raises(MemoryLimitError, match="pass smaller --sizes"):
        bench.run_bench(sizes=(100_000_000,), methods=("naive",))
