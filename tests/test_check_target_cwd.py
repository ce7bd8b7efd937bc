"""``attnlab check mypackage.layers:attend`` finds a package in the current folder (issue 24), however attnlab was
started: ``python -m attnlab`` (which puts the current folder on sys.path itself) and the ``attnlab`` console
script's entry point ``attnlab.cli:main`` (which does not: run here with ``python -P``, as the generated script
does not have the current folder on sys.path either)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import attnlab

SRC = str(Path(attnlab.__file__).resolve().parents[1])

LAYERS = """
import math

import numpy as np


def attend(q, k, v, mask=None):
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    d = e.sum(-1, keepdims=True)
    return np.divide(e, d, out=np.zeros_like(e), where=d > 0) @ v
"""

ENTRY_POINT = (
    "import sys; from importlib.metadata import entry_points; "
    "(ep,) = [e for e in entry_points(group='console_scripts') if e.name == 'attnlab']; "
    "assert ep.value == 'attnlab.cli:main', ep.value; "
    "sys.argv[0] = 'attnlab'; sys.exit(ep.load()())"
)


@pytest.fixture
def project(tmp_path):
    pkg = tmp_path / "mypackage"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "layers.py").write_text(LAYERS)
    return tmp_path


def _run(how: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC}  # this checkout's attnlab, not the current folder
    cmd = [sys.executable, "-m", "attnlab"] if how == "python -m" else [sys.executable, "-P", "-c", ENTRY_POINT]
    return subprocess.run([*cmd, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("how", ["python -m", "entry point"])
def test_a_package_in_the_current_folder_is_checked(project, how):
    out = _run(how, ["check", "mypackage.layers:attend", "--no-color", "--probes", "reference,causal"], project)
    assert "No module named" not in out.stderr, out.stderr
    assert "attnlab check: mypackage.layers:attend" in out.stdout, out.stdout + out.stderr
    assert "reference ok" in out.stdout and "causal ok" in out.stdout, out.stdout


def test_the_entry_point_does_not_see_the_current_folder_by_itself(project):
    """What made the bug: the console script's sys.path lacks the current folder (so the test above tests the fix)."""
    code = "import sys, os; print(os.getcwd() in [os.path.abspath(p or '.') for p in sys.path])"
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-P", "-c", code], cwd=project, env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "False"


def test_a_missing_module_names_the_current_folder(project):
    out = _run("entry point", ["check", "notthere.layers:attend"], project)
    assert out.returncode == 2
    assert out.stderr.startswith(
        "attnlab check: error: target 'notthere.layers:attend': cannot import module notthere.layers: "
        f"ModuleNotFoundError: No module named 'notthere' (looked in the current folder {project}"
    ), out.stderr


def test_load_target_in_process_finds_the_current_folder(project, monkeypatch):
    from attnlab.checker.target import load_target

    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.abspath(p or ".") != str(project)])
    monkeypatch.delitem(sys.modules, "mypackage", raising=False)
    monkeypatch.delitem(sys.modules, "mypackage.layers", raising=False)
    fn = load_target("mypackage.layers:attend")
    assert fn.__module__ == "mypackage.layers"
    sys.modules.pop("mypackage.layers", None)
    sys.modules.pop("mypackage", None)
