#!/usr/bin/env bash
# Bootstrap the test venv (no-op when up to date), then run pytest in it from the repo root.
# Arguments are passed to pytest; pytest's exit code is returned unchanged.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
VENV="${PLANCACHE_VENV:-$REPO_ROOT/.venv}"
export PLANCACHE_VENV="$VENV"
bash "$REPO_ROOT/scripts/bootstrap-test-env.sh"
exec "$VENV/bin/python" -m pytest "$@"
