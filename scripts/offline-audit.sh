#!/usr/bin/env bash
# Offline audit: verify every plan in a store (or a directory) against the trusted keys, print
# a table, and exit non-zero if any plan is invalid, unsigned or unreadable.
#
#   offline-audit.sh [URL]           (default: $PLANCACHE_URL)
#
#   PLANCACHE_TRUSTED_KEYS     trusted-keys file or directory (required)
#   AUDIT_JSON                 also write the JSON report to this file
#   PLANCACHE_STORAGE_OPTIONS  fsspec options, read by plancache itself: a JSON object or KEY=VALUE pairs,
#                              e.g. "endpoint_url=http://minio:9000"
#   PLANCACHE                  the plancache command (default: plancache)
#
# Exit status: 0 every plan valid; 1 some plan is not; 2 configuration or store error.
set -uo pipefail

target="${1:-${PLANCACHE_URL:-}}"
[ -n "$target" ] || { echo "offline-audit: give a store URL or set PLANCACHE_URL" >&2; exit 2; }
: "${PLANCACHE_TRUSTED_KEYS:?set PLANCACHE_TRUSTED_KEYS to the trusted-keys file}"
export PLANCACHE_TRUSTED_KEYS
read -r -a PLANCACHE_CMD <<< "${PLANCACHE:-plancache}"


"${PLANCACHE_CMD[@]}" verify "$target"
status=$?
if [ -n "${AUDIT_JSON:-}" ] && [ "$status" -ne 2 ]; then
    "${PLANCACHE_CMD[@]}" verify --json "$target" > "$AUDIT_JSON"
fi
case "$status" in
    0) echo "offline-audit: every plan in $target is valid" >&2 ;;
    1) echo "offline-audit: FAILED: some plan in $target is invalid or unsigned" >&2 ;;
    *) echo "offline-audit: ERROR: could not audit $target" >&2 ;;
esac
exit "$status"
