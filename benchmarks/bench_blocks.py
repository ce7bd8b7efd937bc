"""Inside the tiled kernel: per-block step times, the exponential's accuracy, block shapes, the bias path, and the
slowdown of the first call after PyTorch. The numbers behind docs/performance.md that ``attnlab bench`` does not print.

Run: ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_blocks.py`` (every section), or pick
sections with ``--only blocks accuracy shapes bias after-torch``.

* ``blocks``: one 512×512 block, one thread, BLAS pinned to one thread, n = 4096 keys, d = 64 and 128: each step of
  the loop (the two products, the accumulation, the fused pass, NumPy's passes in this process), then the whole
  loop of the fast path with each exponential against the floor's loop, alternating, medians.
* ``accuracy``: the fused exponential and NumPy's float32 ``exp2`` against float64 on 4 million points of
  ``[-126, 128)``, in float32 ulps.
* ``shapes``: ``flash_attention`` and ``gemm_floor`` at several block shapes (n = 4096, d = 64, 8 heads, two
  threads), alternating, medians.
* ``bias``: n = 2048, d = 64, 8 heads, causal, two threads: no bias, ALiBi as a full ``[8, n, n]`` array, ALiBi as
  ``[8, 1, n]``.
* ``after-torch``: n = 8192, d = 128: the GEMM floor as the first call after PyTorch's SDPA (after a 1 s pause), and
  the call after that.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import numpy as np
from threadpoolctl import threadpool_limits

from attnlab.bench import _kernel_line, gemm_floor
from attnlab.kernels import fused, tiled
from attnlab.kernels.threads import blas_report
from attnlab.kernels.tiled.plan import position_mask
from attnlab.masks import MaskSpec

SECTIONS = ("blocks", "accuracy", "shapes", "bias", "after-torch")


def _median_us(fn: Callable[[], object], reset: Callable[[], object] | None = None, repeats: int = 50) -> float:
    times = []
    for _ in range(repeats):
        if reset is not None:
            reset()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def blocks() -> None:
    print("per 512x512 block, one thread (µs, medians of 50):")
    with threadpool_limits(1):
        for d in (64, 128):
            _blocks_at(d)


def _blocks_at(d: int) -> None:
    rng = np.random.default_rng(0)
    b, n = 512, 4096
    jit, one = fused.kernels(), np.float32(1)
    diag = position_mask(MaskSpec(causal=True).sized(b, b).blocked(0, b, 0, b), "<f4")
    ones = np.ones(b, np.float32)
    # as the kernel: a power of two of the scale folded into Q (exact), the rest times log2(e) applied in the pass
    mant, exp = math.frexp(1 / np.sqrt(d))
    q = rng.standard_normal((b, d)).astype(np.float32) * np.float32(2.0 ** (exp - 1))
    a = np.float32(2 * mant / math.log(2))
    K, V = (rng.standard_normal((n, d)).astype(np.float32) for _ in range(2))
    s, pv, acc = np.empty((b, b), np.float32), np.empty((b, d), np.float32), np.zeros((b, d), np.float32)
    lt, l_i = np.empty(b, np.float32), np.zeros(b, np.float32)
    bias_view = rng.standard_normal((2 * b, 2 * b)).astype(np.float32)[:b, b:]  # a strided [b, b] block
    bias_buf = np.empty((b, b), np.float32)

    def bias_copied() -> None:
        np.copyto(bias_buf, bias_view)
        jit.exp2_rows_bounded(s, a, bias_buf, one, None, lt)

    def bias_numpy() -> None:
        s.__iadd__(bias_view * one)
        jit.exp2_rows_bounded(s, a, None, one, None, lt)

    def qk() -> None:
        np.matmul(q, K[:b].T, out=s)

    steps = {
        "S = Q_i K_j^T": (qk, None),
        "P V_j": (lambda: np.matmul(s, V[:b], out=pv), qk),
        "acc += P V_j": (lambda: acc.__iadd__(pv), None),
        "fused pass (exp + row sums)": (lambda: jit.exp2_rows_bounded(s, a, None, one, None, lt), qk),
        "fused pass, causal diagonal": (lambda: jit.exp2_rows_bounded(s, a, None, one, diag.bad, lt), qk),
        "np.exp2(S) in place": (lambda: np.exp2(s, out=s), qk),
        "np.exp(S) in place": (lambda: np.exp(s, out=s), qk),
        "P 1 (row sums)": (lambda: np.matmul(s, ones, out=lt), qk),
        "P *= keep (causal diagonal)": (lambda: s.__imul__(diag.keep), qk),
        "bias: copy block + fused pass": (bias_copied, qk),
        "bias: fused pass on a strided view": (lambda: jit.exp2_rows_bounded(s, a, bias_view, one, None, lt), qk),
        "bias: NumPy add + fused pass": (bias_numpy, qk),
    }
    for name, (fn, reset) in steps.items():
        print(f"  d={d:<4} {name:<36} {_median_us(fn, reset):8.1f}")

    def loop(exp: str) -> None:
        """The fast path's loop over the 8 key blocks with the given exponential ("none": the GEMM floor)."""
        for j0 in range(0, n, b):
            np.matmul(q, K[j0 : j0 + b].T, out=s)
            if exp == "fused":
                jit.exp2_rows_bounded(s, a, None, one, None, lt)
            elif exp != "none":
                getattr(np, exp)(s, out=s)
                np.matmul(s, ones, out=lt)
            np.matmul(s, V[j0 : j0 + b], out=pv)
            acc.__iadd__(pv)
            if exp != "none":
                l_i.__iadd__(lt)

    modes = ("none", "fused", "exp2", "exp")
    per_block: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(20):
        for m in modes:
            per_block[m].append(_median_us(lambda m=m: loop(m), repeats=1) / (n // b))
    floor = statistics.median(per_block["none"])
    print(f"  d={d:<4} {'floor loop, per block':<36} {floor:8.1f}")
    for m, label in (("fused", "fused pass"), ("exp2", "np.exp2 + P 1"), ("exp", "np.exp + P 1")):
        t = statistics.median(per_block[m])
        print(f"  d={d:<4} {'loop with ' + label + ', per block':<36} {t:8.1f}   ratio {t / floor:.3f}")


def accuracy() -> None:
    x = np.linspace(-126.0, 127.999, 1 << 22, dtype=np.float32)
    exact = np.exp2(x.astype(np.float64))
    spacing = np.spacing(exact.astype(np.float32)).astype(np.float64)
    s = x.reshape(1, -1).copy()
    fused.exp2_block(s)
    ours = np.abs(s[0] - exact) / spacing
    numpy = np.abs(np.exp2(x).astype(np.float64) - exact) / spacing
    print("exp2 against float64 on 4,194,304 points of [-126, 128) (float32 ulps):")
    print(f"  fused pass      max {ours.max():.3f}  mean {ours.mean():.3f}")
    print(f"  NumPy np.exp2   max {numpy.max():.3f}  mean {numpy.mean():.3f}")


def _alternate(a: Callable[[], object], b: Callable[[], object], repeats: int) -> tuple[float, float]:
    a(), b()
    ta, tb = [], []
    for _ in range(repeats):
        time.sleep(0.05)
        ta.append(_median_us(a, repeats=1))
        time.sleep(0.05)
        tb.append(_median_us(b, repeats=1))
    return statistics.median(ta) / 1e3, statistics.median(tb) / 1e3


def shapes() -> None:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 8, 4096, 64), dtype=np.float32) for _ in range(3))
    print("block shapes, n=4096, d=64, 8 heads, two threads (ms, medians of 5; floor at the same blocks):")
    for causal in (False, True):
        for bq, bk in ((512, 512), (512, 256), (256, 512), (1024, 256), (768, 256), (1024, 512), (384, 384)):
            kw = {"causal": causal, "block_q": bq, "block_k": bk}
            t, f = _alternate(
                lambda kw=kw: tiled.flash_attention(q, k, v, **kw), lambda kw=kw: gemm_floor(q, k, v, **kw), 5
            )
            print(f"  causal={causal!s:<5} {bq:>4}x{bk:<4} tiled {t:7.1f}  floor {f:7.1f}  ratio {t / f:.3f}")


