#!/usr/bin/env bash
# Bootstrap the test venv (no-op when up to date), then run pytest in it from the repo root.
# Arguments are passed to pytest after the defaults, so they win (`-n 0` runs in one process);
# pytest's exit code is returned unchanged.
#
# Defaults: pytest-xdist with PLANCACHE_TEST_WORKERS workers (default 4 on any machine: the
# suite is a few CPU-heavy vLLM fixtures beside many tests that mostly wait on deadlines, black
# holes and servers, which then run beside them), `--dist loadfile` (a file's tests stay on one
# worker, so every module-scoped fixture, a vLLM boot among them, runs once), the heaviest files
# scheduled first (tests/conftest.py). README's "Set up" gives the measured figure.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
VENV="${PLANCACHE_VENV:-$REPO_ROOT/.venv}"
export PLANCACHE_VENV="$VENV"
bash "$REPO_ROOT/scripts/bootstrap-test-env.sh"
exec "$VENV/bin/python" -m pytest -n "${PLANCACHE_TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder "$@"
