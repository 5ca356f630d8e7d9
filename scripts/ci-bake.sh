#!/usr/bin/env bash
# CI bake: sign the plans a profiling boot left, push them to the store, and pull them back,
# verified, into the directory that goes into the image.
#
#   PLANCACHE_URL            store URL, e.g. s3://bucket/plans (required)
#   PLANCACHE_SIGNING_KEY      CI's private key file (required; keep it in the CI secret store)
#   IMAGE_PLAN_DIR             where verified plans for the image go (required), e.g.
#                              build/root/.cache/vllm/startup_plan
#   PLAN_DIR                   plans the profiling boot wrote (default: vLLM's plan directory,
#                              $VLLM_CACHE_ROOT/startup_plan)
#   PLANCACHE_TRUSTED_KEYS     keys the pull checks against (default: $PLANCACHE_SIGNING_KEY.pub)
#   PLANCACHE_EXPIRES_IN       lifetime of the signatures, e.g. 30d (default: none)
#   PLANCACHE_STORAGE_OPTIONS  fsspec options, read by plancache itself: a JSON object or KEY=VALUE pairs,
#                              e.g. "endpoint_url=http://minio:9000"
#   PLANCACHE                  the plancache command (default: plancache)
#
# Exit status: plancache's (0 ok, 1 a plan refused or rejected, 2 configuration or store error).
set -euo pipefail

: "${PLANCACHE_URL:?set PLANCACHE_URL to the store URL}"
: "${PLANCACHE_SIGNING_KEY:?set PLANCACHE_SIGNING_KEY to the CI private key file}"
: "${IMAGE_PLAN_DIR:?set IMAGE_PLAN_DIR to the plan directory of the image}"
read -r -a PLANCACHE_CMD <<< "${PLANCACHE:-plancache}"
export PLANCACHE_TRUSTED_KEYS="${PLANCACHE_TRUSTED_KEYS:-$PLANCACHE_SIGNING_KEY.pub}"

dir=()
[ -n "${PLAN_DIR:-}" ] && dir=("$PLAN_DIR")
expires=()
[ -n "${PLANCACHE_EXPIRES_IN:-}" ] && expires=(--expires-in "$PLANCACHE_EXPIRES_IN")

echo "ci-bake: signing plans in ${PLAN_DIR:-the vLLM plan directory}" >&2
"${PLANCACHE_CMD[@]}" sign --key "$PLANCACHE_SIGNING_KEY" "${expires[@]}" "${dir[@]}"
echo "ci-bake: pushing to $PLANCACHE_URL" >&2
"${PLANCACHE_CMD[@]}" push "${dir[@]}" "$PLANCACHE_URL"
echo "ci-bake: pulling verified plans into $IMAGE_PLAN_DIR" >&2
mkdir -p "$IMAGE_PLAN_DIR"
"${PLANCACHE_CMD[@]}" pull "$PLANCACHE_URL" "$IMAGE_PLAN_DIR"
