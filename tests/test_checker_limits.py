"""The checker's size limits (issue 20 §1): no class over 400 lines, no function over 80, one session and no
mirrored gradient hierarchy, no private name imported across its modules. Read from the AST of
src/attnlab/checker, nothing imported."""

from __future__ import annotations

import ast
from pathlib import Path

CHECKER = Path(__file__).resolve().parents[1] / "src" / "attnlab" / "checker"
MAX_CLASS, MAX_FUNCTION = 400, 80


def _trees() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in sorted(CHECKER.rglob("*.py"))}


def _span(node: ast.AST) -> int:
    start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])  # type: ignore[attr-defined]
    return node.end_lineno - start + 1  # type: ignore[attr-defined]


def test_no_class_over_400_lines_and_no_function_over_80():
    too_long = []
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            limit = MAX_CLASS if isinstance(node, ast.ClassDef) else MAX_FUNCTION
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and _span(node) > limit:
                too_long.append(f"{path.relative_to(CHECKER)}:{node.lineno} {node.name}: {_span(node)} > {limit}")
    assert not too_long, "\n".join(too_long)


def test_one_session_and_no_mirrored_gradient_classes():
    classes = {n.name for tree in _trees().values() for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    assert "Session" in classes
    assert not {"Battery", "GradBattery", "GradRunner", "GradRequest"} & classes


def test_no_private_name_is_imported_across_checker_modules():
    found = []
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level and (node.module or "") != "":
                found += [f"{path.relative_to(CHECKER)}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert not found, found
