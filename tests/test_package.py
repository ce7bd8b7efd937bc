"""The package itself: the public API, import cost, the CLI demo."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_import_attnlab_loads_the_core_only():
    """A fresh ``import attnlab`` imports the core (NumPy, attnlab.core, masks, errors) and nothing else: the kernels,
    the checker, the lab, models, explanations, plots and every optional library load on first use (PEP 562)."""
    code = (
        "import sys, json, attnlab; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('attnlab', 'torch', 'matplotlib', 'jax', 'rich', 'marimo', 'transformers', 'scipy', 'numba'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    for absent in ("attnlab.checker", "attnlab.lab", "attnlab.models", "attnlab.explain", "attnlab.plot",
                   "attnlab.kernels", "attnlab.distributed", "attnlab.bench", "attnlab.weights_io", "attnlab.cli",
                   "torch", "matplotlib", "jax", "rich", "marimo", "transformers", "scipy", "numba"):  # fmt: skip
        assert not {m for m in loaded if m == absent or m.startswith(absent + ".")}, (absent, sorted(loaded))
    assert {"attnlab.core", "attnlab.masks", "attnlab.errors"} <= loaded
    assert {m.split(".")[1] for m in loaded if m.count(".") >= 1} <= {
        "core", "masks", "errors", "validate", "_arrays", "_signatures"
    }, sorted(loaded)  # fmt: skip


def test_lazy_names_load_on_first_use():
    """Every lazily loaded public name and module is reachable from ``attnlab`` and listed by ``dir(attnlab)``."""
    code = (
        "import attnlab, attnlab.kernels as K, attnlab.checker as C; "
        "print(attnlab.flash_attention is K.flash_attention, attnlab.KVCache is K.KVCache, attnlab.check is C.check, "
        "attnlab.invariants.__name__, attnlab.models.__name__, {'flash_attention', 'kernels', 'check'} <= "
        "set(dir(attnlab)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True", "True", "attnlab.invariants", "attnlab.models", "True"]
    with pytest.raises(AttributeError, match="module 'attnlab' has no attribute 'nope'"):
        attnlab.nope  # noqa: B018 (the attribute access is the test)


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


def test_moved_names_live_in_one_place_only():
    """Weight import/export left the core for attnlab.weights_io, the permutation demo for attnlab.explain (0.2.0: the
    old paths are gone, no shim); ``attnlab.permutation_demo`` is loaded on first use, not by ``import attnlab``."""
    code = (
        "import sys, importlib, attnlab; print('attnlab.explain' in sys.modules); "
        "import attnlab.core.rope as rope; from attnlab.explain import permutation; "
        "print(attnlab.permutation_demo is permutation.permutation_demo, "
        "attnlab.PermutationDemo is permutation.PermutationDemo, hasattr(rope, 'permutation_demo'), "
        "importlib.util.find_spec('attnlab.core.weights_io') is None)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True", "True", "False", "True"]


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
