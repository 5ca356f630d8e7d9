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
#   PLANCACHE_TIMEOUT          budget in seconds of each store operation (verify's `--timeout`; default:
#                              its own, 120 s)
#   PLANCACHE_IMAGE            with an oci:// store: read only the plans attached to this image (TAG,
#                              @sha256:…, or HOST/REPO:TAG in the store's repository: `--subject`)
#   PLANCACHE                  the plancache command (default: this installation's)
#
# Exit status: 0 every plan valid; 1 some plan is not, or there are none; 2 configuration or store
# error (a bucket or directory that does not exist, unreadable keys, an unreachable store).
set -uo pipefail

case "${1:-}" in -h|--help) sed -n '2,/^set /p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;; esac
target="${1:-${PLANCACHE_URL:-}}"
export PLANCACHE_TRUSTED_KEYS  # unset: plancache verify says so (exit 2) and writes the failure report
read -r -a PLANCACHE_CMD <<< "${PLANCACHE:-plancache}"

report=()
tmp=""
if [ -n "${AUDIT_JSON:-}" ]; then
    if [ -L "$AUDIT_JSON" ] || { [ -e "$AUDIT_JSON" ] && [ ! -f "$AUDIT_JSON" ]; }; then
        echo "offline-audit: AUDIT_JSON=$AUDIT_JSON exists and is not a regular file: refusing to replace it" >&2
        exit 2
    fi
    tmp="$(mktemp "$(dirname "$AUDIT_JSON")/.$(basename "$AUDIT_JSON").XXXXXXXX")" || exit 2
    trap 'rm -f "$tmp"' EXIT
    report=(--report "$tmp")
fi
if [ -n "$target" ]; then
    subject=()
    [ -n "${PLANCACHE_IMAGE:-}" ] && subject=(--subject "$PLANCACHE_IMAGE")
    budget=()  # the CLI's --timeout, not read from the environment by plancache itself
    [ -n "${PLANCACHE_TIMEOUT:-}" ] && budget=(--timeout "$PLANCACHE_TIMEOUT")
    "${PLANCACHE_CMD[@]}" verify "${report[@]}" "${budget[@]}" "${subject[@]}" "$target"
    status=$?
    why="plancache exited $status before writing a report"
else
    echo "offline-audit: give a store URL or set PLANCACHE_URL" >&2
    status=2
    why="no store URL: give one or set PLANCACHE_URL"
fi
if [ -n "$tmp" ]; then
    if [ ! -s "$tmp" ]; then  # plancache did not run or could not start: still never leave a stale report
        printf '{"command": "verify", "error": {"detail": "%s", "reason": "%s"}, "location": "", "ok": false, "plans": [], "schema": "plancache.report/v1"}\n' \
            "$why" "$([ -n "$target" ] && echo internal-error || echo config-error)" > "$tmp"
        [ "$status" -lt 2 ] && status=2  # no report: the audit did not run
    fi
    mv -fT "$tmp" "$AUDIT_JSON"
fi
case "$status" in
    0) echo "offline-audit: every plan is valid" >&2 ;;
    1) echo "offline-audit: FAILED: some plan is invalid or unsigned, or there are none" >&2 ;;
    *) echo "offline-audit: ERROR: the audit could not run (see above)" >&2 ;;
esac
exit "$status"
