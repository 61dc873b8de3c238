#!/usr/bin/env bash
# The habits .ci/run checks: ruff lint, ruff format and mypy, configured in pyproject.toml (the plugins' pyproject
# files extend it). Usage: scripts/lint.sh [--fix]  (--fix applies ruff's safe fixes and formats, then checks).
# The same checks run before each commit once `.venv/bin/pre-commit install` is done (.pre-commit-config.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
if [ "${1:-}" = "--fix" ]; then
  .venv/bin/ruff check --fix -q .
  .venv/bin/ruff format -q .
fi
echo "[lint] ruff check"
.venv/bin/ruff check .
echo "[lint] ruff format --check"
.venv/bin/ruff format --check -q .
echo "[lint] mypy"
.venv/bin/mypy
