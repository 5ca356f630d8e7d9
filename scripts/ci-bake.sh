#!/usr/bin/env bash
# Thin caller, kept so existing commands work from a checkout: the journey ships with the
# package as `plancache-ci-bake` (src/plancache/journeys/ci-bake.sh, which documents its environment;
# `plancache-ci-bake --help` prints it).
exec bash "$(dirname "${BASH_SOURCE[0]}")/../src/plancache/journeys/ci-bake.sh" "$@"
