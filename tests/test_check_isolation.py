"""The checker survives the code it checks: one hostile or careless function per case.

Each case runs ``attnlab check`` as a real command (its own process, as a user runs it) and asserts the finding
code, the exit status, that ``--json`` is one valid JSON document, that nothing the function started is left
running, and the time bound. A few run through the Python API, whose worker is a new interpreter when torch is
loaded (as here) and a fork otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import attnlab
from attnlab.checker import ExitStatus, check
from attnlab.checker.adapters import Spec
from attnlab.checker.isolation import WorkerBackend, fork_is_safe

pytestmark = pytest.mark.skipif(os.name != "posix", reason="worker isolation is POSIX-only")

SRC = str(Path(attnlab.__file__).resolve().parents[1])

CORRECT = """
import math
import numpy as np


def _attention(q, k, v, mask=None):
    s = q @ np.swapaxes(k, -1, -2) / q.dtype.type(math.sqrt(q.shape[-1]))
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    d = e.sum(axis=-1, keepdims=True)
    return np.divide(e, d, out=np.zeros_like(e), where=d > 0) @ v
"""


def _module(tmp_path: Path, body: str, name: str = "hostile") -> str:
    (tmp_path / f"{name}.py").write_text(CORRECT + textwrap.dedent(body))
    return f"{name}.py"


def _cli(tmp_path: Path, target: str, *args: str, limit: float = 30.0) -> tuple[int, str, str, float]:
    env = dict(os.environ, PYTHONPATH=SRC, PYTHONDONTWRITEBYTECODE="1")
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "attnlab", "check", target, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=limit,
    )
    return (
        p.returncode,
        p.stdout.decode("utf-8", "replace"),
        p.stderr.decode("utf-8", "replace"),
        (time.perf_counter() - t0),
    )


def _json(tmp_path: Path, target: str, *args: str, limit: float = 30.0) -> tuple[int, dict, float]:
    code, out, err, seconds = _cli(tmp_path, target, "--json", *args, limit=limit)
    data = json.loads(out)  # the whole of stdout is one JSON document
    assert data["exit_status"] == code, err
    return code, data, seconds


def _gone(pid: int) -> bool:
    """The process does not exist (or is a zombie waiting for init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    return state in ("Z", "X")


def _wait_gone(pid: int, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.02)
    return _gone(pid)


def _codes(data: dict) -> list[str]:
    return [f["code"] for f in data["findings"]]


def test_a_printing_function_keeps_json_valid_and_its_output_becomes_evidence(tmp_path):
    target = _module(
        tmp_path,
        """
        import os, sys

        def attention(q, k, v, mask=None):
            print("debug:", q.shape, "x" * 200_000)  # a leftover print, 200 kB a call
            os.write(1, b"from C-level write\\n")
            sys.stderr.write("warning from the function\\n")
            return _attention(q, k, v, mask)
        """,
    )
    code, data, seconds = _json(tmp_path, f"{target}:attention")
    assert code == ExitStatus.CLEAN and data["verdict"] == "clean" and data["findings"] == []
    printed = {n["message"].split(" to ")[-1].split(" ")[0]: n for n in data["notes"] if n["code"] == "printed"}
    assert set(printed) == {"stdout", "stderr"}
    assert "debug: (2, 2, 5, 8)" in printed["stdout"]["evidence"] and "bytes left out" in printed["stdout"]["evidence"]
    assert "warning from the function" in printed["stderr"]["evidence"]
    assert int(printed["stdout"]["message"].split()[3]) > 200_000 * data["calls"]  # counted, not kept
    assert len(json.dumps(data)) < 100_000
    assert seconds < 15


def test_os_exit_in_a_call_is_a_crash_naming_the_exit_status(tmp_path):
    target = _module(
        tmp_path,
        """
        import os

        def attention(q, k, v, mask=None):
            if mask is not None:
                os._exit(1)
            return _attention(q, k, v, mask)
        """,
    )
    code, data, seconds = _json(tmp_path, f"{target}:attention")
    assert code == ExitStatus.BUG and _codes(data) == ["crash"]
    f = data["findings"][0]
    assert "exited with status 1" in f["message"] and "mask=" in f["evidence"]
    probes = {p["name"]: p["status"] for p in data["probes"]}
    assert probes["reference"] in ("passed", "failed")  # the worker was restarted for the next cases
    assert seconds < 20


def test_a_closed_stdout_still_gives_a_report(tmp_path):
    target = _module(
        tmp_path,
        """
        import os, sys

        def attention(q, k, v, mask=None):
            sys.stdout.close()
            os.close(1)
            print("after closing")  # ValueError: I/O operation on closed file
            return _attention(q, k, v, mask)
        """,
    )
    code, data, seconds = _json(tmp_path, f"{target}:attention")
    assert code == ExitStatus.BUG and _codes(data) == ["crash"]
    assert "ValueError" in data["findings"][0]["message"]
    assert seconds < 15


def test_a_module_that_loops_at_import_times_out(tmp_path):
    target = _module(
        tmp_path,
        """
        import os
        open("worker.pid", "w").write(str(os.getpid()))
        while True:
            pass

        def attention(q, k, v, mask=None):
            return _attention(q, k, v, mask)
        """,
    )
    code, data, seconds = _json(tmp_path, f"{target}:attention", "--import-timeout", "1")
    assert code == ExitStatus.BUG and _codes(data) == ["timeout"]
    assert data["findings"][0]["probe"] == "import" and "within 1 s" in data["findings"][0]["message"]
    assert all(p["status"] == "not run" for p in data["probes"][1:])
    assert _wait_gone(int((tmp_path / "worker.pid").read_text()))
    assert seconds < 10


def test_sys_exit_at_import_is_a_crash_naming_the_code(tmp_path):
    target = _module(tmp_path, "import sys\nsys.exit(7)\n")
    code, data, _ = _json(tmp_path, f"{target}:attention")
    assert code == ExitStatus.BUG and _codes(data) == ["crash"]
    assert data["findings"][0]["message"] == "the module called sys.exit(7) while it was imported"
    code, out, _, _ = _cli(tmp_path, f"{target}:attention", "--no-color")
    assert code == ExitStatus.BUG and "BUG crash: the module called sys.exit(7)" in out


def test_a_non_daemon_thread_and_a_child_process_do_not_outlive_the_check(tmp_path):
    target = _module(
        tmp_path,
        """
        import os, subprocess, threading, time

        _started = []

        def attention(q, k, v, mask=None):
            if not _started:
                threading.Thread(target=time.sleep, args=(1000,)).start()  # non-daemon
                child = subprocess.Popen(["sleep", "1000"])
                open("pids", "w").write(f"{os.getpid()} {child.pid}")
                _started.append(child)
            return _attention(q, k, v, mask)
        """,
    )
    code, data, seconds = _json(tmp_path, f"{target}:attention")
    assert code == ExitStatus.CLEAN and data["verdict"] == "clean"
    worker, child = (int(x) for x in (tmp_path / "pids").read_text().split())
    assert _wait_gone(worker) and _wait_gone(child)
    assert seconds < 15


def test_a_hung_call_is_a_timeout_and_the_worker_is_killed(tmp_path):
    target = _module(
        tmp_path,
        """
        import os, time

        def attention(q, k, v, mask=None):
            if q.shape[-2] != k.shape[-2]:
                open("worker.pid", "w").write(str(os.getpid()))
                time.sleep(1000)
            return _attention(q, k, v, mask)
        """,
    )
    code, data, seconds = _json(tmp_path, f"{target}:attention", "--timeout", "0.5")
    assert code == ExitStatus.BUG and _codes(data) == ["timeout"]
    assert "the worker process was killed" in data["findings"][0]["evidence"]
    assert _wait_gone(int((tmp_path / "worker.pid").read_text()))
    assert seconds < 10


def test_a_native_crash_is_a_crash_naming_the_signal(tmp_path):
    target = _module(
        tmp_path,
        """
        import os, signal

        def attention(q, k, v, mask=None):
            if q.dtype.name == "float16":
                os.kill(os.getpid(), signal.SIGSEGV)
            return _attention(q, k, v, mask)
        """,
    )
    code, data, seconds = _json(tmp_path, f"{target}:attention")
    assert code == ExitStatus.BUG and _codes(data) == ["crash"]
    assert "killed by SIGSEGV" in data["findings"][0]["message"]
    assert "float16" in data["findings"][0]["evidence"]
    assert seconds < 20


def test_a_torch_function_returning_numpy_is_output_type(tmp_path):
    target = _module(
        tmp_path,
        """
        import torch

        def attention(q, k, v, mask=None):
            s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            w = torch.nan_to_num(torch.softmax(s, dim=-1))
            return (w @ v).numpy()
        """,
    )
    code, data, seconds = _json(tmp_path, f"{target}:attention", "--dtypes", "float64,float32")
    assert code == ExitStatus.BUG and _codes(data) == ["output-type"]
    assert "numpy.ndarray; a torch function must return a torch.Tensor" in data["findings"][0]["message"]
    assert seconds < 30


def test_every_dtype_declared_unsupported_is_a_usage_error(tmp_path):
    target = _module(tmp_path, "attention = _attention\n")
    code, out, err, _ = _cli(tmp_path, f"{target}:attention", "--unsupported", "float64,float32,float16,bfloat16")
    assert code == ExitStatus.USAGE and out == ""
    assert err.startswith("attnlab check: error: dtypes: no dtype left to try (float64: declared unsupported;")


def test_a_reduced_battery_is_incomplete_with_its_own_status(tmp_path):
    target = _module(tmp_path, "attention = _attention\n")
    code, data, _ = _json(tmp_path, f"{target}:attention", "--probes", "reference")
    assert code == ExitStatus.INCOMPLETE and data["verdict"] == "incomplete" and not data["ok"]
    assert [u["capability"] for u in data["incomplete"]] == ["causal", "padding", "masked-rows"]


def test_the_worker_dies_with_the_checker(tmp_path):
    target = _module(
        tmp_path,
        """
        import os, time

        def attention(q, k, v, mask=None):
            open("worker.pid", "w").write(str(os.getpid()))
            time.sleep(1000)
        """,
    )
    env = dict(os.environ, PYTHONPATH=SRC)
    p = subprocess.Popen(
        [sys.executable, "-m", "attnlab", "check", f"{target}:attention", "--timeout", "100", "--json"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pid_file = tmp_path / "worker.pid"
    deadline = time.monotonic() + 20
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.05)
    p.kill()  # SIGKILL: the checker gets no chance to clean up
    p.wait()
    assert _wait_gone(int(pid_file.read_text()))


def test_a_checker_failure_has_its_own_status_and_valid_json(tmp_path, monkeypatch, capsys):
    import attnlab.checker as check_module
    from attnlab.cli import main

    def broken(*args, **kwargs):
        raise KeyError("internal")

    monkeypatch.setattr(check_module, "check", broken)
    assert main(["check", "anything.py:f", "--json"]) == ExitStatus.CHECKER_FAILURE
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["verdict"] == "checker-failure" and data["exit_status"] == 4
    assert "checker failure (a bug in attnlab): KeyError" in captured.err


# -- the Python API ------------------------------------------------------------------------------------------------


def test_api_target_string_runs_isolated_and_leaves_nothing_behind(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    target = _module(
        tmp_path,
        """
        import os, threading, time

        def attention(q, k, v, mask=None):
            print("hello from the worker")
            threading.Thread(target=time.sleep, args=(1000,)).start()
            return _attention(q, k, v, mask)
        """,
    )
    threads = threading.active_count()
    t0 = time.perf_counter()
    r = check(f"{target}:attention")
    assert time.perf_counter() - t0 < 20
    assert r.verdict == "clean" and r.isolation == "worker process"
    assert any(n.code == "printed" and "hello from the worker" in n.evidence for n in r.notes)
    out, err = capfd.readouterr()
    assert "hello" not in out and "hello" not in err
    assert threading.active_count() == threads


def test_api_in_process_captures_prints_at_the_fd_level(capfd):
    def noisy(q, k, v, mask=None):
        print("python print")
        os.write(1, b"fd-level write\n")
        os.write(2, b"fd-level stderr\n")
        import numpy as np

        s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]).astype(q.dtype)
        if mask is not None:
            s = np.where(mask, s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isfinite(m), m, 0))
        d = e.sum(axis=-1, keepdims=True)
        return np.divide(e, d, out=np.zeros_like(e), where=d > 0) @ v

    r = check(noisy, probes=("reference",))
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    notes = {n.message.split(" to ")[-1].split(" ")[0]: n.evidence for n in r.notes if n.code == "printed"}
    assert "python print" in notes["stdout"] and "fd-level write" in notes["stdout"]
    assert "fd-level stderr" in notes["stderr"]


