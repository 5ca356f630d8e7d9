#!/usr/bin/env bash
# Spot boot: pull the plans this node needs from the store, verified, into vLLM's plan
# directory, within a time budget -- run it before starting vLLM.
#
#   spot-boot.sh [FINGERPRINT ...]   (or PLANCACHE_FINGERPRINTS="fp1 fp2"; none: the whole store)
#
#   PLANCACHE_URL            store URL (required)
#   PLANCACHE_TRUSTED_KEYS     trusted-keys file or directory baked into the image (required)
#   PLAN_DIR                   destination (default: vLLM's plan directory, $VLLM_CACHE_ROOT/startup_plan)
#   PLANCACHE_TIMEOUT          end-to-end budget in seconds (default: plancache's, 3 s for fingerprints)
#   PLANCACHE_STORAGE_OPTIONS  fsspec options, read by plancache itself: a JSON object or KEY=VALUE pairs,
#                              e.g. "endpoint_url=http://minio:9000"
#   PLANCACHE_STRICT           1: exit with plancache's status; default: always exit 0, because a
#                              missing or rejected plan only means vLLM profiles as usual
#   PLANCACHE                  the plancache command (default: plancache)
set -uo pipefail

: "${PLANCACHE_URL:?set PLANCACHE_URL to the store URL}"
: "${PLANCACHE_TRUSTED_KEYS:?set PLANCACHE_TRUSTED_KEYS to the trusted-keys file}"
export PLANCACHE_TRUSTED_KEYS
read -r -a PLANCACHE_CMD <<< "${PLANCACHE:-plancache}"

args=()
for fp in "$@" ${PLANCACHE_FINGERPRINTS:-}; do args+=(--fingerprint "$fp"); done
[ -n "${PLANCACHE_TIMEOUT:-}" ] && args+=(--timeout "$PLANCACHE_TIMEOUT")
dir=()
[ -n "${PLAN_DIR:-}" ] && dir=("$PLAN_DIR")

"${PLANCACHE_CMD[@]}" pull "${args[@]}" "$PLANCACHE_URL" "${dir[@]}"
status=$?
if [ "$status" -ne 0 ]; then
    echo "spot-boot: plancache pull exited $status; vLLM will profile for the plans it lacks" >&2
fi
if [ "${PLANCACHE_STRICT:-0}" = "1" ]; then
    exit "$status"
fi
exit 0
