"""mypy accepts the documented API as the README and docs use it (issue 24: ``attnlab.check(fn)`` was "Module not
callable" although py.typed ships).

Every ```python block of README.md and docs/*.md that uses attnlab is type-checked: the doctest blocks of one file
as one module (they share a session), each other block as its own module. A name a fragment takes from the reader
(``my_attention``, ``out_fp16``) is unknown to mypy and is left untyped (``name-defined`` is off), and a session
may rebind a name to another type (``allow_redefinition``); every other error in the examples is reported.

mypy runs with the package's own configuration ([tool.mypy] in pyproject.toml) for every module the examples import,
so that it can start from the cache ``python -m mypy`` left in the checkout (scripts/test.sh runs it just before
pytest): attnlab, NumPy and torch are then read from that cache instead of analysed again (a cold run is most of a
minute). The examples' own options are an override for their modules only, which leaves every other module's options,
and so its cache entry, as the package's run has them. Errors of imported modules are not the examples' (the package's
own run reports those): the tests read the examples' lines only."""

from __future__ import annotations

import doctest
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import attnlab

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(attnlab.__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
#: The examples' options (an override for their modules in the configuration that :func:`run_mypy` writes).
EXAMPLE_OPTIONS = {"allow_redefinition": True, "disable_error_code": ["name-defined"]}


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


def mypy_config(modules: dict[str, str]) -> str:
    """pyproject.toml's [tool.mypy] (without its files and path) plus :data:`EXAMPLE_OPTIONS` for ``modules``, as the
    text of a pyproject.toml (JSON's strings, booleans and lists of strings are TOML's)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    overrides = [*config.pop("overrides"), {"module": sorted(modules), **EXAMPLE_OPTIONS}]
    lines = ["[tool.mypy]"] + [f"{k} = {json.dumps(v)}" for k, v in config.items() if k not in ("files", "mypy_path")]
    for override in overrides:
        lines += ["[[tool.mypy.overrides]]"] + [f"{k} = {json.dumps(v)}" for k, v in override.items()]
    return "\n".join(lines) + "\n"


def run_mypy(modules: dict[str, str], where: Path, cache: Path) -> tuple[int, list[str]]:
    """mypy's exit status on ``modules`` (written into ``where``) and its errors in them."""
    where.mkdir(parents=True, exist_ok=True)
    for name, src in modules.items():
        (where / f"{name}.py").write_text(src)
    (where / "pyproject.toml").write_text(mypy_config(modules))
    env = {**os.environ, "MYPYPATH": str(SRC)}  # this checkout's attnlab (with its py.typed)
    files = sorted(f"{n}.py" for n in modules)
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache), "--no-error-summary", *files],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode in (0, 1), run.stdout + run.stderr  # 2: mypy itself failed (a usage or config error)
    ours = [line for line in run.stdout.splitlines() if line.split(":")[0].removesuffix(".py") in modules]
    return run.returncode, [line for line in ours if ": error: " in line]


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory):
    """A copy of the checkout's .mypy_cache where there is one (mypy checks each entry against its source and
    options, so an entry that does not fit is analysed again), else an empty folder."""
    cache = tmp_path_factory.mktemp("mypy") / "cache"
    if (ROOT / ".mypy_cache").is_dir():
        shutil.copytree(ROOT / ".mypy_cache", cache)
    return cache


def test_mypy_accepts_the_documented_examples(tmp_path, mypy_cache):
    modules = doc_modules((ROOT / "README.md").read_text(), "README", readme=True)
    for md in sorted((ROOT / "docs").glob("*.md")):
        modules.update(doc_modules(md.read_text(), md.stem))
    assert {"README_session", "README_block0", "checker_block0", "kernels_session"} <= set(modules)
    assert any("attnlab.check(" in src for src in modules.values())
    _, errors = run_mypy(modules, tmp_path / "examples", mypy_cache)
    assert not errors, "\n".join(errors)


def test_mypy_on_the_examples_catches_a_real_type_error(tmp_path, mypy_cache):
    """The same run fails on a misuse of the API, so the test above can fail."""
    text = (
        "```python\n>>> import attnlab\n>>> report = attnlab.check(lambda q, k, v: q)\n"
        ">>> n: int = report.verdict\n>>> attnlab.flash_attention([[1.0]], [[1.0]], [[1.0]]).weights\n```\n"
    )
    status, errors = run_mypy(doc_modules(text, "bad"), tmp_path / "bad", mypy_cache)
    assert status == 1
    found = "\n".join(errors)
    assert 'bad_session.py:3: error: Incompatible types in assignment (expression has type "str"' in found
    assert 'bad_session.py:4: error: "FlashResult" has no attribute "weights"' in found
    assert "not callable" not in found  # attnlab.check is the function, not a module
