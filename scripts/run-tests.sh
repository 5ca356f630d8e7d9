#!/usr/bin/env bash
# Bootstrap the test venv (no-op when up to date), then run pytest in it from the repo root.
# Arguments are passed to pytest after the defaults, so they win (`-n 0` runs in one process);
# pytest's exit code is returned unchanged.
#
# Defaults: two pytest-xdist workers (PLANCACHE_TEST_WORKERS=2), `--dist loadfile` (a file's tests
# stay on one worker, so every module-scoped fixture, a vLLM boot among them, runs once), and
# `--no-loadscope-reorder`, so that xdist hands files out in conftest's order: the three files that
# boot vLLM for minutes first (tests/conftest.py, LONGEST), then the slow ones (SLOW), the quick
# ones last. Two, on two cores: a third worker beside the vLLM fixtures only slows them (the whole
# suite took 13 min on three, about 10 on two).
# Budgets, retries and backoff are tested on a fake clock and the realtime tier allows generous
# slack, so nothing here schedules around a busy CPU (docs/test-suite.md).
# PLANCACHE_TEST_WORKERS=0 runs one process.
# `--durations=25`: every run's log ends with its 25 slowest tests (setup, call and teardown each),
# so a CI log shows where the suite's time went; an argument `--durations=N` after it wins.
# CI runs the default: every tier.
# Tiers: `-m unit` runs the quick tier alone (under a minute; PLANCACHE_NO_ENGINE=1 spares a fresh
# checkout the engine venv it never uses); any `-m` that names tiers only leaves the files that
# cannot match uncollected (tests/conftest.py, docs/test-suite.md#tiers).
# The static gate (scripts/static-gate.sh: ruff check, ruff format --check, mypy) runs after the
# bootstrap and before pytest, whatever the arguments: a finding stops the run there, with the
# gate's own FAILED line and exit code, before any test. PLANCACHE_SKIP_GATE=1 skips it for a
# quick local rerun (CI never sets it: .ci/run runs the gate).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
VENV="${PLANCACHE_VENV:-$REPO_ROOT/.venv}"
export PLANCACHE_VENV="$VENV"
bash "$REPO_ROOT/scripts/bootstrap-test-env.sh"
if [ "${PLANCACHE_SKIP_GATE:-}" = 1 ]; then
    echo "static gate: skipped (PLANCACHE_SKIP_GATE=1)" >&2
else
    gate=0
    bash "$REPO_ROOT/scripts/static-gate.sh" || gate=$?
    if [ "$gate" != 0 ]; then
        echo "run-tests: stopped before pytest: the static gate failed (exit $gate);" \
            "PLANCACHE_SKIP_GATE=1 skips it for a local rerun" >&2
        exit "$gate"
    fi
fi
WORKERS="${PLANCACHE_TEST_WORKERS:-2}"
if [ "$WORKERS" = "0" ]; then
    exec "$VENV/bin/python" -m pytest --durations=25 "$@"
fi
exec "$VENV/bin/python" -m pytest -n "$WORKERS" --dist loadfile --no-loadscope-reorder \
    --durations=25 "$@"
