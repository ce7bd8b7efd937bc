"""Build attnlab's API reference with pdoc: one HTML page per public module, into docs/api/ (git-ignored).

What is public (written down once, here and in docs/README.md): every module under ``attnlab`` whose dotted name has
no part that starts with ``_`` (except ``NOT_API``), and in each such module the names in its ``__all__`` with the
public methods of its classes. Every public module has an ``__all__`` and a docstring, every name in it has a
docstring; tests/test_api_docs.py holds that, and that each name has its section (``id="NAME"``) on its module's page.

Warnings are errors: any warning raised while the modules are imported or rendered (pdoc warns about a name in
``__all__`` that does not resolve, a module that does not import, an annotation it cannot read) fails the build with
exit status 1 and the warnings printed.

Usage: ``python scripts/build_docs.py [--output DIR]`` (scripts/build-docs.sh; README command 2 runs it).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import pkgutil
import re
import shutil
import sys
import time
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KEEP = {"README.md"}  # the committed note in docs/api/ that says how to build the rest
TEMPLATES = ROOT / "scripts" / "pdoc-templates"  # the index lists every module; a package, all its submodules
#: Modules that are documents rather than an API: the lab's marimo notebook (``attnlab lab`` opens it; marimo's file
#: format allows no statement outside its cells, so it cannot hold an ``__all__``).
NOT_API = frozenset({"attnlab.lab.notebook"})
_TILDE_ROLE = re.compile(r"(:(?:py:)?[a-z]+:)`~")


def public_modules() -> list[str]:
    """Every module of attnlab with no ``_`` part in its dotted name, except ``NOT_API``, sorted."""
    import attnlab

    names = ["attnlab"] + [m.name for m in pkgutil.walk_packages(attnlab.__path__, "attnlab.")]
    return sorted(n for n in names if not any(p.startswith("_") for p in n.split(".")[1:]) and n not in NOT_API)


def _resolve_lazy_names(module: types.ModuleType) -> None:
    """Put each name of ``__all__`` that the module loads on first use (PEP 562 ``__getattr__``) into its namespace,
    so that pdoc, which reads ``module.__dict__``, documents it (only in this build process)."""
    for name in getattr(module, "__all__", ()):
        if name not in module.__dict__:
            try:
                module.__dict__[name] = getattr(module, name)
            except AttributeError:
                warnings.warn(f"{module.__name__}.__all__ names {name!r}, which the module does not have", stacklevel=2)


def _sphinx_roles_to_pdoc(convert: Callable[..., str]) -> Callable[..., str]:
    """pdoc reads ``:func:`name``` but not Sphinx's ``~`` (show the last part only): drop the ``~`` so the name
    renders and links as the full dotted name."""

    def wrapped(docstring: str, docformat: str, source_file: Path | None) -> str:
        return convert(_TILDE_ROLE.sub(r"\1`", docstring), docformat, source_file)

    return wrapped


def _comment_docstrings(obj: types.ModuleType | type) -> dict[str, str]:
    """Sphinx's attribute comments: ``#: text`` on the lines just above ``NAME = ...`` or at the end of its line."""
    import pdoc.doc_ast

    lines = pdoc.doc_ast.get_source(obj).splitlines()
    tree = pdoc.doc_ast.parse(obj)
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
        else:
            continue
        if node.lineno > len(lines):
            continue
        above = []
        i = node.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#:"):
            above.insert(0, lines[i].strip()[2:].strip())
            i -= 1
        _, hash_colon, trailing = lines[node.lineno - 1].partition("  #: ")
        text = " ".join(above) if above else trailing.strip() if hash_colon else ""
        if text:
            found[name] = text
    return found


