#!/usr/bin/env bash
# Install attnlab with its test dependencies and run the whole suite (lint + tests). README command 2; CI runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
python -m ruff check .
python -m ruff format --check .
bash scripts/build-docs.sh
python -m mypy  # the type checker over src/attnlab ([tool.mypy] in pyproject.toml; docs/typing.md)
python -m pytest -q
python benchmarks/bench_import.py --runs 7   # import attnlab vs import numpy (prints, asserts nothing)
