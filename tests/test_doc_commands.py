"""Every command the README and docs/*.md show in a ```bash or ```console block runs as written (issue 24).

Rules (docs/checker.md, "Commands in these docs"):

* a command runs from the repository's root: here from a scratch folder that links every top-level entry of the
  root (so ``examples/...``, ``benchmarks/...`` resolve as written, and the files the commands write land there),
  with this checkout's attnlab first on PYTHONPATH and ``attnlab`` started as its console script starts it (the
  entry point ``attnlab.cli:main``, without the current folder on sys.path);
* a ``bash`` command must exit 0; a ``console`` block's ``$ command`` must print each line shown under it (whitespace
  and line wrapping aside, decimal numbers such as timings free to differ; integers such as call counts are not);
  no command may print a traceback;
* ``needs: gpu`` / ``2 gpus`` / ``mps`` / ``network`` / ``2 nodes`` in a command's comment leave it out (they are
  listed by ``test_what_is_left_out_is_marked``), ``needs: minutes`` runs only its argument checks (the command's
  parser and ``check_args`` for ``attnlab``, the script's argparse for ``python benchmarks/...``), and a command
  whose comment says ``until Ctrl-C`` must print its URL, answer an HTTP request there, and stop on SIGINT.

The commands run in parallel (they write different files); each has its own timeout.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from procs import with_default_sigint

import attnlab

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(attnlab.__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
#: What a command's comment may say it needs; such a command is not run here.
NEEDS = ("gpu", "2 gpus", "mps", "network", "2 nodes", "minutes")
NEEDS_RE = re.compile(r"\bneeds: (" + "|".join(re.escape(n) for n in sorted(NEEDS, key=len, reverse=True)) + r")\b")
#: The first line of a block that is a command (an unlabelled block must not start like this).
COMMAND_START = re.compile(r"^(\$ |attnlab [a-z-]+ (?!\s)|python |pip |torchrun |bash |env |\(cd |[A-Z_]+=\S* )")
TIMEOUT = 420  # seconds per command (the slowest, SmolLM2 generating 64 tokens, takes ~10 s on a quiet machine)
#: What may differ from run to run: decimal numbers, and any number with a unit of time or memory (a rank's peak
#: memory is 1.2 MiB on one machine and 1008.0 KiB on another).
FLOAT = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?\s?(?:ms|µs|s|B|KiB|MiB|GiB)\b|\d+\.\d+(?:e[+-]?\d+)?")

#: ``attnlab ...`` as the console script runs it: the entry point, without the current folder on sys.path.
ENTRY = "import sys; from attnlab.cli import main; sys.argv[0] = 'attnlab'; sys.exit(main())"
#: ``needs: minutes``, an attnlab command: its parser and check_args only (every command's run() returns 0).
ATTNLAB_ARGS_ONLY = (
    "import importlib, sys; from attnlab.commands import COMMANDS; from attnlab.cli import main\n"
    "for name in COMMANDS:\n"
    "    importlib.import_module('attnlab.commands.' + name).run = lambda args: print('arguments ok') or 0\n"
    "sys.argv[0] = 'attnlab'; sys.exit(main())"
)
#: ``needs: minutes``, a Python script: the script up to its argparse parse, then stop.
SCRIPT_ARGS_ONLY = (
    "import argparse, runpy, sys\n"
    "parse = argparse.ArgumentParser.parse_args\n"
    "def parse_only(self, *a, **k):\n"
    "    parse(self, *a, **k); print('arguments ok'); sys.exit(0)\n"
    "argparse.ArgumentParser.parse_args = parse_only\n"
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


@dataclass(frozen=True)
class Command:
    """One command of the docs: where it is, the shell text, what it needs, the output shown under it."""

    where: str  # "docs/learn.md:196"
    text: str  # with its comment, as shown
    needs: str | None
    expected: tuple[str, ...] | None  # console blocks: the lines shown under ``$ command``

    @property
    def serves(self) -> bool:
        return "until Ctrl-C" in self.text


def _commands_of(path: Path) -> list[Command]:
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(ROOT)
    found = []
    for m in FENCE.finditer(text):
        lang, body = m.group(1), m.group(2)
        first_line = text[: m.start()].count("\n") + 2
        if lang == "bash":
            lines = body.rstrip("\n").split("\n")
            i = 0
            while i < len(lines):
                start, parts = i, [lines[i]]
                while parts[-1].endswith("\\"):
                    i += 1
                    parts.append(lines[i])
                i += 1
                cmd = "\n".join(parts)
                if cmd.strip() and not cmd.lstrip().startswith("#"):
                    need = NEEDS_RE.search(cmd)
                    found.append(Command(f"{rel}:{first_line + start}", cmd, need and need.group(1), None))
        elif lang == "console":
            chunks = re.split(r"^\$ ", body, flags=re.M)
            assert chunks[0] == "", f"{rel}:{first_line}: a console block starts with '$ command'"
            line = first_line
            for chunk in chunks[1:]:
                cmd, *shown = chunk.rstrip("\n").split("\n")
                need = NEEDS_RE.search(cmd)
                found.append(Command(f"{rel}:{line}", cmd, need and need.group(1), tuple(shown)))
                line += 1 + len(shown)
        else:
            assert not COMMAND_START.match(body), (
                f"{rel}:{first_line}: a command in a ```{lang} block: mark it ```bash (or ```console with its output)"
            )
    return found


COMMANDS = [c for doc in DOCS for c in _commands_of(doc)]


def _shell_text(cmd: Command) -> str:
    """The command without its trailing comment (bash would drop it too), and for ``needs: minutes`` the same
    command with its program replaced by the argument-only runner."""
    text = cmd.text
    if cmd.needs != "minutes":
        return text
    text = re.sub(r"(^|\s)attnlab (?=[a-z])", r'\1python -c "$ATTNLAB_ARGS_ONLY" ', text, count=1)
    return re.sub(r"(^|\s)python (?=benchmarks/)", r'\1python -c "$SCRIPT_ARGS_ONLY" ', text, count=1)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A folder that looks like the repository's root, with ``attnlab`` and ``python`` on PATH for this checkout."""
    where = tmp_path_factory.mktemp("root")
    for entry in ROOT.iterdir():
        if entry.name not in (".git",):
            (where / entry.name).symlink_to(entry)
    bin_dir = tmp_path_factory.mktemp("bin")
    (bin_dir / "attnlab").write_text(f'#!/bin/sh\nexec "{sys.executable}" -P -c "{ENTRY}" "$@"\n')
    (bin_dir / "attnlab").chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "ATTNLAB_ARGS_ONLY": ATTNLAB_ARGS_ONLY,
        "SCRIPT_ARGS_ONLY": SCRIPT_ARGS_ONLY,
        "BROWSER": "true",  # `attnlab lab --open` asks the browser module; here it opens nothing
        "HF_HUB_OFFLINE": "1",
        "NO_COLOR": "1",
        "COLUMNS": "100",
    }
    env.pop("FORCE_COLOR", None)
    return where, env


