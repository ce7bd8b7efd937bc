"""The package itself: the public API, import cost, the CLI demo."""

import ast
import subprocess
import sys
from pathlib import Path

import attnlab
from attnlab.cli import main

SRC = Path(attnlab.__file__).parent


def test_all_is_sorted_and_complete():
    assert list(attnlab.__all__) == sorted(attnlab.__all__)
    tree = ast.parse((SRC / "__init__.py").read_text())
    imported = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            imported |= {a.asname or a.name for a in node.names}
    public = {n for n in imported if not n.startswith("_")}
    assert public <= set(attnlab.__all__), public - set(attnlab.__all__)
    for name in attnlab.__all__:
        assert hasattr(attnlab, name), name


def test_import_is_light():
    code = (
        "import sys, attnlab, attnlab.cli, attnlab.masks, attnlab.invariants; "
        "heavy = {'matplotlib', 'torch', 'rich', 'transformers', 'marimo', 'jax', 'array_api_compat', 'scipy'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_py_typed_ships():
    assert (SRC / "py.typed").exists()


def test_demo_prints_the_2x2_example(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "weights = softmax(logits) per row =\n[[0.6698 0.3302]\n [0.3302 0.6698]]" in out
    assert "output = weights @ V =\n[[ 6.6976  6.6048]\n [ 3.3024 13.3952]]" in out
    assert "mask (■ may attend, ⬚ blocked) =\n■ ⬚\n■ ■" in out
    assert "[[1.     0.    ]\n [0.3302 0.6698]]" in out
    assert "[[10.      0.    ]\n [ 3.3024 13.3952]]" in out


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


def test_unknown_command_is_a_usage_error(capsys):
    assert main(["nope"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "attnlab", "demo"], capture_output=True, text=True, check=True)
    assert "0.6698" in out.stdout


def test_moved_modules_keep_their_public_names():
    """Weight import/export left the core for attnlab.weights_io, the permutation demo for attnlab.explain; the old
    names reach the same objects (``attnlab.permutation_demo`` is loaded on first use, not by ``import attnlab``)."""
    code = (
        "import sys, attnlab; print('attnlab.explain' in sys.modules); "
        "from attnlab.core import weights_io; import attnlab.core.rope as rope; "
        "from attnlab.explain import permutation; "
        "print(weights_io.to_bert is attnlab.weights_io.to_bert, "
        "attnlab.permutation_demo is permutation.permutation_demo, "
        "rope.permutation_demo is permutation.permutation_demo, attnlab.PermutationDemo is permutation.PermutationDemo)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True", "True", "True", "True"]


ROOT = Path(__file__).resolve().parents[1]


def test_the_installed_version_is_the_package_version():
    """The version is written once (``attnlab.__version__``); the installed metadata reads it from there. (An editable
    install made before the version changed shows the old one: ``pip install -c constraints.txt -e .`` again.)"""
    from importlib.metadata import version

    assert attnlab.__version__ == "0.2.0"
    installed = version("attnlab")
    assert installed == attnlab.__version__, (
        f"the installed metadata says {installed}, attnlab.__version__ is {attnlab.__version__}: the install is "
        "stale (made before the version changed); run pip install -c constraints.txt -e . again"
    )


def test_metadata_built_from_pyproject_has_the_version_and_the_licence_without_warnings(tmp_path):
    """What ``pip install .`` / ``python -m build`` write, built here offline with every warning an error: the version
    comes from ``attnlab.__version__`` (single-sourced), the licence is the SPDX expression and LICENSE ships."""
    code = "import sys; from setuptools import build_meta as b; print(b.prepare_metadata_for_build_wheel(sys.argv[1]))"
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", code, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Deprecat" not in out.stdout + out.stderr
    dist_info = tmp_path / out.stdout.strip().splitlines()[-1]
    meta = (dist_info / "METADATA").read_text()
    assert f"\nVersion: {attnlab.__version__}\n" in meta
    assert "\nLicense-Expression: MIT\n" in meta
    assert "\nLicense-File: LICENSE\n" in meta
    shipped = next(dist_info.rglob("LICENSE")).read_text()
    assert shipped.startswith("MIT License") and "Copyright (c) 2026 attnlab contributors" in shipped
    pyproject = (ROOT / "pyproject.toml").read_text()
    project = pyproject.split("[tool.setuptools.dynamic]")[0]
    assert 'dynamic = ["version"]' in project and "\nversion = " not in project


def test_cli_version_is_the_package_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"attnlab {attnlab.__version__}"
