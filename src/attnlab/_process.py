"""Child processes that never outlive the command that started them (the lab's server, the ring's ranks).

Three mechanisms, used together:

* :func:`die_with_parent` (Linux): the kernel sends a signal to this process when its parent dies, even by
  ``SIGKILL`` (``prctl(PR_SET_PDEATHSIG)``). It is called by the child itself, so it is safe with threads in the
  parent (no ``preexec_fn``). :func:`orphan_proof` wraps a command line so that the program it runs does this
  before anything else (a tiny ``python -c`` that calls prctl, then ``exec``s the command: same pid, no extra
  process). The parent of record is the *thread* that started the child: start children from a thread that lives
  as long as they should (the main thread, for a command).
* :func:`stop_group`: a child started with ``start_new_session=True`` leads its own process group; stopping it
  sends ``SIGTERM`` (and ``SIGCONT``, so a stopped process handles it) to the whole group, waits a grace period,
  then sends ``SIGKILL``.
* :func:`signals_raise`: while a command waits on its children, ``SIGTERM`` and ``SIGHUP`` raise
  :class:`Terminated` (a ``KeyboardInterrupt``, like ``SIGINT``), so the command's ``finally`` blocks run and
  stop the children.

On systems without prctl the first mechanism is absent (a ``SIGKILL`` of the parent then orphans the children);
the other two work on every POSIX system.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence

__all__ = ["Terminated", "die_with_parent", "orphan_proof", "signals_raise", "stop_group"]

_PR_SET_PDEATHSIG = 1

# run by the child before the real command: prctl(PR_SET_PDEATHSIG, sig); leave at once if the parent is already
# gone (it may have died before the prctl); then become the command (os.execv keeps the pid and the death signal)
_WRAPPER = (
    "import ctypes,ctypes.util,os,sys\n"
    "p,s=int(sys.argv[1]),int(sys.argv[2])\n"
    "try:\n"
    " ctypes.CDLL(ctypes.util.find_library('c') or None,use_errno=True).prctl(1,s,0,0,0)\n"
    "except (OSError,AttributeError):\n"
    " pass\n"
    "if os.getppid()!=p:\n"
    " os._exit(128+s)\n"
    "os.execv(sys.argv[3],sys.argv[3:])\n"
)


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by :func:`signals_raise` when the process gets ``SIGTERM`` or ``SIGHUP``.

    Attributes:
        signum: the signal's number (``signal.SIGTERM`` ...); a command exits with ``128 + signum``.
    """

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies; True where that is supported (Linux).

    If the parent is no longer ``parent_pid`` (it died before this call) the signal is sent at once.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        supported = libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)
    return supported


def orphan_proof(cmd: Sequence[str], sig: int = signal.SIGKILL) -> list[str]:
    """``cmd`` (``cmd[0]`` an absolute path) wrapped so that it gets ``sig`` when the calling process dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return list(cmd)
    return [sys.executable, "-c", _WRAPPER, str(os.getpid()), str(int(sig)), *cmd]


def stop_group(process: subprocess.Popen, grace: float = 5.0) -> None:
    """Stop ``process`` and its process group: ``SIGTERM`` (+ ``SIGCONT``), ``grace`` seconds, then ``SIGKILL``.

    ``process`` must have been started with ``start_new_session=True`` (it leads its own group). Does nothing to
    a process that has already exited.
    """
    if process.poll() is not None:
        return
    pgid = process.pid
    for sig in (signal.SIGTERM, signal.SIGCONT):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    try:
        process.wait(grace)
        return
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    process.wait()


@contextlib.contextmanager
def signals_raise(signals: Sequence[int] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Within the block, ``signals`` raise :class:`Terminated` in the main thread (a no-op in other threads)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated(signum)

    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
