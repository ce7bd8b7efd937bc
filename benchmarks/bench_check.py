"""How long the whole checker battery takes on a NumPy implementation (target: under 10 s on 2 cores).

Run: ``python benchmarks/bench_check.py`` (prints one line per implementation, then per-probe times).
"""

from __future__ import annotations

import math
import statistics
import sys
import time

import numpy as np

from attnlab.check import check


def numpy_attention(q, k, v, mask=None):
    """A correct NumPy implementation: stable softmax, mask before softmax, fully masked rows give 0."""
    s = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(1 / math.sqrt(q.shape[-1]))
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    d = e.sum(axis=-1, keepdims=True)
    return np.divide(e, d, out=np.zeros_like(e), where=d > 0) @ v


def _time(fn, repeats: int, **options) -> tuple[float, object]:
    times, report = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        report = check(fn, **options)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), report


def main() -> int:
    median, report = _time(numpy_attention, 5)
    print(
        f"full battery, NumPy implementation: {median:.3f} s median of 5 ({report.calls} calls, "
        f"ok={report.ok}); target < 10 s"
    )
    for p in report.probes:
        print(f"  {p.name:<14} {p.calls:3d} calls  {p.seconds * 1000:8.1f} ms")
    import attnlab

    median, report = _time(attnlab.scaled_dot_product_attention, 3)
    print(f"full battery, attnlab.scaled_dot_product_attention: {median:.3f} s ({report.calls} calls)")
    try:
        import torch.nn.functional as F
    except ImportError:
        return 0 if median < 10 else 1
    median, report = _time(F.scaled_dot_product_attention, 3, gqa=True)
    print(f"full battery, torch scaled_dot_product_attention (4 dtypes, GQA): {median:.3f} s ({report.calls} calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
