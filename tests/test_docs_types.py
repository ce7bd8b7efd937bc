"""mypy accepts the documented API as the README and docs use it (issue 24: ``attnlab.check(fn)`` was "Module not
callable" although py.typed ships).

Every ```python block of README.md and docs/*.md that uses attnlab is type-checked: the doctest blocks of one file
as one module (they share a session), each other block as its own module. A name a fragment takes from the reader
(``my_attention``, ``out_fp16``) is unknown to mypy and is left untyped (``name-defined`` is off), and a session
may rebind a name to another type (``--allow-redefinition``); every other error is reported."""

from __future__ import annotations

import doctest
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import attnlab

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(attnlab.__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
FLAGS = ["--follow-imports=silent", "--allow-redefinition", "--disable-error-code=name-defined", "--no-error-summary"]


def doc_modules(text: str, stem: str, readme: bool = False) -> dict[str, str]:
    """``{module name: source}`` of the Python examples in one markdown text."""
    session, plain = [], []
    for m in FENCE.finditer(text):
        if m.group(1) != "python":
            continue
        body = m.group(2)
        if body.lstrip().startswith(">>>"):
            session += [ex.source for ex in doctest.DocTestParser().get_examples(body)]
        elif readme or "attnlab" in body:
            plain.append(body)
    out = {f"{stem}_session": "".join(session)} if session else {}
    out.update({f"{stem}_block{i}": src for i, src in enumerate(plain)})
    return out


def run_mypy(modules: dict[str, str], where: Path, cache: Path) -> subprocess.CompletedProcess:
    where.mkdir(parents=True, exist_ok=True)
    for name, src in modules.items():
        (where / f"{name}.py").write_text(src)
    env = {**os.environ, "MYPYPATH": str(SRC)}  # this checkout's attnlab (with its py.typed)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache), *FLAGS, *sorted(f"{n}.py" for n in modules)],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("mypy_cache")


def test_mypy_accepts_the_documented_examples(tmp_path, mypy_cache):
    modules = doc_modules((ROOT / "README.md").read_text(), "README", readme=True)
    for md in sorted((ROOT / "docs").glob("*.md")):
        modules.update(doc_modules(md.read_text(), md.stem))
    assert {"README_session", "README_block0", "checker_block0", "kernels_session"} <= set(modules)
    assert any("attnlab.check(" in src for src in modules.values())
    out = run_mypy(modules, tmp_path / "examples", mypy_cache)
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_on_the_examples_catches_a_real_type_error(tmp_path, mypy_cache):
    """The same run fails on a misuse of the API, so the test above can fail."""
    text = (
        "```python\n>>> import attnlab\n>>> report = attnlab.check(lambda q, k, v: q)\n"
        ">>> n: int = report.verdict\n>>> attnlab.flash_attention([[1.0]], [[1.0]], [[1.0]]).weights\n```\n"
    )
    out = run_mypy(doc_modules(text, "bad"), tmp_path / "bad", mypy_cache)
    assert out.returncode == 1
    assert 'bad_session.py:3: error: Incompatible types in assignment (expression has type "str"' in out.stdout
    assert 'bad_session.py:4: error: "FlashResult" has no attribute "weights"' in out.stdout
    assert "not callable" not in out.stdout  # attnlab.check is the function, not a module
