"""``plancache doctor``: would a vLLM worker on this machine apply a plan, and if not, why.

The plugin's set-up is otherwise visible only in a booting worker's log. Doctor reads the
same things the worker reads, the same way (entry points through importlib.metadata, the
environment through the plugin's own parser, keys through the same policy builder, vLLM's
plan directory resolved as vLLM resolves it) and never imports vLLM. Each finding is one
check: ``ok``, ``warn`` (works, but probably not as meant), ``fail`` (a worker here will not
apply plans) or ``skip``. Exit 0 when nothing fails, 1 otherwise.

This module runs the checks in order and prints them; the checks of the set-up are in
:mod:`.setup_checks`, the reading of past boots in :mod:`.recorded_boots`.
"""

from __future__ import annotations

import argparse
import os
import sys

from ...vllm_plugin.config import parse_config
from ..output import print_table, report
from .recorded_boots import boot_records, record_summary
from .release import check_held_plans
from .setup_checks import (
    Checks,
    check_compile_cache,
    check_keys,
    check_local_plans,
    check_plan_dir,
    check_plugin,
    check_signing_key,
    check_store,
)
from .trust_root_check import check_trust_root, identities_named


def cmd_doctor(args: argparse.Namespace) -> int:
    checks = Checks()
    check_plugin(checks)
    check_compile_cache(checks)
    directory = check_plan_dir(checks)
    config = parse_config(os.environ)
    policy = check_keys(checks, config)
    check_trust_root(checks, policy.keyring or identities_named(config.trusted_keys))
    check_signing_key(checks, config)
    store = check_store(checks, config, policy)
    check_local_plans(checks, directory, policy, args.free_memory, store)
    check_held_plans(checks, directory.path)
    boots = boot_records(checks, args.records, fleet=bool(args.textfile))
    if args.textfile:
        from .textfile import write

        write(args.textfile, boots)  # every rank's newest record; the table below shows --records
        boots = boots[: args.records]
    if args.json:
        report(args, checks.ok, checks=checks.items, plan_dir=str(directory.path))
    else:
        print_table(
            [(c["name"], c["status"].upper(), c["detail"]) for c in checks.items],
            ["CHECK", "STATUS", "DETAIL"],
        )
        for row in (
            next(c for c in checks.items if c["name"] == "local-plans")
            .get("data", {})
            .get("plans", [])
        ):
            print(f"  {row['fingerprint']}  {row['decision']:9} {row['reason']:16} {row['detail']}")
        if boots:
            print_table(
                [
                    (
                        d.get("time"),
                        d.get("rank"),
                        record_summary(d).split(", ", 1)[1],
                        "; ".join(d.get("warnings") or []),
                    )
                    for d in boots
                ],
                ["BOOT", "RANK", "RECORD", "WARNINGS"],
            )
        verdict = (
            "a worker here has what it needs"
            if checks.ok
            else "a worker here will not apply plans as set up"
        )
        print(f"doctor: {verdict}", file=sys.stderr)
    return 0 if checks.ok else 1
