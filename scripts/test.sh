#!/usr/bin/env bash
# Every check: set up .venv with the dev extra, then format, lint, types, and the whole test suite.
set -euo pipefail
EXTRAS="[dev]" source "$(dirname "$0")/_venv.sh"
.venv/bin/ruff format --check src tests scripts bench
.venv/bin/ruff check src tests scripts bench
.venv/bin/mypy
.venv/bin/lint-imports
.venv/bin/python scripts/audit.py
.venv/bin/python -m pytest "$@"
