#!/usr/bin/env bash
# Build the API reference (pdoc, from the docstrings) into docs/api/, warnings as errors. README command 2 runs it;
# open docs/api/index.html afterwards. Needs the dev extra (pip install -c constraints.txt -e ".[dev]").
set -euo pipefail
cd "$(dirname "$0")/.."
python scripts/build_docs.py "$@"
