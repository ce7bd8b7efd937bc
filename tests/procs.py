"""Helpers for tests that start commands as processes: who descends from whom, who is still alive, who serves.

Linux only (they read /proc). A zombie (exited, not yet reaped by whoever inherited it) counts as gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of ``pid``, or None if there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def state(pid: int) -> str | None:
    """The process state letter (R, S, T, Z, ...) or None."""
    st = _stat(pid)
    return st[0] if st else None


def alive(pid: int) -> bool:
    st = state(pid)
    return st is not None and st not in "ZX"


def descendants(pid: int) -> set[int]:
    """Every living process below ``pid`` (children, grandchildren, ...)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None and st[0] not in "ZX":
                parents[int(entry.name)] = st[1]
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier and p not in found}
        found |= frontier
    return found


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    """Wait up to ``timeout`` s for ``pids`` to end; those still alive."""
    deadline = time.monotonic() + timeout
    left = {p for p in pids if alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = {p for p in left if alive(p)}
    return left


def wait_for(predicate, timeout: float, what: str):
    """Poll ``predicate()`` until it returns something truthy (returned) or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def serving(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def kill_all(pids: set[int]) -> None:
    """SIGKILL (after SIGCONT, harmless) every pid still alive: the clean-up of a test that failed half-way."""
    for p in pids:
        if alive(p):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)


def with_default_sigint(cmd: list[str], python: str | None = None) -> list[str]:
    """``cmd`` (``cmd[0]`` an absolute path) run with SIGINT at its default, as from a terminal.

    A process started in the background by a non-interactive shell ignores SIGINT, and so would its children (an
    ignored signal stays ignored through exec); this wrapper undoes that before exec'ing ``cmd``. The wrapper runs in
    ``python`` (default ``cmd[0]``, for a Python command).
    """
    code = "import os,signal,sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
    return [python or cmd[0], "-c", code, *cmd]
