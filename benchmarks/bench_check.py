"""How long the checker's battery takes, in-process and isolated in its worker process (as ``attnlab check`` runs
it), on a NumPy implementation and on PyTorch's SDPA. Targets (issue 13): under 1 s for NumPy and under 5 s for
PyTorch on 2 cores, and the isolation costing at most 0.5 s more.

Run: ``python benchmarks/bench_check.py`` (``--repeats N``, default 3; medians).

``--cli`` times whole ``attnlab check`` commands against issue 20's targets (2 cores): a NumPy function <= 1 s, a
torch forward <= 3 s, a torch forward + backward (``--backward``) <= 5 s and a ``jax.jit`` function <= 20 s,
compilation included; each command in a fresh interpreter, as a user runs it.

``--backward`` times the gradient battery instead (issue 14; targets: under 3 s for a NumPy backward, under 10 s
for a PyTorch one on 2 cores): ``check_backward`` on a NumPy analytic backward and on a tiled NumPy
FlashAttention-2 backward, and the gradient battery of PyTorch SDPA through autograd (``check_backward(fn,
kind="autograd")``, which ``check(fn, backward=True)`` runs after the forward battery), each in a fresh
interpreter (first-use costs included).

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
JAX = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp


    @jax.jit
    def attention(q, k, v, mask=None):
        s = q @ jnp.swapaxes(k, -1, -2) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
        if mask is not None:
            s = jnp.where(mask, s, -jnp.inf)
        m = s.max(axis=-1, keepdims=True)
        e = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0))
        d = e.sum(axis=-1, keepdims=True)
        return jnp.where(d > 0, e / jnp.where(d > 0, d, 1), 0) @ v  # a fully masked row gives zeros
    """
)

MEASURE = textwrap.dedent(
    """
    import json, sys, time
    from attnlab.checker import check
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


def _run(folder: str, target: str, options: dict, mode: str, script: str = MEASURE) -> dict:
    env = dict(os.environ, PYTHONPATH=SRC)
    out = subprocess.run(
        [sys.executable, "-c", script, target, json.dumps(options), mode],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cli(folder: str, target: str, args: list[str]) -> tuple[float, str]:
    """The wall time of ``attnlab check TARGET --json ARGS`` and the verdict it printed."""
    env = dict(os.environ, PYTHONPATH=SRC)
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "attnlab", "check", target, "--json", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    seconds = time.perf_counter() - t0
    try:
        verdict = json.loads(out.stdout)["verdict"]
    except (ValueError, KeyError):
        verdict = f"exit {out.returncode}"
    return seconds, verdict


def cli(repeats: int) -> int:
    """Whole ``attnlab check`` commands against issue 20's targets; exit 1 if one misses its target or is not clean."""
    print(f"{os.cpu_count()} CPUs, load average {_loadavg()}; medians of {repeats}")
    print(f"{'attnlab check ...':<52}{'wall':>7}  verdict  target")
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "np_attention.py").write_text(NUMPY)
        Path(folder, "torch_attention.py").write_text(TORCH)
        Path(folder, "jax_attention.py").write_text(JAX)
        cases = [
            ("np_attention.py:attention", [], 1.0),
            ("torch_attention.py:attention", [], 3.0),
            ("torch_attention.py:attention", ["--backward"], 5.0),
            ("jax_attention.py:attention", [], 20.0),
        ]
        worst = 0
        for target, args, limit in cases:
            runs = [_cli(folder, target, args) for _ in range(repeats)]
            sec = statistics.median(r[0] for r in runs)
            verdicts = {r[1] for r in runs}
            verdict = "clean" if verdicts == {"clean"} else ",".join(sorted(verdicts))
            worst |= sec > limit or verdict != "clean"
            print(f"{' '.join([target, *args]):<52}{sec:>6.2f}s  {verdict:<7}  <= {limit:g} s")
    print(f"load average after: {_loadavg()}")
    return int(worst)


