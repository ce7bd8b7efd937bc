"""Running the user's function in its own worker process, so nothing it does can break the report.

:class:`WorkerBackend` starts one long-lived worker per check (the gradient session reuses the output session's,
:meth:`WorkerBackend.reconfigure`) (``python -c`` running
:mod:`attnlab.checker.worker`), in its own session and process group, with its stdin on ``/dev/null`` and its
stdout and stderr on pipes the parent drains (the first and last :data:`~attnlab.checker.runner.CAPTURE_KEEP`
bytes of each are kept as evidence; the rest is counted). The worker imports the target under
``import_timeout`` and answers one call at a time under ``timeout``. On a timeout, and at the end, the parent
kills the worker's whole process group (SIGKILL), so threads and child processes it left behind end with it;
on Linux the worker is also killed if the parent dies (``PR_SET_PDEATHSIG``). A worker that ends during a call
(``os._exit``, a native crash, a signal) is restarted for the next call, at most ``max_restarts`` times.

The worker is forked from the checker when that is safe (:func:`fork_is_safe`: one thread and no torch or JAX
loaded, as in ``attnlab check``, whose process never imports the user's code), which costs milliseconds; otherwise
it is a new interpreter (``python -c``), which imports NumPy and attnlab again (a few tenths of a second).

POSIX only (Linux, macOS): elsewhere :func:`available` is False and the checker runs the function in-process.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from .adapters import Resolved, Spec, UsageError
from .runner import CallError, CallRequest, CallResult, Captured
from .spec import PARENT_ONLY

__all__ = ["ImportFailure", "WorkerBackend", "available", "fork_is_safe"]

_SRC = str(Path(__file__).resolve().parents[2])


def available() -> bool:
    """Whether worker isolation works here (POSIX: fd passing, sessions, process groups)."""
    return os.name == "posix"


class ImportFailure(Exception):
    """The user's module did not import: it raised, exited, ended the process or did not finish in time."""

    def __init__(self, error: CallError | None, timed_out: bool, seconds: float):
        super().__init__(error.text if error else "timed out")
        self.error = error
        self.timed_out = timed_out
        self.seconds = seconds


def _signal_name(status: int) -> str | None:
    if status >= 0:
        return None
    try:
        return signal.Signals(-status).name
    except ValueError:
        return f"signal {-status}"