def test_api_isolate_true_needs_an_importable_function():
    from attnlab.checker import UsageError

    with pytest.raises(UsageError, match="isolate=True: a worker process imports the function by name"):
        check(lambda q, k, v: q, isolate=True)


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_both_ways_of_starting_the_worker_call_the_function(tmp_path, start):
    if start == "fork" and not fork_is_safe():
        # torch is loaded in this test process: forking is refused by "auto"; forced here on a NumPy-only target,
        # in a fresh interpreter so that the fork is the one attnlab check makes
        code = (
            "import sys; from attnlab.checker.isolation import WorkerBackend; "
            "from attnlab.checker.adapters import Spec;"
            "from attnlab.checker.runner import CallRequest; import numpy as np;"
            "b = WorkerBackend(sys.argv[1], Spec(), start='fork'); q = np.ones((1, 1, 2, 2));"
            "r = b.call(CallRequest(q, q, q, 'float64', None, False, None, False), 10); b.close();"
            "print(b.start_used, r.error, r.returned.out.shape)"
        )
        target = _module(tmp_path, "attention = _attention\n") + ":attention"
        env = dict(os.environ, PYTHONPATH=SRC)
        out = subprocess.run(
            [sys.executable, "-c", code, target], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert out.stdout.split() == ["fork", "None", "(1,", "1,", "2,", "2)"], out.stderr
        return
    import numpy as np

    from attnlab.checker.runner import CallRequest

    target = str(tmp_path / _module(tmp_path, "attention = _attention\n")) + ":attention"
    b = WorkerBackend(target, Spec(), start=start)
    try:
        q = np.ones((1, 1, 2, 2))
        r = b.call(CallRequest(q, q, q, "float64", None, False, None, False), 30)
        assert b.start_used == start and r.error is None and r.returned.out.shape == (1, 1, 2, 2)
        pid = b.proc.pid
    finally:
        b.close()
    assert _wait_gone(pid)


def test_exit_statuses_are_distinct_and_documented():
    assert [int(s) for s in ExitStatus] == [0, 1, 2, 3, 4]
    doc = (Path(__file__).resolve().parents[1] / "docs" / "checker.md").read_text(encoding="utf-8")
    for s in ExitStatus:
        assert f"| {int(s)} | `{s.name}`" in doc, s