def _normal(text: str) -> str:
    return " ".join(FLOAT.sub("#", text).split())


def _serve(cmd: Command, cwd: Path, env: dict, log: Path) -> str | None:
    """Start a server command, wait for its URL, fetch it, stop it with SIGINT. Returns what went wrong, or None."""
    with open(log, "w") as out:
        proc = subprocess.Popen(  # Ctrl-C as from a terminal, even when the suite runs in the background (`... &`)
            with_default_sigint([shutil.which("bash") or "/bin/bash", "-c", cmd.text], python=sys.executable),
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url, t0 = None, time.monotonic()
    try:
        while url is None and time.monotonic() - t0 < TIMEOUT and proc.poll() is None:
            time.sleep(0.3)
            m = re.search(r"http://127\.0\.0\.1:\d+/\S*", log.read_text(errors="replace"))
            url = m and m.group(0)
        if url is None:
            return f"no URL after {time.monotonic() - t0:.0f} s: {log.read_text(errors='replace')[-2000:]}"
        with urllib.request.urlopen(url, timeout=60) as resp:
            if resp.status != 200:
                return f"{url} answered {resp.status}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                ps = subprocess.run(
                    ["ps", "-o", "pid,pgid,stat,wchan:20,args", "-g", str(proc.pid)], capture_output=True, text=True
                ).stdout
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                tail = log.read_text(errors="replace")[-1500:]
                return f"did not stop on Ctrl-C (SIGINT); its processes then:\n{ps}\nits output:\n{tail}"
    text = log.read_text(errors="replace")
    if "Traceback" in text:
        return f"traceback: {text[-3000:]}"
    return None


def _run(cmd: Command, cwd: Path, env: dict) -> tuple[Command, str | None, float]:
    t0 = time.monotonic()
    try:
        return _run_one(cmd, cwd, env, t0)
    except Exception as err:  # the runner's own failure is this command's failure, reported with the others
        return cmd, f"{type(err).__name__}: {err}", time.monotonic() - t0