class WorkerBackend:
    """The function in a worker process (see the module doc). ``framework``, ``resolved`` and ``structural``
    come from the worker once the target is imported.

    When the module raised, exited or hung while being imported, ``import_failure`` says how (and no call can
    be made); what it printed is in :meth:`output`.

    Raises (from the constructor):
        UsageError: the target does not exist, is not callable, or an option does not fit the function.
    """

    isolated = True
    description = "worker process"

    def __init__(
        self,
        target: str,
        spec: Spec | Any,  # a Spec, or the gradient session's GradTarget (attnlab.checker.gradient_oracle)
        *,
        import_timeout: float = 60.0,
        max_restarts: int = 5,
        sys_path: Any = None,
        start: str = "auto",
    ):
        if start not in ("auto", "fork", "spawn"):
            raise UsageError(f"start: expected one of 'auto', 'fork', 'spawn', got {start!r}")
        self.start = start
        self.start_used = ""
        self.target = target
        self.spec = spec
        self.import_timeout = float(import_timeout)
        self.max_restarts = int(max_restarts)
        self.sys_path = list(sys.path if sys_path is None else sys_path)
        self.streams = {"stdout": Captured("stdout"), "stderr": Captured("stderr")}
        self.deaths = 0
        self.restarts = 0
        self.proc: subprocess.Popen | _Forked | None = None
        self.conn: Connection | None = None
        self._pipes: dict[int, str] = {}
        self._sel: selectors.BaseSelector | None = None
        self.framework = ""
        self.resolved: Resolved | None = None
        self.structural: dict[str, str] = {}
        self.loaded: tuple[str, ...] = ()
        self.import_seconds = 0.0
        self.import_failure: ImportFailure | None = None
        self._start()

    # -- lifecycle ------------------------------------------------------------------------------------------
    def _start(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        method = self.start if self.start != "auto" else ("fork" if fork_is_safe() else "spawn")
        self.start_used = method
        try:
            if method == "fork":
                self.proc = _fork(child_sock.fileno(), out_w, err_w, (parent_sock.fileno(), out_r, err_r))
            else:
                self.proc = subprocess.Popen(
                    [sys.executable, "-c", _boot(), str(child_sock.fileno()), str(os.getpid()), _SRC],
                    stdin=subprocess.DEVNULL,
                    stdout=out_w,
                    stderr=err_w,
                    pass_fds=(child_sock.fileno(),),
                    start_new_session=True,
                    close_fds=True,
                )
        finally:
            child_sock.close()
            os.close(out_w)
            os.close(err_w)
        self.conn = Connection(parent_sock.detach())
        self._pipes = {out_r: "stdout", err_r: "stderr"}
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.conn.fileno(), selectors.EVENT_READ, "conn")
        for fd in self._pipes:
            os.set_blocking(fd, False)
            self._sel.register(fd, selectors.EVENT_READ, "pipe")
        self._ready({"target": self.target, "spec": _for_worker(self.spec), "sys_path": self.sys_path})

    def reconfigure(self, target: str, spec: Any) -> bool:
        """Serve ``target`` under ``spec`` (a :class:`Spec` or a gradient session's ``GradTarget``) from this
        worker, with what it has already imported: one worker for a whole check (the output session, then the
        gradient session). The output captured so far is left behind. False when the worker is gone (start a new
        one); raises :class:`UsageError` as the constructor does."""
        if self.conn is None:
            return False
        self.target, self.spec = target, spec
        self.streams = {"stdout": Captured("stdout"), "stderr": Captured("stderr")}
        self.deaths = self.restarts = 0
        self._ready(("adapter", {"target": target, "spec": _for_worker(spec)}))
        return True

    def _ready(self, message: Any) -> None:
        """Send the worker what to serve and wait (``import_timeout``) until it is ready, or say why not."""
        assert self.conn is not None
        t0 = time.perf_counter()
        self.conn.send(message)
        kind, msg = self._receive(self.import_timeout)
        self.import_seconds = time.perf_counter() - t0
        if kind == "message" and msg[0] == "ready":
            info = msg[1]
            self.framework, self.resolved, self.structural = info["framework"], info["resolved"], info["structural"]
            self.loaded = tuple(info.get("loaded", ()))
            return
        if kind == "message" and msg[0] == "usage":
            self._kill()
            raise UsageError(msg[1])
        if kind == "message":  # ("import-error", CallError)
            self._kill()
            self.import_failure = ImportFailure(msg[1], False, self.import_seconds)
        elif kind == "timeout":
            self._kill()
            self.import_failure = ImportFailure(None, True, self.import_seconds)
        else:
            self.import_failure = ImportFailure(self._death(), False, self.import_seconds)

    def _receive(self, timeout: float) -> tuple[str, Any]:
        """Wait for the worker's next message, draining its stdout/stderr meanwhile.

        Returns ``("message", obj)``, ``("timeout", None)`` or ``("died", None)``.
        """
        assert self._sel is not None and self.conn is not None and self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout", None
            events = self._sel.select(min(left, 0.25))
            got_conn = False
            for key, _ in events:
                if key.data == "pipe":
                    self._drain(key.fd)
                else:
                    got_conn = True
            if got_conn:
                try:
                    return "message", self.conn.recv()
                except (EOFError, OSError):
                    self._wait_exit()
                    return "died", None
                except Exception as err:  # a result that does not unpickle
                    return "message", CallResult(error=CallError.from_exception(err))
            if not events and self.proc.poll() is not None:  # ended, its socket held open by a child
                return "died", None

    def _drain(self, fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.streams[self._pipes[fd]].add(data)
        else:  # the write end is closed (the user closed its stdout): stop watching it
            assert self._sel is not None
            self._sel.unregister(fd)
            os.close(fd)
            del self._pipes[fd]

    def _wait_exit(self) -> None:
        assert self.proc is not None
        try:
            self.proc.wait(2.0)
        except subprocess.TimeoutExpired:  # socket closed but still running: it is ending, or hostile
            self._kill()

    def _death(self) -> CallError:
        """What ended the worker, as an error; the worker's process group is cleaned up."""
        assert self.proc is not None
        self._wait_exit()
        status = self.proc.returncode
        self._kill()
        self.deaths += 1
        sig = _signal_name(status) if status is not None else None
        tail = self.streams["stderr"].last_line()
        if sig is not None:
            message = f"the worker process was killed by {sig}"
        else:
            message = f"the worker process exited with status {status} (os._exit, exit() in a thread, or a crash)"
        if tail:
            message += f"; its last stderr line: {tail}"
        return CallError(
            "WorkerExit", message, exit_status=None if sig else status, signal=sig, died=True, library=False
        )

    def _kill(self) -> None:
        """SIGKILL the worker's process group (its threads and children with it) and reap it."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(5.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL not delivered
                pass
        if self._sel is not None:
            for fd in list(self._pipes):  # what it wrote last
                self._drain_all(fd)
            self._sel.close()
            self._sel = None
        for fd in list(self._pipes):
            os.close(fd)
        self._pipes = {}
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _drain_all(self, fd: int) -> None:
        for _ in range(64):  # at most 4 MiB more; the rest is a child that outlived the kill
            if fd not in self._pipes:
                return
            try:
                data = os.read(fd, 1 << 16)
            except (BlockingIOError, OSError):
                return
            if not data:
                return
            self.streams[self._pipes[fd]].add(data)

    @property
    def can_restart(self) -> bool:
        """Whether another call can run: the worker is alive, or restarts are left."""
        return self.conn is not None or self.restarts < self.max_restarts

    # -- calls ------------------------------------------------------------------------------------------------
    def call(self, req: CallRequest, timeout: float) -> CallResult:
        """Run one call in the worker within ``timeout`` seconds (restarting a worker that died, while restarts
        are left); a hung call kills the worker and ends the calls."""
        if self.conn is None:
            if self.restarts >= self.max_restarts:
                return CallResult(error=CallError("WorkerExit", "the worker process is gone", died=True))
            self.restarts += 1
            try:
                self._start()
            except UsageError as err:
                self.import_failure = ImportFailure(CallError("UsageError", str(err)), False, 0.0)
            if self.import_failure is not None:
                self.restarts = self.max_restarts
                why = self.import_failure
                return CallResult(error=CallError("WorkerExit", f"restarting the worker failed: {why}", died=True))
        t0 = time.perf_counter()
        try:
            assert self.conn is not None
            self.conn.send(req)
        except (OSError, ValueError):
            return CallResult(error=self._death(), seconds=time.perf_counter() - t0)
        kind, msg = self._receive(timeout)
        if kind == "message":
            return msg
        if kind == "timeout":
            self._kill()
            self.restarts = self.max_restarts  # a hung function: no further calls (see Runner)
            return CallResult(timed_out=True, seconds=time.perf_counter() - t0)
        return CallResult(error=self._death(), seconds=time.perf_counter() - t0)

    def output(self) -> dict[str, Captured]:
        """What the worker wrote to stdout and stderr, by stream."""
        return self.streams

    def close(self) -> None:
        """Stop the worker process."""
        self._kill()


def fork_is_safe() -> bool:
    """Whether this process may ``fork()`` the worker: POSIX, one thread, and no torch, JAX or TensorFlow loaded
    (their thread pools do not survive a fork). Otherwise a new interpreter is started (slower: it imports NumPy
    and attnlab again)."""
    import threading

    if not hasattr(os, "fork") or threading.active_count() != 1:
        return False
    return not any(m in sys.modules for m in ("torch", "jax", "jaxlib", "tensorflow"))


class _Forked:
    """The bits of :class:`subprocess.Popen` the backend uses, for a forked worker."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -9
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("worker", timeout or 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        assert self.returncode is not None
        return self.returncode


def _fork(fd: int, out_w: int, err_w: int, close: tuple[int, ...]) -> _Forked:
    for stream in (sys.stdout, sys.stderr):  # nothing buffered is written twice
        try:
            stream.flush()
        except Exception:  # a closed stream
            pass
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the worker: never returns
        for x in close:
            os.close(x)
        from .worker import forked

        forked(fd, parent, out_w, err_w)
    return _Forked(pid)


def _boot() -> str:
    from .worker import BOOT

    return BOOT


def _for_worker(spec: Any) -> Any:
    """``spec`` (a :class:`Spec` or a ``GradTarget`` holding one) without what only the parent reads: the declared
    ``mask_mod`` / ``score_mod`` and their ``claims`` (the ``mods`` probe evaluates them there; a lambda does not
    pickle)."""
    inner = getattr(spec, "spec", None)
    if isinstance(inner, Spec):
        return replace(spec, spec=_for_worker(inner))
    if isinstance(spec, Spec):
        none: dict[str, Any] = dict.fromkeys(PARENT_ONLY)
        return replace(spec, **none)
    return spec
