#!/usr/bin/env bash
# plancache-spot-boot: pull the plans this node needs from the store, verified, into vLLM's
# plan directory, within a time budget -- run it before starting vLLM (an init container).
#
#   plancache-spot-boot [FINGERPRINT ...]   (or PLANCACHE_FINGERPRINTS="fp1 fp2"; none: the whole store)
#
#   PLANCACHE_URL              store URL (required; unset: one line, exit 0, vLLM profiles)
#   PLANCACHE_TRUSTED_KEYS     trusted-keys file or directory baked into the image (required; likewise)
#   PLAN_DIR                   destination (default: vLLM's plan directory, $VLLM_CACHE_ROOT/startup_plan)
#   PLANCACHE_TIMEOUT          end-to-end budget in seconds (default: `plancache pull --boot`'s, 3 s for
#                              fingerprints, 10 s for the whole store)
#   PLANCACHE_STORAGE_OPTIONS  fsspec options, read by plancache itself: a JSON object or KEY=VALUE pairs,
#                              e.g. "endpoint_url=http://minio:9000"
#   PLANCACHE_IMAGE            with an oci:// store: read only the plans attached to this image (TAG,
#                              @sha256:…, or HOST/REPO:TAG in the store's repository: `--subject`)
#   PLANCACHE_STRICT           1: exit with plancache's status; default: always exit 0, because a
#                              missing or rejected plan only means vLLM profiles as usual
#   PLANCACHE                  the plancache command (default: this installation's)
#
# Messages tell a miss (exit 1: a plan absent or rejected; vLLM profiles for it) from a
# configuration error (exit 2: a bucket that does not exist, unreadable keys, an unreachable
# store; every node fails the same way until someone fixes it).
set -uo pipefail

case "${1:-}" in -h|--help) sed -n '2,/^set /p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;; esac
for name in PLANCACHE_URL PLANCACHE_TRUSTED_KEYS; do
    if [ -z "${!name:-}" ]; then  # never block the boot (the init container) for it, unless strict
        echo "spot-boot: $name is not set: no plan pulled; vLLM will profile" >&2
        [ "${PLANCACHE_STRICT:-0}" = "1" ] && exit 2
        exit 0
    fi
done
export PLANCACHE_TRUSTED_KEYS
read -r -a PLANCACHE_CMD <<< "${PLANCACHE:-plancache}"

args=()
for fp in "$@" ${PLANCACHE_FINGERPRINTS:-}; do args+=(--fingerprint "$fp"); done
[ -n "${PLANCACHE_TIMEOUT:-}" ] && args+=(--timeout "$PLANCACHE_TIMEOUT")
dir=()
[ -n "${PLAN_DIR:-}" ] && dir=("$PLAN_DIR")

[ -n "${PLANCACHE_IMAGE:-}" ] && args+=(--subject "$PLANCACHE_IMAGE")
"${PLANCACHE_CMD[@]}" pull --boot "${args[@]}" "$PLANCACHE_URL" "${dir[@]}"
status=$?
case "$status" in
    0) ;;
    1) echo "spot-boot: plancache pull exited 1: a plan is missing or was rejected; vLLM will profile for the plans it lacks" >&2 ;;
    *) echo "spot-boot: plancache pull exited $status: configuration error (see the line above); vLLM will profile, and so will every node set up like this one until it is fixed" >&2 ;;
esac
if [ "${PLANCACHE_STRICT:-0}" = "1" ]; then
    exit "$status"
fi
exit 0
