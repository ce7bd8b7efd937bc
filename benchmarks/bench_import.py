"""How long ``import attnlab`` takes, against ``import numpy`` (attnlab's only required dependency).

Each measurement is a fresh interpreter: ``python -X importtime -c "import attnlab"``; the number is the cumulative
time of the top-level ``attnlab`` entry (NumPy's import included), the median of ``--runs`` runs, and likewise for
``numpy``. Targets (issue 21): at most 0.3 s on a quiet machine, and at most 2× ``import numpy``. It prints the
numbers, the CPU, the load and the command; it asserts nothing (speed is not a unit test).

    python benchmarks/bench_import.py            # 15 runs of each
    python benchmarks/bench_import.py --runs 31
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys

TARGET_S = 0.3
TARGET_RATIO = 2.0


def cumulative_s(module: str) -> float:
    """Cumulative import time of ``module`` in a fresh interpreter (``-X importtime``), in seconds."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True, text=True, check=True
    )
    for line in reversed(proc.stderr.splitlines()):
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|\s?(\S+)$", line)  # the top level has no indent
        if m and m.group(2) == module:
            return int(m.group(1)) / 1e6
    raise RuntimeError(f"no -X importtime line for {module!r} in:\n{proc.stderr[-2000:]}")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="fresh interpreters per module (default 15)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs: expected an int >= 1, got {args.runs}")
    where = subprocess.run(
        [sys.executable, "-c", "import attnlab; print(attnlab.__file__)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {"numpy": [], "attnlab": []}
    for _ in range(args.runs):  # interleaved, so that a change of load touches both alike
        for module in times:
            times[module].append(cumulative_s(module))
    load_after = os.getloadavg()
    med = {m: statistics.median(t) for m, t in times.items()}
    ratio = med["attnlab"] / med["numpy"]
    print(f'command: {sys.executable} -X importtime -c "import MODULE"  (median of {args.runs} fresh runs each)')
    print(f"attnlab: {where}")
    print(f"python {platform.python_version()}, CPU: {cpu_name()} ({os.cpu_count()} logical cores)")
    print(f"load average (1, 5, 15 min): before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")  # fmt: skip
    for module, t in times.items():
        print(f"import {module:8s} median {med[module]:.3f} s  (min {min(t):.3f}, max {max(t):.3f})")
    print(f"ratio attnlab / numpy: {ratio:.2f}x")
    ok_s, ok_ratio = med["attnlab"] <= TARGET_S, ratio <= TARGET_RATIO
    print(f"targets: <= {TARGET_S} s on a quiet machine: {'met' if ok_s else 'not met'} ({med['attnlab']:.3f} s); "
          f"<= {TARGET_RATIO:g}x numpy: {'met' if ok_ratio else 'not met'} ({ratio:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
