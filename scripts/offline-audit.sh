#!/usr/bin/env bash
# Thin caller, kept so existing commands work from a checkout: the journey ships with the
# package as `plancache-offline-audit` (src/plancache/journeys/offline-audit.sh, which documents its environment;
# `plancache-offline-audit --help` prints it).
exec bash "$(dirname "${BASH_SOURCE[0]}")/../src/plancache/journeys/offline-audit.sh" "$@"
