#!/usr/bin/env bash
# plancache-offline-audit: verify every plan in a store (or a directory) against the trusted
# keys, once: a table on stdout and, optionally, the JSON report in a file; non-zero if any
# plan is invalid, unsigned or unreadable, if there are no plans, or if the audit cannot run.
#
#   plancache-offline-audit [URL]           (default: $PLANCACHE_URL)
#
#   PLANCACHE_TRUSTED_KEYS     trusted-keys file or directory (required)
#   AUDIT_JSON                 also write the JSON report (schema plancache.report/v1) to this file. It is
#                              replaced atomically, and by a failure report ("ok": false, "error") when the
#                              audit cannot run, so a stale success never survives
#   PLANCACHE_STORAGE_OPTIONS  fsspec options, read by plancache itself: a JSON object or KEY=VALUE pairs,
#                              e.g. "endpoint_url=http://minio:9000"
#   PLANCACHE                  the plancache command (default: this installation's)
#
# Exit status: 0 every plan valid; 1 some plan is not, or there are none; 2 configuration or store
# error (a bucket or directory that does not exist, unreadable keys, an unreachable store).
set -uo pipefail

case "${1:-}" in -h|--help) sed -n '2,/^set /p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;; esac
target="${1:-${PLANCACHE_URL:-}}"
[ -n "$target" ] || { echo "offline-audit: give a store URL or set PLANCACHE_URL" >&2; exit 2; }
: "${PLANCACHE_TRUSTED_KEYS:?set PLANCACHE_TRUSTED_KEYS to the trusted-keys file}"
export PLANCACHE_TRUSTED_KEYS
read -r -a PLANCACHE_CMD <<< "${PLANCACHE:-plancache}"

report=()
tmp=""
if [ -n "${AUDIT_JSON:-}" ]; then
    tmp="$(dirname "$AUDIT_JSON")/.$(basename "$AUDIT_JSON").$$.tmp"
    rm -f "$tmp"
    report=(--report "$tmp")
fi
"${PLANCACHE_CMD[@]}" verify "${report[@]}" "$target"
status=$?
if [ -n "$tmp" ]; then
    if [ ! -s "$tmp" ]; then  # plancache could not even start: still never leave a stale report
        printf '{"command": "verify", "error": {"detail": "plancache exited %s before writing a report", "reason": "internal-error"}, "location": "%s", "ok": false, "plans": [], "schema": "plancache.report/v1"}\n' \
            "$status" "$(printf '%s' "$target" | sed 's/["\\]/\\&/g')" > "$tmp"
        [ "$status" -lt 2 ] && status=2  # no report: the audit did not run
    fi
    mv -f "$tmp" "$AUDIT_JSON"
fi
case "$status" in
    0) echo "offline-audit: every plan in $target is valid" >&2 ;;
    1) echo "offline-audit: FAILED: some plan in $target is invalid or unsigned, or there are none" >&2 ;;
    *) echo "offline-audit: ERROR: could not audit $target" >&2 ;;
esac
exit "$status"
