"""The API reference and the docs index.

Public, as docs/README.md writes it down: every module under ``attnlab`` with no ``_`` part in its dotted name, and in
each the names in its ``__all__``. The reference is built here by the script README command 2 runs
(scripts/build_docs.py, pdoc, warnings as errors) into a temporary folder, and each public name must have its section
on its module's page, with a docstring in it: what a reader of docs/api/ sees, not a second opinion on docstrings.
Public classes need a docstring of their own and one on each public method or property they define. Every name of
``attnlab.__all__`` is also mentioned in the hand-written docs, and docs/README.md lists every page.
"""

import dataclasses
import functools
import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import attnlab

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


#: The one module that is not an API: the lab's marimo notebook, a document (marimo allows no ``__all__`` in it).
NOT_API = {"attnlab.lab.notebook"}


def _public_modules() -> list[str]:
    names = ["attnlab"] + [m.name for m in pkgutil.walk_packages(attnlab.__path__, "attnlab.")]
    return sorted(n for n in names if not any(p.startswith("_") for p in n.split(".")[1:]) and n not in NOT_API)


PUBLIC = _public_modules()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built reference. scripts/test.sh builds it (its docs step, which fails on any warning) just before pytest
    and names that folder in ``ATTNLAB_TEST_API_DOCS``: the pages read here are then the ones it wrote, not a second
    build of the same pages. Without the variable the reference is built here, with the same script and checks."""
    built = os.environ.get("ATTNLAB_TEST_API_DOCS")
    if built:
        return ROOT / built
    out = tmp_path_factory.mktemp("api")
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_docs.py"), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr
    assert "API reference:" in run.stdout
    return out


def _page(site: Path, module: str) -> Path:
    return site / (module.replace(".", "/") + ".html")


def _section(html: str, name: str) -> str | None:
    """The part of a page that documents ``name`` itself (for a class: up to its first member)."""
    start = html.find(f'<section id="{name}">')
    if start < 0:
        return None
    end = min(i for i in (html.find("</section>", start), html.find(f'<div id="{name}.', start)) if i >= 0)
    return html[start:end]


def test_the_public_modules_are_the_package():
    assert len(PUBLIC) > 90
    assert {"attnlab", "attnlab.masks", "attnlab.core.attention", "attnlab.checker", "attnlab.models.llama"} <= set(
        PUBLIC
    )
    assert not [n for n in PUBLIC if "._" in n]
    for name in NOT_API:
        spec = importlib.util.find_spec(name)
        assert "marimo.App(" in Path(spec.origin).read_text(), f"{name} is excluded as a marimo notebook"


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_module_has_a_docstring_and_an_all(name):
    module = importlib.import_module(name)
    assert (module.__doc__ or "").strip(), f"{name} has no module docstring"
    if "__all__" not in vars(module):
        pytest.fail(f"{name} has no __all__ (write down what users are meant to use)")
    assert len(set(module.__all__)) == len(module.__all__), f"{name}.__all__ repeats a name"
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names {missing}, which the module does not have"


def test_every_public_name_has_a_page_with_its_docstring(site):
    """The index lists each public module; its page exists with its docstring; each name of its ``__all__`` has its
    section there (``id="NAME"``) holding a docstring, or, for a submodule, a page of its own; links resolve."""
    assert (site / "search.js").is_file()
    index = (site / "index.html").read_text(encoding="utf-8")
    problems = [
        f"{name}: not listed in index.html"
        for name in PUBLIC
        if f'href="{_page(site, name).relative_to(site)}"' not in index
    ]
    for name in PUBLIC:
        page = _page(site, name)
        if not page.is_file():
            problems.append(f"{name}: no page {page.relative_to(site)}")
            continue
        html = page.read_text(encoding="utf-8")
        info = html.split('<section class="module-info">')[1].split("</section>")[0]
        if 'class="docstring"' not in info:
            problems.append(f"{name}: its page shows no module docstring")
        for member in importlib.import_module(name).__all__:
            if f"{name}.{member}" in PUBLIC:
                continue  # a submodule: its own page, checked above
            section = _section(html, member)
            if section is None:
                problems.append(f"{name}.{member}: no section on {page.relative_to(site)}")
            elif 'class="docstring"' not in section:
                problems.append(f"{name}.{member}: no docstring")
    assert not problems, f"{len(problems)} public names lack a page or a docstring:\n" + "\n".join(problems)
    # in the same test, so that parallel workers build the reference once: every link between pages resolves
    broken = set()
    for page in site.rglob("*.html"):
        for href in re.findall(r'href="([^"#:]+\.html)(?:#[^"]*)?"', page.read_text(encoding="utf-8")):
            if not (page.parent / href).resolve().is_file():
                broken.add(f"{page.relative_to(site)} -> {href}")
    assert not broken, f"links to pages that do not exist: {sorted(broken)}"


def _own_routines(cls: type):
    """The public methods and properties ``cls`` itself defines (not fields, not inherited ones)."""
    for name, attr in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(attr, (staticmethod, classmethod)):
            fn = attr.__func__
        elif isinstance(attr, property):
            fn = attr.fget
        elif isinstance(attr, functools.cached_property):
            fn = attr.func
        else:
            fn = attr
        if inspect.isfunction(fn) and fn.__qualname__.startswith(f"{cls.__qualname__}."):
            yield name, attr


def test_every_public_class_and_method_has_its_own_docstring():
    """A public class has a docstring of its own (the page would show its base's, or a dataclass's signature), and
    each public method or property it defines has one (its own, or that of the method it overrides)."""
    missing, seen = [], set()
    for name in PUBLIC:
        module = importlib.import_module(name)
        for member in module.__all__:
            cls = getattr(module, member)
            if not inspect.isclass(cls) or not cls.__module__.startswith("attnlab") or cls in seen:
                continue
            seen.add(cls)
            doc = vars(cls).get("__doc__") or ""
            if not doc.strip() or (dataclasses.is_dataclass(cls) and doc.startswith(f"{cls.__name__}(")):
                missing.append(f"{cls.__module__}.{cls.__qualname__}")
            for attr_name, attr in _own_routines(cls):
                target = attr if isinstance(attr, (property, functools.cached_property)) else getattr(cls, attr_name)
                if not inspect.getdoc(target):
                    missing.append(f"{cls.__module__}.{cls.__qualname__}.{attr_name}")
    assert len(seen) > 100
    assert not missing, f"{len(missing)} public classes or methods have no docstring: {missing}"


def _hand_written_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "api" not in p.relative_to(DOCS).parts)]


def test_the_docs_index_lists_every_page_with_one_line():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"^- \[[^\]]+\]\(([^)#]+)\)[^\n]*\S", index, flags=re.M)
    pages = {str(p.relative_to(DOCS)) for p in _hand_written_pages()[1:]} - {"README.md"}
    assert pages <= set(listed), f"docs/README.md does not list {sorted(pages - set(listed))}"
    for link in listed:
        assert (DOCS / link).exists() or link == "api/index.html", f"docs/README.md links {link}, which is not there"
    assert "api/index.html" in listed and "scripts/build-docs.sh" in index


def test_the_readme_links_the_docs_index_and_the_reference():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(docs/README.md)" in readme
    assert "(docs/api/index.html)" in readme


def test_every_top_level_name_is_mentioned_in_the_docs():
    """Each name of ``attnlab.__all__`` appears as code (``name``, ``attnlab.name``, in a code block) in the README or
    a page of docs/, so a reader meets it outside the generated reference too."""
    code = []
    for page in _hand_written_pages():
        text = page.read_text(encoding="utf-8")
        code += re.findall(r"```.*?```", text, flags=re.S)
        code += re.findall(r"`[^`\n]+`", re.sub(r"```.*?```", "", text, flags=re.S))
    code_text = "\n".join(code)
    unmentioned = [n for n in attnlab.__all__ if not re.search(rf"(?<![\w]){re.escape(n)}\b", code_text)]
    assert not unmentioned, f"attnlab.__all__ names that no hand-written page mentions as code: {unmentioned}"


def test_the_build_script_is_in_command_2_and_the_output_is_ignored():
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "bash scripts/build-docs.sh" in script
    # the pages test reads the docs step's output (the default folder): the step runs before pytest and names it
    assert script.index("bash scripts/build-docs.sh") < script.index("ATTNLAB_TEST_API_DOCS=docs/api")
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "docs/api/index.html"], cwd=ROOT, capture_output=True, check=False
    )
    assert ignored.returncode == 0, "docs/api/ (generated) must be git-ignored"
    kept = subprocess.run(["git", "check-ignore", "-q", "docs/api/README.md"], cwd=ROOT, check=False)
    assert kept.returncode == 1, "docs/api/README.md (how to build the reference) is committed"
