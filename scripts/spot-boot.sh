#!/usr/bin/env bash
# Thin caller, kept so existing commands work from a checkout: the journey ships with the
# package as `plancache-spot-boot` (src/plancache/journeys/spot-boot.sh, which documents its environment;
# `plancache-spot-boot --help` prints it).
exec bash "$(dirname "${BASH_SOURCE[0]}")/../src/plancache/journeys/spot-boot.sh" "$@"
