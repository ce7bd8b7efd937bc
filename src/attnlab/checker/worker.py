"""The checker's worker process: imports the user's function and calls it on the cases the parent sends.

Started by :class:`attnlab.checker.isolation.WorkerBackend`, forked (:func:`forked`) or as a new interpreter
(``python -c BOOT FD PARENT_PID SRC``, :func:`main`), in its own session (so its children can be killed with
it), with fd 0 on ``/dev/null`` and fds 1 and 2 on pipes the parent drains into the report's evidence. It first
asks Linux to kill it when the parent dies (``PR_SET_PDEATHSIG``), then talks to the parent over the socket FD
with :mod:`multiprocessing.connection` messages:

* parent -> worker: ``{"target", "spec", "sys_path"}``, then one :class:`~attnlab.checker.runner.CallRequest` per
  call, then ``None`` (or nothing: the parent kills the worker's process group when the check is done); between
  calls, ``("adapter", {"target", "spec"})`` makes the worker serve another target or strategy (the gradient
  session after the output session) with what it has imported (torch or JAX imported once per check);
* worker -> parent: ``("ready", info)``, ``("usage", message)`` (a bad target or option) or
  ``("import-error", CallError)`` (after the first message and after each ``"adapter"``); then one
  :class:`~attnlab.checker.runner.CallResult` per call.

Nothing here is imported by ``attnlab`` itself; it runs only in the worker.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

__all__ = ["BOOT", "forked", "main", "serve"]

#: Started with ``python -c BOOT FD PARENT_PID SRC``: SRC is the folder holding the ``attnlab`` package.
BOOT = "import sys; sys.path.insert(0, sys.argv[3]); from attnlab.checker.worker import main; main()"

_PR_SET_PDEATHSIG = 1
#: The modules this worker imported, by file or module name (each user file runs once per worker).
_MODULES: dict[str, Any] = {}


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this process when the parent exits; exit at once if it already has."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except Exception:  # no libc symbol: the parent's kill at the end still applies
            pass
    if os.getppid() != parent:
        os._exit(0)


def main() -> None:
    """Entry point of a worker started as a new interpreter (``python -c BOOT FD PARENT_PID SRC``)."""
    fd, parent = int(sys.argv[1]), int(sys.argv[2])
    _die_with_parent(parent)
    serve(fd)


def forked(fd: int, parent: int, out_fd: int, err_fd: int) -> None:
    """Entry point of a worker forked from the checker (never returns: the process ends with ``os._exit``).

    The fork shares the parent's already-imported NumPy and attnlab; stdin, stdout and stderr are re-pointed at
    ``/dev/null`` and the capture pipes, and the Python streams rebuilt on them.
    """
    status = 0
    try:
        os.setsid()
        _die_with_parent(parent)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        for x in (null, out_fd, err_fd):
            if x > 2:
                os.close(x)
        sys.stdin = open(0, encoding="utf-8", closefd=False)
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr  # type: ignore[misc]  # Final in typeshed
        serve(fd)
    except BaseException:  # never unwind into the parent's code
        status = 70
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # closed by the user
                pass
        os._exit(status)


def serve(fd: int) -> None:
    """Talk to the parent over the socket ``fd`` (see the module doc) until it is done."""
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    init: dict[str, Any] = conn.recv()
    if init.get("sys_path") is not None:
        sys.path[:] = list(init["sys_path"])
    sys.argv = [init["target"]]

    adapter = _adapter(conn, init)
    while adapter is not None:
        try:
            req = conn.recv()
        except (EOFError, OSError):
            return
        if req is None:
            return
        if isinstance(req, tuple) and req[0] == "adapter":  # serve another target or strategy
            adapter = _adapter(conn, req[1]) or adapter
            continue
        conn.send(_call(adapter, req))


def _adapter(conn: Any, init: dict[str, Any]) -> Any:
    """Import ``init["target"]`` and build the adapter for ``init["spec"]``; tell the parent how it went (None when
    it did not: the parent was told why)."""
    from .adapters import Adapter, UsageError
    from .runner import CallError, loaded_frameworks
    from .target import TargetError, load_target

    def load(target: str) -> Any:
        return load_target(target, _MODULES)

    try:
        fn = load(init["target"])
    except TargetError as err:
        conn.send(("usage", str(err)))
        return None
    except BaseException as err:  # the user's module failed at import, SystemExit and KeyboardInterrupt included
        import traceback

        conn.send(("import-error", CallError.from_exception(err, tb=traceback.format_exc(limit=-5))))
        return None
    try:
        make = getattr(init["spec"], "make_adapter", None)  # the gradient session's (gradient_oracle.GradTarget)
        adapter = make(fn, load) if make is not None else Adapter(fn, init["spec"])
    except UsageError as err:
        conn.send(("usage", str(err)))
        return None
    info = {
        "framework": adapter.framework,
        "resolved": adapter.resolved,
        "structural": adapter.structural_unsupported(),
        "loaded": loaded_frameworks(),
    }
    conn.send(("ready", info))
    return adapter


def _call(adapter: Any, req: Any) -> Any:
    """One call, the user's prints flushed to the parent's pipes after it."""
    from .runner import execute_call

    result = execute_call(adapter, req)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # closed by the user
            pass
    return result


if __name__ == "__main__":  # pragma: no cover - started through BOOT
    main()
