#!/usr/bin/env bash
# The static gate: ruff's lint, ruff's format check and mypy, from the test venv, on the repo.
# scripts/run-tests.sh runs it before pytest (so the README's test command and .ci/run do);
# PLANCACHE_SKIP_GATE=1 skips it there for a quick local rerun. Exit code: the first failure's.
# The rules and their reasons are in pyproject.toml ([tool.ruff], [tool.mypy]); docs/adr/0009.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
VENV="${PLANCACHE_VENV:-$REPO_ROOT/.venv}"
"$VENV/bin/ruff" check --no-cache src tests scripts
"$VENV/bin/ruff" format --no-cache --check --quiet src tests scripts
"$VENV/bin/mypy" --cache-dir "${MYPY_CACHE_DIR:-$REPO_ROOT/.mypy_cache}" --no-error-summary
echo "static gate: ruff check, ruff format, mypy passed"
