#!/usr/bin/env bash
# The whole test suite: set-up (venv + deps from pyproject.toml), lint, types, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check proxy loadtests tests
.venv/bin/mypy proxy loadtests
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