def bias() -> None:
    rng = np.random.default_rng(0)
    n = 2048
    q, k, v = (rng.standard_normal((1, 8, n, 64), dtype=np.float32) for _ in range(3))
    slopes = (2.0 ** -np.arange(1, 9)).astype(np.float32)
    pos = np.arange(n, dtype=np.float32)
    full = slopes[:, None, None] * (pos[None, None, :] - pos[None, :, None])  # [8, n, n]
    keys = slopes[:, None, None] * pos[None, None, :]  # [8, 1, n]: the same softmax under a causal mask
    print("bias, n=2048, d=64, 8 heads, causal, two threads (ms, medians of 7):")
    for name, b in (("none", None), ("ALiBi [8, n, n]", full), ("ALiBi [8, 1, n]", keys)):
        fn = lambda b=b: tiled.flash_attention(q, k, v, causal=True, bias=b)  # noqa: E731
        fn()
        ts = []
        for _ in range(7):
            time.sleep(0.05)
            ts.append(_median_us(fn, repeats=1) / 1e3)
        print(f"  {name:<18} {statistics.median(ts):7.1f}")


def after_torch() -> None:
    import torch

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 8, 8192, 128), dtype=np.float32) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    gemm_floor(q, k, v)
    print("GEMM floor, n=8192, d=128 (ms): first call after SDPA (1 s pause), then the next call:")
    for _ in range(4):
        torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)
        time.sleep(1.0)
        first = _median_us(lambda: gemm_floor(q, k, v), repeats=1) / 1e3
        nxt = _median_us(lambda: gemm_floor(q, k, v), repeats=1) / 1e3
        print(f"  after SDPA {first:7.1f}   next {nxt:7.1f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    args = ap.parse_args(argv)
    print(f"{blas_report().line()}; tiled: {_kernel_line({})}")
    for name in args.only:
        print()
        globals()[name.replace("-", "_")]()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