def _run_one(cmd: Command, cwd: Path, env: dict, t0: float) -> tuple[Command, str | None, float]:
    if cmd.serves:
        log = cwd / f"serve-{re.sub(r'[^A-Za-z0-9]+', '-', cmd.where)}.log"
        return cmd, _serve(cmd, cwd, env, log), time.monotonic() - t0
    try:
        proc = subprocess.run(
            ["bash", "-c", _shell_text(cmd)], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return cmd, f"still running after {TIMEOUT} s", time.monotonic() - t0
    out = proc.stdout + proc.stderr
    seconds = time.monotonic() - t0
    if "Traceback (most recent call last)" in out:
        return cmd, f"traceback (exit {proc.returncode}): {out[-3000:]}", seconds
    if cmd.expected is None:
        if proc.returncode != 0:
            return cmd, f"exit status {proc.returncode}: {out[-3000:]}", seconds
        if cmd.needs == "minutes" and "arguments ok" not in proc.stdout:
            return cmd, f"the argument check did not run: {out[-2000:]}", seconds
        return cmd, None, seconds
    got = _normal(out)
    missing = [line for line in cmd.expected if line.strip() and _normal(line) not in got]
    if missing:
        return cmd, f"exit {proc.returncode}; not in the output: {missing!r}\n--- output:\n{out[-3000:]}", seconds
    return cmd, None, seconds


def test_the_docs_have_commands_of_every_kind():
    kinds = {c.needs for c in COMMANDS} | {"console" for c in COMMANDS if c.expected is not None}
    assert {None, "console", "gpu", "network", "minutes", "2 nodes"} <= kinds, kinds
    assert len(COMMANDS) >= 50, len(COMMANDS)
    assert not [c for c in COMMANDS if "path/to" in c.text or re.search(r"\s\.\.\.(\s|$)", c.text)]


def test_what_is_left_out_is_marked():
    """The commands this test cannot run anywhere are exactly those whose comment says what they need."""
    left_out = {c.where: c.needs for c in COMMANDS if c.needs not in (None, "minutes")}
    assert set(left_out.values()) <= set(NEEDS)
    for c in COMMANDS:
        if "--device cuda" in c.text or "--device mps" in c.text:
            assert c.needs in ("gpu", "2 gpus", "mps"), c.where
        if re.match(r"(python -m )?pip install|bash scripts/test\.sh", c.text):
            assert c.needs == "network", c.where
        if re.search(r"(^|\s)(attnlab bench|python benchmarks/)", c.text):
            assert c.needs == "minutes", c.where


def test_every_documented_command_runs_as_written(scratch):
    cwd, env = scratch
    runnable = [c for c in COMMANDS if c.needs in (None, "minutes")]
    only = os.environ.get("ATTNLAB_DOC_COMMANDS")  # e.g. "docs/models.md": rerun one file's commands while editing
    if only:
        runnable = [c for c in runnable if re.search(only, c.where)]
    runnable.sort(key=lambda c: not re.search(r"attnlab (generate|intervene|heatmap --model)|torchrun", c.text))
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=min(6, 2 * (os.cpu_count() or 1))) as pool:
        results = list(pool.map(lambda c: _run(c, cwd, env), runnable))
    took = time.monotonic() - t0
    failures = [f"{c.where}: {c.text}\n  {why}" for c, why, _ in results if why is not None]
    slowest = sorted(results, key=lambda r: -r[2])[:8]
    times = ", ".join(f"{c.where} {s:.1f} s" for c, _, s in slowest)
    print(f"\n{len(runnable)} commands in {took:.1f} s; slowest: {times}")
    assert not failures, "\n\n".join(failures)
    if not only:
        assert (cwd / "heads.png").stat().st_size > 1000  # what the commands wrote is there


def test_the_shipped_examples_are_the_documented_ones():
    """The README and docs show the files in examples/ in full; the shipped files are those texts."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shown = readme.split("For this `examples/my_attention.py`")[1].split("```python\n")[1].split("```")[0]
    assert (ROOT / "examples" / "my_attention.py").read_text() == shown
    checker = (ROOT / "docs" / "checker.md").read_text(encoding="utf-8")
    shown = checker.split("For this `examples/my_backward.py`")[1].split("```python\n")[1].split("```")[0]
    assert (ROOT / "examples" / "my_backward.py").read_text() == shown


def test_the_example_arrays_are_what_their_script_writes():
    import numpy as np

    code = (ROOT / "examples" / "make_arrays.py").read_text()
    space: dict = {"__name__": "make_arrays", "__file__": str(ROOT / "examples" / "make_arrays.py")}
    exec(compile(code, "make_arrays.py", "exec"), space)
    for name, array in space["arrays"]().items():
        np.testing.assert_array_equal(np.load(ROOT / "examples" / f"{name}.npy"), array)


def test_a_wrong_command_would_fail(scratch):
    """The runner itself: a usage error, a missing output line and a placeholder path are caught."""
    cwd, env = scratch
    bad = [
        Command("x:1", "attnlab explain --q path/to/q.npy --k q.npy --v q.npy", None, None),
        Command("x:2", "attnlab check-model gpt2-tiny --seq-len 100", None, ("this line is not printed",)),
        Command("x:3", "attnlab bench --sizes many  # needs: minutes", "minutes", None),
        Command("x:4", "python benchmarks/bench_blocks.py --only nothing  # needs: minutes", "minutes", None),
    ]
    for cmd in bad:
        _, why, _ = _run(cmd, cwd, env)
        assert why is not None, cmd
    _, why, _ = _run(Command("x:5", "attnlab cost 1024 4096 --batch 2", None, None), cwd, env)
    assert why is None, why
    _, why, _ = _run(
        Command("x:6", "python benchmarks/bench_blocks.py --only bias  # needs: minutes", "minutes", None), cwd, env
    )
    assert why is None, why
    assert _normal("took 1.2 MiB in 24.7ms, 36 tiles") == _normal("took 1008.0 KiB in 52.9ms, 36 tiles")
    assert _normal("104 calls") != _normal("91 calls")
