"""How long the checker's battery takes, in-process and isolated in its worker process (as ``attnlab check`` runs
it), on a NumPy implementation and on PyTorch's SDPA. Targets (issue 13): under 1 s for NumPy and under 5 s for
PyTorch on 2 cores, and the isolation costing at most 0.5 s more.

Run: ``python benchmarks/bench_check.py`` (``--repeats N``, default 3; medians).

* ``in-process``: ``check(fn)`` with the function already imported, called in a thread of this process: the
  first check after the import (first-use costs of NumPy/torch included), as ``attnlab check`` ran before it
  isolated the function.
* ``isolated``: ``check("file.py:attention")`` in a fresh interpreter that has not imported torch (as
  ``attnlab check``): the worker is forked, imports the target (``import`` column, torch's import for PyTorch) and
  answers the battery's calls over a socket. ``battery`` is the total without that import: the cost of the
  battery, isolation included; ``overhead`` is ``battery`` minus in-process.
* ``cli``: the wall time of the whole ``attnlab check file.py:attention --json`` command (interpreter start,
  attnlab's import, the worker, the report).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")

NUMPY = textwrap.dedent(
    """
    import math
    import numpy as np


    def attention(q, k, v, mask=None):
        s = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(1 / math.sqrt(q.shape[-1]))
        if mask is not None:
            s = np.where(mask, s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isfinite(m), m, 0))
        d = e.sum(axis=-1, keepdims=True)
        return np.divide(e, d, out=np.zeros_like(e), where=d > 0) @ v
    """
)
TORCH = "from torch.nn.functional import scaled_dot_product_attention as attention\n"

MEASURE = textwrap.dedent(
    """
    import json, sys, time
    from attnlab.check import check
    options = json.loads(sys.argv[2])
    mode = sys.argv[3]
    if mode == "in-process":
        sys.path.insert(0, ".")
        import importlib
        fn = importlib.import_module(sys.argv[1].split(".py:")[0]).attention
        t0 = time.perf_counter()  # the first check after the import, as attnlab check ran before isolation
        r = check(fn, **options)
    else:
        t0 = time.perf_counter()
        r = check(sys.argv[1], **options)
    print(json.dumps({"seconds": time.perf_counter() - t0, "import": r.import_seconds, "calls": r.calls,
                      "verdict": r.verdict, "isolation": r.isolation}))
    """
)


def _run(folder: str, target: str, options: dict, mode: str) -> dict:
    env = dict(os.environ, PYTHONPATH=SRC)
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, target, json.dumps(options), mode],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cli(folder: str, target: str, args: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=SRC)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "attnlab", "check", target, "--json", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        timeout=300,
    )
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    ns = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; medians of {ns.repeats}")
    print(
        f"{'implementation':<34}{'in-process':>11}{'isolated':>10}{'import':>8}{'battery':>9}{'overhead':>10}{'cli':>7}"
    )
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "np_attention.py").write_text(NUMPY)
        Path(folder, "torch_attention.py").write_text(TORCH)
        cases = [
            ("NumPy (float64/32/16)", "np_attention.py:attention", {}, []),
            ("torch SDPA (4 dtypes, GQA)", "torch_attention.py:attention", {"gqa": True}, ["--gqa"]),
        ]
        for label, target, options, args in cases:
            inproc, iso, imp, cli = [], [], [], []
            for _ in range(ns.repeats):
                a = _run(folder, target, options, "in-process")
                b = _run(folder, target, options, "isolated")
                assert a["verdict"] == b["verdict"] == "clean" and b["isolation"] == "worker process", (a, b)
                inproc.append(a["seconds"])
                iso.append(b["seconds"])
                imp.append(b["import"])
                cli.append(_cli(folder, target, args))
            m = statistics.median
            battery = [i - j for i, j in zip(iso, imp, strict=True)]
            print(
                f"{label:<34}{m(inproc):>10.2f}s{m(iso):>9.2f}s{m(imp):>7.2f}s{m(battery):>8.2f}s"
                f"{m(battery) - m(inproc):>+9.2f}s{m(cli):>6.2f}s  ({a['calls']} calls)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
