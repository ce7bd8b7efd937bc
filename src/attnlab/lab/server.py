"""Start the lab: marimo serving the packaged notebook on 127.0.0.1, on a free port, offline.

marimo serves its front-end from the files installed with it (no CDN); update checks are switched off
(``MARIMO_SKIP_UPDATE_CHECK=1``), and the server binds to the loopback interface only.

In edit mode (a teacher's copy, where the page can run any Python code) marimo asks for an access token: the lab
generates one (``secrets.token_urlsafe``), hands it to marimo on its standard input (never on the command line,
where other users could read it), and :attr:`LabServer.url` carries it (``?access_token=...``), so the printed URL
opens the editor directly. The app mode (``marimo run``, code hidden) needs no token.

The server never outlives the process that started it: it leads its own process group (stopped as a whole by
:meth:`LabServer.stop`), and on Linux it is killed by the kernel if that process dies, even by ``SIGKILL``
(see :mod:`attnlab._process`).

>>> cmd = command(8123)
>>> cmd[1:4], cmd[-4:]
(['-m', 'marimo', 'run'], ['--host', '127.0.0.1', '--port', '8123'])
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .._process import orphan_proof, stop_group
from ..errors import missing_extra
from ..validate import check_float, check_int
from . import NOTEBOOK

__all__ = ["HOST", "LabServer", "command", "free_port", "start"]

#: The lab only ever listens on the loopback interface.
HOST = "127.0.0.1"


def free_port(host: str = HOST, port: int = 0) -> int:
    """A TCP port on ``host`` that nothing listens on right now: ``port`` if it is free, else ``OSError``.

    ``port=0`` (the default): the OS picks one.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as marimo's server binds (uvicorn sets SO_REUSEADDR): a port whose last server stopped a moment ago, with
        # connections still in TIME_WAIT, is free for it, and only a port something listens on is in use
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            raise OSError(
                err.errno, f"port {port} on {host} is in use ({err.strerror}); choose another --port"
            ) from None
        return int(s.getsockname()[1])


def command(port: int, *, notebook: Path | str = NOTEBOOK, edit: bool = False) -> list[str]:
    """The marimo command line: ``run`` (an app, code hidden) or ``edit`` (a teacher's copy), headless, local.

    ``edit=True`` also tells marimo to read its access token from standard input (``--token-password-file -``).
    """
    mode = ["edit", "--skip-update-check", "--token-password-file", "-"] if edit else ["run"]
    return [sys.executable, "-m", "marimo", *mode, str(notebook), "--headless", "--host", HOST, "--port", str(port)]


def environment(state: Path | str | None = None) -> dict[str, str]:
    """The environment for the server: no update checks, no hub downloads; with ``state``, marimo's state folder
    (``XDG_STATE_HOME``: its server registry ``marimo/servers/HOST_PORT.json`` and recent files) inside that folder,
    which the lab owns and removes, instead of ``~/.local/state``, where a killed server's registry file stayed
    behind. The cache folder (other libraries' too) and the user's marimo configuration are left as they are."""
    env = dict(os.environ)
    env.update({"MARIMO_SKIP_UPDATE_CHECK": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    if state is not None:
        env["XDG_STATE_HOME"] = str(state)
    return env


@dataclass
class LabServer:
    """A running lab; use as a context manager (``with start() as lab: ...``) so the process always ends.

    ``token`` is the access token of an edit-mode server (None in app mode); ``log`` holds marimo's output;
    ``state`` is the temporary folder marimo keeps its state in (removed by :meth:`stop`).
    """

    process: subprocess.Popen
    port: int
    notebook: Path
    token: str | None = None
    log: IO[str] | None = None
    state: tempfile.TemporaryDirectory | None = None

    @property
    def url(self) -> str:
        """The address to open: ``http://127.0.0.1:PORT/``, with ``?access_token=...`` in edit mode."""
        base = f"http://{HOST}:{self.port}/"
        return f"{base}?access_token={self.token}" if self.token else base

    def output(self) -> str:
        """What marimo has printed so far."""
        if self.log is None or self.log.closed:
            return ""
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the server answers HTTP (or raise ``TimeoutError``/``RuntimeError`` with its output)."""
        timeout = check_float("timeout", timeout, positive=True)
        deadline = time.monotonic() + timeout
        health = f"http://{HOST}:{self.port}/health"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"lab: marimo exited with code {self.process.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(health, timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"lab: no answer from http://{HOST}:{self.port}/ within {timeout:g} s")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server and everything in its process group: ``SIGTERM``, then ``SIGKILL`` after ``timeout`` s."""
        stop_group(self.process, timeout)
        if self.log is not None:
            self.log.close()
        if self.state is not None:
            self.state.cleanup()

    def __enter__(self) -> LabServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(
    port: int | None = None,
    *,
    edit: bool = False,
    workdir: Path | str | None = None,
    die_with_parent: bool = True,
) -> LabServer:
    """Start marimo on ``127.0.0.1:port`` (a free port if ``port`` is None or 0) and return at once (``wait_ready``).

    Raises ``OSError`` if ``port`` is in use, :class:`~attnlab.errors.OptionError` if it is not in [0, 65535].

    ``edit=True`` copies the notebook to ``workdir`` (default: the current folder) as ``attnlab_lab.py`` unless it
    exists, and opens it in marimo's editor with a fresh access token (in :attr:`LabServer.url`), so the packaged
    notebook is never changed. ``die_with_parent`` (Linux): the server is killed when the thread that called
    ``start`` ends (its process's main thread, for a command); pass False to start it from a short-lived thread.
    """
    try:
        import marimo  # noqa: F401  # only whether it imports
    except ImportError:
        raise missing_extra("marimo", "lab") from None
    port = 0 if port is None else check_int("port", port, minimum=0, maximum=65535)
    nb = NOTEBOOK
    if edit:
        nb = Path(workdir or ".") / "attnlab_lab.py"
        if not nb.exists():
            shutil.copyfile(NOTEBOOK, nb)
    port = free_port(HOST, port)
    token = secrets.token_urlsafe(24) if edit else None
    cmd = command(port, notebook=nb, edit=edit)
    log = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
    state = tempfile.TemporaryDirectory(prefix="attnlab-lab-", ignore_cleanup_errors=True)  # marimo's state, not ~'s
    proc = subprocess.Popen(
        orphan_proof(cmd) if die_with_parent else cmd,
        stdin=subprocess.PIPE if edit else subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment(state.name),
        cwd=str(nb.parent),
        start_new_session=True,
    )
    if proc.stdin is not None:
        try:
            proc.stdin.write(f"{token}\n")
            proc.stdin.close()  # marimo reads the token up to the end of its input
        except BrokenPipeError:  # it already exited: wait_ready reports why
            pass
    return LabServer(proc, port, nb, token, log, state)
