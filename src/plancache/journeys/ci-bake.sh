#!/usr/bin/env bash
# plancache-ci-bake: sign the plans a profiling boot left (recording the gate's conditions),
# push them to the store, and pull them back, verified, into the directory that goes into
# the image.
#
#   plancache-ci-bake [--replace] [--fact KEY=VALUE ...] [--allow-empty]
#
#   --replace                  re-profiled plans: sign anew where a plan's bytes changed since it was
#                              signed (without it, `plancache sign` refuses them: digest-mismatch)
#   PLANCACHE_URL              store URL, e.g. s3://bucket/plans (required)
#   PLANCACHE_SIGNING_KEY      CI's signing key reference (required): a private key file (keep it in the
#                              CI secret store), env://VAR, pkcs11:…, awskms://…, gcpkms://…, or sigstore
#                              (keyless: the job's OIDC identity; docs/keys.md has GitHub and GitLab jobs)
#   IMAGE_PLAN_DIR             where verified plans for the image go (required), e.g.
#                              build/root/.cache/vllm/startup_plan
#   PLANCACHE_FACTS            facts to sign, space-separated KEY=VALUE pairs (quote a pair that holds
#                              spaces), e.g. 'gpu_memory_utilization=0.9 device_total_memory=85899345920
#                              "device_name=NVIDIA H100 80GB HBM3"'. gpu_memory_utilization, device_name
#                              and device_total_memory are the gate's conditions, compared with the
#                              worker's exact values (device_name as torch.cuda.get_device_name says):
#                              a plan signed without them applies at any setting, and `plancache sign`
#                              warns. --fact KEY=VALUE arguments add to them
#   PLAN_DIR                   plans the profiling boot wrote (default: vLLM's plan directory,
#                              $VLLM_CACHE_ROOT/startup_plan)
#   PLANCACHE_TRUSTED_KEYS     keys the verify and pull check against (default: the signing key's own public
#                              key, from `plancache pubkey`; for sigstore, the job's own identity line, under
#                              PLANCACHE_SIGSTORE_TRUSTED_ROOT, else Sigstore's public-good root)
#   PLANCACHE_EXPIRES_IN       lifetime of the signatures, e.g. 30d (default: none)
#   PLANCACHE_SIGN_COLD        1: sign plans whose profiling boot compiled cold. By default a plan the plugin
#                              saw measured by a cold-compile boot (plancache-evidence-<fp>.json beside it)
#                              is refused (cold-compile: vLLM records less KV cache then); boot vLLM once
#                              more (it profiles warm) and bake again. The evidence is signed with the plan
#   PLANCACHE_STORAGE_OPTIONS  fsspec options, read by plancache itself: a JSON object or KEY=VALUE pairs,
#                              e.g. "endpoint_url=http://minio:9000"
#   PLANCACHE_TIMEOUT          budget in seconds of each store operation of the push and the pull (their
#                              `--timeout`; default: theirs, 120 s) and of each HSM/KMS call (default 3 s)
#   PLANCACHE                  the plancache command (default: this installation's)
#   PLANCACHE_IMAGE            with an oci:// PLANCACHE_URL: the image the plans are baked for (TAG,
#                              @sha256:…, or HOST/REPO:TAG in the store's repository); the push
#                              attaches them to it (`push --subject`), so `plancache ls --subject` and
#                              `oras discover` list them with the image
#
# The signed plans are verified before the push: no plan to bake is a failure (exit 1; a profiling
# boot that wrote nothing is a broken bake), unless --allow-empty.
#
# Exit status: plancache's (0 ok, 1 a plan refused or rejected, or none, 2 configuration or store error).
set -euo pipefail

case "${1:-}" in -h|--help) sed -n '2,/^set /p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;; esac
facts=()
replace=()
allow_empty=()
if [ -n "${PLANCACHE_FACTS:-}" ]; then  # xargs splits on blanks but honours quotes
    while IFS= read -r fact; do facts+=(--fact "$fact"); done < <(printf '%s' "$PLANCACHE_FACTS" | xargs -n1 printf '%s\n')
fi
while [ $# -gt 0 ]; do
    case "$1" in
        --fact) [ $# -ge 2 ] || { echo "ci-bake: --fact needs KEY=VALUE" >&2; exit 2; }; facts+=(--fact "$2"); shift 2 ;;
        --fact=*) facts+=(--fact "${1#--fact=}"); shift ;;
        --replace) replace=(--replace); shift ;;
        --allow-empty) allow_empty=(--allow-empty); shift ;;
        *) echo "ci-bake: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

: "${PLANCACHE_URL:?set PLANCACHE_URL to the store URL}"
: "${PLANCACHE_SIGNING_KEY:?set PLANCACHE_SIGNING_KEY to the CI signing key reference}"
: "${IMAGE_PLAN_DIR:?set IMAGE_PLAN_DIR to the plan directory of the image}"
read -r -a PLANCACHE_CMD <<< "${PLANCACHE:-plancache}"
if [ -z "${PLANCACHE_TRUSTED_KEYS:-}" ]; then  # any key reference: its public key, as plancache sees it
    own_key="$(mktemp)"
    trap 'rm -f "$own_key"' EXIT
    "${PLANCACHE_CMD[@]}" pubkey "$PLANCACHE_SIGNING_KEY" > "$own_key"
    PLANCACHE_TRUSTED_KEYS="$own_key"
fi
export PLANCACHE_TRUSTED_KEYS

dir=()
[ -n "${PLAN_DIR:-}" ] && dir=("$PLAN_DIR")
budget=()  # the CLI's --timeout, not read from the environment by plancache itself
[ -n "${PLANCACHE_TIMEOUT:-}" ] && budget=(--timeout "$PLANCACHE_TIMEOUT")
expires=()
[ -n "${PLANCACHE_EXPIRES_IN:-}" ] && expires=(--expires-in "$PLANCACHE_EXPIRES_IN")
[ "${PLANCACHE_SIGN_COLD:-}" = 1 ] && expires+=(--sign-cold)

echo "ci-bake: signing plans in ${PLAN_DIR:-the vLLM plan directory}" >&2
"${PLANCACHE_CMD[@]}" sign --key "$PLANCACHE_SIGNING_KEY" "${replace[@]}" "${expires[@]}" "${facts[@]}" "${dir[@]}"
echo "ci-bake: verifying the signed plans" >&2
"${PLANCACHE_CMD[@]}" verify "${allow_empty[@]}" "${dir[@]}"
echo "ci-bake: pushing to the store (PLANCACHE_URL)" >&2
subject=()
[ -n "${PLANCACHE_IMAGE:-}" ] && subject=(--subject "$PLANCACHE_IMAGE")
"${PLANCACHE_CMD[@]}" push "${budget[@]}" "${subject[@]}" "${dir[@]}" "$PLANCACHE_URL"
echo "ci-bake: pulling verified plans into $IMAGE_PLAN_DIR" >&2
mkdir -p "$IMAGE_PLAN_DIR"
"${PLANCACHE_CMD[@]}" pull "${budget[@]}" "$PLANCACHE_URL" "$IMAGE_PLAN_DIR"
