"""Start the lab: marimo serving the packaged notebook on 127.0.0.1, on a free port, offline.

marimo serves its front-end from the files installed with it (no CDN); update checks are switched off
(``MARIMO_SKIP_UPDATE_CHECK=1``), and the server binds to the loopback interface only.

>>> cmd = command(8123)
>>> cmd[1:4], cmd[-4:]
(['-m', 'marimo', 'run'], ['--host', '127.0.0.1', '--port', '8123'])
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..errors import missing_extra
from . import NOTEBOOK

__all__ = ["HOST", "LabServer", "command", "free_port", "start"]

#: The lab only ever listens on the loopback interface.
HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A TCP port on ``host`` that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def command(port: int, *, notebook: Path | str = NOTEBOOK, edit: bool = False) -> list[str]:
    """The marimo command line: ``run`` (an app, code hidden) or ``edit`` (a teacher's copy), headless, local."""
    mode = ["edit", "--skip-update-check"] if edit else ["run"]
    return [sys.executable, "-m", "marimo", *mode, str(notebook), "--headless", "--host", HOST, "--port", str(port)]


def environment() -> dict[str, str]:
    """The environment for the server: no update checks, no hub downloads."""
    env = dict(os.environ)
    env.update({"MARIMO_SKIP_UPDATE_CHECK": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    return env


@dataclass
class LabServer:
    """A running lab; use as a context manager (``with start() as lab: ...``) so the process always ends."""

    process: subprocess.Popen
    port: int
    notebook: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the server answers HTTP (or raise ``TimeoutError``/``RuntimeError`` with its output)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                out = self.process.stdout.read() if self.process.stdout else ""
                raise RuntimeError(f"lab: marimo exited with code {self.process.returncode}:\n{out}")
            try:
                with urllib.request.urlopen(self.url + "health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"lab: no answer from {self.url} within {timeout:g} s")

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the server (then kill it if it does not exit within ``timeout`` seconds)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        if self.process.stdout:
            self.process.stdout.close()

    def __enter__(self) -> LabServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(port: int | None = None, *, edit: bool = False, workdir: Path | str | None = None) -> LabServer:
    """Start marimo on ``127.0.0.1:port`` (a free port by default) and return at once (see ``wait_ready``).

    ``edit=True`` copies the notebook to ``workdir`` (default: the current folder) as ``attnlab_lab.py`` unless it
    exists, and opens it in marimo's editor, so the packaged notebook is never changed.
    """
    try:
        import marimo  # noqa: F401
    except ImportError:
        raise missing_extra("marimo", "lab") from None
    nb = NOTEBOOK
    if edit:
        nb = Path(workdir or ".") / "attnlab_lab.py"
        if not nb.exists():
            shutil.copyfile(NOTEBOOK, nb)
    port = free_port() if port is None else int(port)
    proc = subprocess.Popen(
        command(port, notebook=nb, edit=edit),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment(),
        cwd=str(nb.parent),
    )
    return LabServer(proc, port, nb)