def _loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# --- backward (issue 14) -----------------------------------------------------------------------------------------
NUMPY_BWD = textwrap.dedent(
    """
    import math
    import numpy as np


    def _p(q, k, mask):
        s = (q @ np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = np.where(mask, s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isfinite(m), m, 0))
        d = e.sum(axis=-1, keepdims=True)
        return np.divide(e, d, out=np.zeros_like(e), where=d > 0)


    def bwd(q, k, v, d_out, mask=None):
        sc = 1 / math.sqrt(q.shape[-1])
        p = _p(q, k, mask)
        dp = d_out @ np.swapaxes(v, -1, -2)
        ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
        return ((ds @ k) * sc).astype(q.dtype), (np.swapaxes(ds, -1, -2) @ q * sc).astype(q.dtype), (
            np.swapaxes(p, -1, -2) @ d_out).astype(q.dtype)


    def tiled_bwd(q, k, v, out, lse, d_out, mask=None, block=16):
        dtypes = (q.dtype, k.dtype, v.dtype)
        sc = 1 / math.sqrt(q.shape[-1])
        work = np.float64 if q.dtype == np.float64 else np.float32
        q, k, v, out, d_out, lse = (np.asarray(x, work) for x in (q, k, v, out, d_out, lse))
        delta = (d_out * out).sum(axis=-1)
        dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
        full = None if mask is None else np.broadcast_to(mask, (*q.shape[:-1], k.shape[-2]))
        for j in range(0, k.shape[-2], block):
            for i in range(0, q.shape[-2], block):
                s = q[..., i:i + block, :] @ np.swapaxes(k[..., j:j + block, :], -1, -2) * sc
                li = lse[..., i:i + block, None]
                ok = np.isfinite(li) if full is None else full[..., i:i + block, j:j + block] & np.isfinite(li)
                p = np.where(ok, np.exp(s - np.where(np.isfinite(li), li, 0)), 0.0)
                dp = d_out[..., i:i + block, :] @ np.swapaxes(v[..., j:j + block, :], -1, -2)
                ds = p * (dp - delta[..., i:i + block, None])
                dv[..., j:j + block, :] += np.swapaxes(p, -1, -2) @ d_out[..., i:i + block, :]
                dk[..., j:j + block, :] += np.swapaxes(ds, -1, -2) @ q[..., i:i + block, :] * sc
                dq[..., i:i + block, :] += ds @ k[..., j:j + block, :] * sc
        return tuple(x.astype(d) for x, d in zip((dq, dk, dv), dtypes))
    """
)
MEASURE_BWD = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, ".")
    import importlib
    from attnlab.checker import check_backward
    mod, name = sys.argv[1].split(".py:")
    fn = getattr(importlib.import_module(mod), name)
    options = json.loads(sys.argv[2])
    t0 = time.perf_counter()
    r = check_backward(fn, **options)
    print(json.dumps({"seconds": time.perf_counter() - t0, "calls": r.calls, "verdict": r.verdict}))
    """
)


def backward(repeats: int) -> int:
    """The gradient battery's time on a NumPy backward, a tiled NumPy one and PyTorch SDPA through autograd."""
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; medians of {repeats}")
    print(f"{'backward':<44}{'battery':>9}{'calls':>7}  verdict  target")
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "np_backward.py").write_text(NUMPY_BWD)
        Path(folder, "torch_attention.py").write_text(TORCH)
        cases = [
            ("NumPy analytic bwd(q, k, v, d_out)", "np_backward.py:bwd", {}, 3.0),
            ("NumPy tiled FA2 bwd(q, k, v, out, lse, d_out)", "np_backward.py:tiled_bwd", {}, 3.0),
            ("torch SDPA autograd (4 dtypes, GQA)", "torch_attention.py:attention", {"kind": "autograd", "gqa": 1}, 10),
        ]
        worst = 0
        for label, target, options, limit in cases:
            runs = [_run(folder, target, options, "", MEASURE_BWD) for _ in range(repeats)]
            sec = statistics.median(r["seconds"] for r in runs)
            ok = "clean" if all(r["verdict"] == "clean" for r in runs) else runs[0]["verdict"]
            worst |= sec > limit or ok != "clean"
            print(f"{label:<44}{sec:>8.2f}s{runs[0]['calls']:>7}  {ok:<7}  < {limit:g} s")
    return int(worst)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backward", action="store_true", help="time the gradient battery (issue 14)")
    parser.add_argument("--cli", action="store_true", help="time whole attnlab check commands (issue 20)")
    ns = parser.parse_args()
    if ns.backward:
        return backward(ns.repeats)
    if ns.cli:
        return cli(ns.repeats)
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
            inproc, iso, imp, wall = [], [], [], []
            for _ in range(ns.repeats):
                a = _run(folder, target, options, "in-process")
                b = _run(folder, target, options, "isolated")
                assert a["verdict"] == b["verdict"] == "clean" and b["isolation"] == "worker process", (a, b)
                inproc.append(a["seconds"])
                iso.append(b["seconds"])
                imp.append(b["import"])
                wall.append(_cli(folder, target, args)[0])
            m = statistics.median
            battery = [i - j for i, j in zip(iso, imp, strict=True)]
            print(
                f"{label:<34}{m(inproc):>10.2f}s{m(iso):>9.2f}s{m(imp):>7.2f}s{m(battery):>8.2f}s"
                f"{m(battery) - m(inproc):>+9.2f}s{m(wall):>6.2f}s  ({a['calls']} calls)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
