#!/usr/bin/env bash
# Bootstrap the test venv (no-op when up to date), then run pytest in it from the repo root.
# Arguments are passed to pytest after the defaults, so they win (`-n 0` runs in one process);
# pytest's exit code is returned unchanged.
#
# Defaults: two pytest-xdist workers (PLANCACHE_TEST_WORKERS=2), `--dist loadfile` (a file's tests
# stay on one worker, so every module-scoped fixture, a vLLM boot among them, runs once), the
# heaviest files scheduled first and the deadline files last (tests/conftest.py).
# PLANCACHE_TEST_WORKERS=0 runs one process. Two, not more, on a 2-core machine: four workers
# beside the vLLM fixtures' own processes made deadline tests (a budget plus a grace) fail on CPU
# starvation; two passed them and fit the suite in 12 minutes, one process takes ~20
# (docs/test-suite.md). CI runs the default. README's "Set up" gives the figures.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
VENV="${PLANCACHE_VENV:-$REPO_ROOT/.venv}"
export PLANCACHE_VENV="$VENV"
bash "$REPO_ROOT/scripts/bootstrap-test-env.sh"
WORKERS="${PLANCACHE_TEST_WORKERS:-2}"
if [ "$WORKERS" = "0" ]; then
    exec "$VENV/bin/python" -m pytest "$@"
fi
exec "$VENV/bin/python" -m pytest -n "$WORKERS" --dist loadfile --no-loadscope-reorder "$@"
