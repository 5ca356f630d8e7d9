#!/usr/bin/env bash
# The static gate: ruff's lint, ruff's format check and mypy, from the test venv, on the checkout.
#
#   bash scripts/static-gate.sh      the gate alone (a few seconds; the venv must be bootstrapped)
#
# scripts/run-tests.sh runs it before pytest (so the README's test command and .ci/run do), and a
# failure there stops the run before any test; PLANCACHE_SKIP_GATE=1 skips it for a quick local
# rerun. All three steps run, so one pass shows every finding; the exit code is the first failing
# step's. The rules and their reasons: pyproject.toml ([tool.ruff], [tool.mypy]) and
# docs/adr/0009-a-static-gate.md.
#
# Nothing outside the checkout decides the result: both tools are given pyproject.toml as their
# configuration (no user or site config file is read), ruff keeps no cache, and mypy's cache is
# the checkout's own .mypy_cache/ (git-ignored; a cache only speeds a rerun, and a fresh checkout
# starts without one).
set -uo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
VENV="${PLANCACHE_VENV:-$REPO_ROOT/.venv}"
PATHS=(src tests scripts)

failed=()
first=0
step() {
    local name="$1"
    shift
    "$@"
    local rc=$?
    if [ "$rc" != 0 ]; then
        failed+=("$name")
        if [ "$first" = 0 ]; then first=$rc; fi
    fi
}

for tool in ruff mypy; do
    if [ ! -x "$VENV/bin/$tool" ]; then
        echo "static gate: FAILED: $VENV/bin/$tool is missing (scripts/bootstrap-test-env.sh installs it)" >&2
        exit 2
    fi
done

step "ruff check" "$VENV/bin/ruff" check --config pyproject.toml --no-cache "${PATHS[@]}"
step "ruff format --check" "$VENV/bin/ruff" format --config pyproject.toml --no-cache --check \
    "${PATHS[@]}"
step "mypy" "$VENV/bin/mypy" --config-file pyproject.toml --cache-dir "$REPO_ROOT/.mypy_cache"

if [ "${#failed[@]}" != 0 ]; then
    list="$(printf '%s, ' "${failed[@]}")"
    echo "static gate: FAILED: ${list%, } (findings above; \`bash scripts/static-gate.sh\` reruns the gate alone)" >&2
    exit "$first"
fi
echo "static gate: passed (ruff check, ruff format --check, mypy)"
