"""The import graph of src/attnlab: no circle anywhere, and no arrow from a lower layer to a higher one.

The layer order is written once, in the README's layout table (``## Layout``): this test reads it from there. Every
import counts, at module level and inside functions, relative and absolute (``import attnlab.x``, ``from .x import
y``, ``from .. import x``, ``importlib.import_module("attnlab.x")`` with a literal name); only imports under
``if TYPE_CHECKING:`` are exempt, because they never run (they exist for type checkers and editors).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "attnlab"
README = ROOT / "README.md"


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` (both dotted module names) in ``file`` at ``line``; ``where`` says how."""

    source: str
    target: str
    file: str
    line: int
    where: str  # "module level" or "in function f"

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.file}:{self.line}, {self.where})"


def modules(src: Path = SRC) -> dict[str, Path]:
    """Every module of the package: dotted name -> file (``attnlab.kernels`` for ``kernels/__init__.py``)."""
    found = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", "")
    return name.endswith("TYPE_CHECKING")


def _owner(mods: dict[str, Path], name: str) -> str | None:
    """The module ``name`` is or lives in (``attnlab.kernels.flash_attention`` -> ``attnlab.kernels``)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports(mods: dict[str, Path]) -> list[Edge]:
    """Every import of one attnlab module by another, with where it is (TYPE_CHECKING blocks left out)."""
    edges = []
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        rel = path.relative_to(path.parents[len(mod.split(".")) - (path.name != "__init__.py")]).as_posix()

        def visit(node: ast.AST, where: str, mod: str = mod, package: str = package, rel: str = rel) -> None:
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                for child in node.orelse:
                    visit(child, where)
                return
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                where = f"in function {node.name}"
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    start = ".".join(base + ([node.module] if node.module else []))
                else:
                    start = node.module or ""
                # ``from x import y``: y is a submodule, or a name defined in x
                targets = [f"{start}.{a.name}" if f"{start}.{a.name}" in mods else start for a in node.names]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == (
                "import_module"
            ):
                if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                    name = node.args[0].value
                    if name.startswith("."):  # import_module(".x", __package__)
                        name = package + name
                    targets = [name]
            for target in targets:
                owner = _owner(mods, target) if target.split(".")[0] == "attnlab" else None
                if owner is not None and owner != mod:
                    edges.append(Edge(mod, owner, rel, getattr(node, "lineno", 0), where))
            for child in ast.iter_child_nodes(node):
                visit(child, where)

        visit(tree, "module level")
    return edges


def layers_from_readme() -> list[tuple[str, tuple[str, ...]]]:
    """The README's layout table, top layer first: ``[(layer name, (unit, ...)), ...]``.

    A unit is a top-level module or subpackage of attnlab (``core``, ``cli``, ...); ``__init__`` is the package's
    own ``__init__.py``.
    """
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"^\| *\d+\.", line)]
    table = []
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        table.append((cells[0], tuple(re.findall(r"`([\w.]+)/?`", cells[1]))))
    return table


def unit_of(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def test_the_readme_layout_names_every_module_once():
    table = layers_from_readme()
    assert len(table) >= 5, table
    named = [u for _, units in table for u in units]
    assert len(named) == len(set(named)), f"named twice: {sorted({u for u in named if named.count(u) > 1})}"
    present = {unit_of(m) for m in modules()}
    assert present - set(named) == set(), f"in src/attnlab but not in the README's layout: {present - set(named)}"
    assert set(named) - present == set(), f"in the README's layout but not in src/attnlab: {set(named) - present}"


def test_no_import_cycle():
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    at: dict[tuple[str, str], Edge] = {}
    for e in imports(mods):
        graph[e.source].add(e.target)
        at.setdefault((e.source, e.target), e)
    # Tarjan's strongly connected components; any component of two or more modules holds a cycle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    components = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    shown = []
    for comp in components:
        shown.append("circle of " + ", ".join(comp) + ":")
        shown += [f"    {at[(a, b)]}" for a in comp for b in sorted(graph[a]) if b in comp]
    assert not components, "import cycles:\n" + "\n".join(shown)


def test_no_import_from_a_lower_layer_to_a_higher_one():
    table = layers_from_readme()
    rank = {unit: i for i, (_, units) in enumerate(table) for unit in units}  # 0 = the top layer
    name = {unit: layer for layer, units in table for unit in units}
    upward = []
    for e in imports(modules()):
        a, b = unit_of(e.source), unit_of(e.target)
        if rank[b] < rank[a]:
            upward.append(f"{e}: layer {name[a]!r} imports layer {name[b]!r}")
    assert not upward, "imports against the layer order (README, ## Layout):\n" + "\n".join(upward)


def test_the_walker_sees_every_kind_of_import(tmp_path):
    """The graph is only as good as the walker: module level, in functions, relative, absolute, import_module, and
    TYPE_CHECKING left out."""
    pkg = tmp_path / "attnlab"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\n")
    (pkg / "a.py").write_text("import attnlab.b\n\ndef f():\n    from .sub import d\n")
    (pkg / "b.py").write_text("def g():\n    import importlib\n    importlib.import_module('attnlab.c')\n")
    (pkg / "c.py").write_text("from attnlab.sub.d import X\n")
    (pkg / "sub" / "__init__.py").write_text("from .. import a\n")
    (pkg / "sub" / "d.py").write_text("X = 1\n")
    mods = modules(pkg)
    got = {(e.source, e.target, e.where) for e in imports(mods)}
    assert got == {
        ("attnlab.a", "attnlab.b", "module level"),
        ("attnlab.a", "attnlab.sub.d", "in function f"),
        ("attnlab.b", "attnlab.c", "in function g"),
        ("attnlab.c", "attnlab.sub.d", "module level"),
        ("attnlab.sub", "attnlab.a", "module level"),
    }