def _reexported_docstrings(
    module: types.ModuleType, walk_tree: Callable[[Any], Any], visiting: frozenset[str] = frozenset()
) -> dict[str, str]:
    """A constant imported into a package (``from .report import CODES``) keeps the docstring it has where it is
    defined (its ``#:`` comment, its docstring string, or the docstring it has where *that* module imported it):
    pdoc reads variable docstrings from the module's own source only. Computed from the sources alone, so the
    order in which pdoc walks the modules does not matter."""
    import pdoc.doc_ast

    found: dict[str, str] = {}
    for node in pdoc.doc_ast.parse(module).body:
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        package = module.__name__ if hasattr(module, "__path__") else module.__name__.rpartition(".")[0]
        source = sys.modules.get(importlib.util.resolve_name("." * node.level + (node.module or ""), package))
        if source is None or source.__name__ in visiting:
            continue
        docs = {
            **_reexported_docstrings(source, walk_tree, visiting | {module.__name__}),
            **_comment_docstrings(source),
            **walk_tree(source).var_docstrings,
        }
        for alias in node.names:
            if docs.get(alias.name):
                found[alias.asname or alias.name] = docs[alias.name]
    return found


def _with_more_docstrings(walk_tree: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """pdoc's ``walk_tree`` plus ``#:`` comments and re-exported constants' docstrings (a docstring string after the
    assignment still wins)."""

    done: dict[int, tuple[object, Any]] = {}  # id(obj) -> (obj, info) with its extras; kept alive (no id reused)

    def wrapped(obj: types.ModuleType | type) -> Any:
        info = walk_tree(obj)
        if done.get(id(obj), (None, None))[1] is info:
            return info
        done[id(obj)] = (obj, info)
        extra = _comment_docstrings(obj)
        if isinstance(obj, types.ModuleType):
            extra = {**_reexported_docstrings(obj, wrapped), **extra}
        for name, text in extra.items():
            info.var_docstrings.setdefault(name, text)
        return info

    return wrapped


def build(output: Path) -> list[str]:
    """Write the reference into ``output``; return the warnings raised (an empty list is a clean build)."""
    import pdoc
    import pdoc.doc
    import pdoc.doc_ast
    import pdoc.docstrings
    import pdoc.render

    import attnlab

    pdoc.docstrings.convert = _sphinx_roles_to_pdoc(pdoc.docstrings.convert)
    pdoc.doc_ast.walk_tree = _with_more_docstrings(pdoc.doc_ast.walk_tree)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = public_modules()
        modules = {}
        for name in names:
            module = importlib.import_module(name)
            _resolve_lazy_names(module)
            modules[name] = pdoc.doc.Module(module)
        pdoc.render.configure(
            docformat="google",
            show_source=False,
            footer_text=f"attnlab {attnlab.__version__}",
            template_directory=TEMPLATES,
        )
        # for the templates: each package's submodules, and each module's summary (its docstring's first paragraph)
        pdoc.render.env.globals["module_children"] = {
            parent: [n for n in names if n.rpartition(".")[0] == parent] for parent in names
        }
        pdoc.render.env.globals["module_summaries"] = {
            name: pdoc.docstrings.convert(doc.docstring.split("\n\n")[0], "google", doc.source_file)
            for name, doc in modules.items()
        }
        if output.exists():
            for child in output.iterdir():
                if child.name not in KEEP:
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
        for module in modules.values():
            page = output / f"{module.fullname.replace('.', '/')}.html"
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(pdoc.render.html_module(module, modules), encoding="utf-8")
        (output / "index.html").write_text(pdoc.render.html_index(modules), encoding="utf-8")
        (output / "search.js").write_text(pdoc.render.search_index(modules), encoding="utf-8")
    return [f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}" for w in caught]


def main(argv: list[str] | None = None) -> int:
    """Build the reference; exit status 1 (with the warnings on stderr) when any warning was raised."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "api", help="folder to write (default docs/api)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if importlib.util.find_spec("pdoc") is None:
        print("build_docs: pdoc is not installed: pip install -c constraints.txt -e '.[dev]'", file=sys.stderr)
        return 1
    problems = build(args.output)
    if problems:
        print(f"build_docs: {len(problems)} warning(s), treated as errors:", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    pages = sum(1 for _ in args.output.rglob("*.html"))
    print(f"API reference: {pages} pages in {args.output} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
