"""The offline audit: ``verify`` and ``ls`` of a plan directory or a store URL.

An audit must not pass by accident: a location that does not exist is exit 2 (raised by the
library), and ``verify`` over a location with no plans exits 1 ("no plans", naming deeper
prefixes that hold some) unless ``--allow-empty``.

The two commands share one audit (:func:`_audit`: one deadline, the plans, then the plan sets);
the commands that write keys and signatures are in :mod:`.signing_commands`, the detailed view
of one file in :mod:`.inspect_command`.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...clock import REAL_CLOCK
from ...pipeline.audit import PlanReport, all_valid, audit_plans, list_plans
from ...pipeline.locations import (
    BULK_TIMEOUT,
    Location,
    is_url,
    no_plans_message,
    open_location,
    open_url,
    require_existing,
)
from ...pipeline.resolver import utcnow
from ...storage.local.localdir import LocalPlanDir
from ...trust.display import safe_text
from ...trust.errors import ConfigError, PlanCacheError
from ..flag_objects import (
    optional_policy,
    required_policy,
    storage_options,
    wanted_fingerprints,
)
from ..output import (
    Progress,
    document,
    gib,
    print_json,
    print_table,
    render_json,
    report,
    status_text,
)

if TYPE_CHECKING:
    from ...clock import Deadline

NO_PLANS = "no-plans"


@dataclass
class Audit:
    """One ``verify`` or ``ls`` run: where, its plans' reports, and what its sets need."""

    source: Location
    reports: list[PlanReport]
    deadline: Deadline | None
    """The command's one deadline (a store's; None for a directory): ``--timeout`` bounds the
    whole audit, plans and sets, never each read."""
    digests: dict[str, str] = field(default_factory=dict)
    """sha256 of each fetched plan: a set's members are compared with them (rollbacks)."""


def _audit(args: argparse.Namespace, policy: Any) -> Audit:
    """The plans' reports. On a store, ``--timeout`` is one deadline for the whole command, taken
    here once (before the store is opened: that counts too) and handed down to the listing,
    every fetch and, after, the sets: a fresh budget per read let six slow sets take 30 s."""
    started = REAL_CLOCK.monotonic()
    wanted = wanted_fingerprints(args) if getattr(args, "fingerprint", None) else []
    deadline = None
    if is_url(str(args.location) if args.location else None):
        from ...clock import Deadline
        from ...storage.deadline import checked_budget  # a store's, for a store only

        budget = checked_budget(args.timeout, BULK_TIMEOUT)
        deadline = Deadline(started, budget)  # computed once, handed to every listing and read
        source: Location = open_url(
            str(args.location), storage_options(args), budget, deadline=deadline
        )
    else:
        source = open_location(args.location, storage_options(args), args.timeout)
    audit = Audit(source, [], deadline)
    fingerprints = wanted or list_plans(source, deadline)
    with Progress("verify" if isinstance(source, LocalPlanDir) else "fetch", args.quiet) as bar:
        audit.reports = audit_plans(
            source,
            fingerprints,
            policy,
            utcnow(),
            jobs=args.jobs,
            progress=bar,
            deadline=deadline,
            digests=audit.digests,
        )
    if wanted and all(r.outcome == "missing" for r in audit.reports):
        require_existing(
            source, deadline
        )  # a mistyped bucket is a configuration error, not two misses
    return audit


def cmd_verify(args: argparse.Namespace) -> int:
    """Verify every plan (and plan set) of the location; ``--report`` is written whatever
    happens, a failure report when the audit cannot run.

    Raises:
        ConfigError: ``--report`` names something other than a regular file, or the location
            cannot be audited as configured (``config-error``).
        BaseException: whatever stopped the audit, raised again once the failure report is
            written (the CLI turns it into its one line and exit code).
    """
    if args.report:
        _check_report_target(args.report)
    try:
        return _verify(args)
    except BaseException as exc:
        if args.report and not isinstance(
            exc, SystemExit
        ):  # never a stale success, whatever failed
            if isinstance(exc, PlanCacheError):
                error = (exc.reason.value, exc.detail)
            elif isinstance(exc, KeyboardInterrupt):
                error = ("interrupted", "interrupted")
            else:
                error = ("internal-error", f"{type(exc).__name__}: {safe_text(exc, 300)}")
            try:
                _write_report(
                    args.report,
                    document("verify", False, body={"location": args.location or ""}, error=error),
                )
            except PlanCacheError:
                pass  # the report cannot be written: the first failure is the one to tell
        raise


def _check_report_target(path: str) -> None:
    """``--report`` replaces a regular file or creates one; anything else (``/dev/full``, a FIFO,
    a directory, a symlink) is refused before the audit runs, not renamed over."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"--report {safe_text(path, 200)}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(
            f"--report {safe_text(path, 200)} exists and is not a regular file: refusing to "
            "replace it"
        )


def _write_report(path: str, doc: dict[str, Any]) -> None:
    from ...storage.local.files import write_atomic

    write_atomic(Path(path), render_json(doc).encode())


def _sets(args: argparse.Namespace, audit: Audit, policy: Any) -> list[Any]:
    """The store's plan sets, verified under ``policy`` (docs/boot-storm.md) inside the audit's
    deadline, each compared with the per-plan objects that verified (an older one is a
    rollback); none for a directory or when only some ``--fingerprint`` plans were asked for."""
    if isinstance(audit.source, LocalPlanDir) or getattr(args, "fingerprint", None):
        return []  # an offline audit of a directory imports no store machinery
    from ...pipeline.plan_sets.set_audit import audit_sets, plan_facts

    facts = plan_facts(audit.reports, audit.digests) if policy is not None else {}
    return audit_sets(audit.source, policy, utcnow(), deadline=audit.deadline, plans=facts)


def _print_sets(sets: list[Any]) -> None:
    if sets:
        print_table(
            [
                (
                    s.name,
                    ", ".join(s.signers),
                    s.status,
                    s.reason if s.reason not in ("ok", s.status) else "",
                    f"{len(s.fingerprints)} rank(s)" + (f"; {s.detail}" if s.detail else ""),
                )
                for s in sets
            ],
            ["PLAN SET", "SIGNER", "STATUS", "REASON", "DETAIL"],
        )


def _verify(args: argparse.Namespace) -> int:
    policy = required_policy(args)
    audit = _audit(args, policy)
    source, reports = audit.source, audit.reports
    sets = _sets(args, audit, policy)
    ok = all_valid(reports) and all(s.ok for s in sets)
    error = None
    if not reports:
        message = no_plans_message(source)
        ok = ok and args.allow_empty  # --allow-empty forgives no plans, never a bad plan set
        error = None if args.allow_empty else (NO_PLANS, message)
        forgiven = " (--allow-empty: not a failure)" if args.allow_empty else ""
        print(f"plancache: {message}{forgiven}", file=sys.stderr)
    if args.report or args.json:
        doc = document(
            "verify",
            ok,
            body={
                "location": str(source),
                "plans": [r.to_json() for r in reports],
                "plan_sets": [s.to_json() for s in sets],
            },
            error=error,
        )
        if args.report:
            _write_report(args.report, doc)
        if args.json:
            print_json(doc)
    if not args.json and reports:
        rows = [
            (
                r.fingerprint,
                ", ".join(r.signers),
                r.outcome,
                r.reason if r.reason not in ("ok", r.outcome) else "",
                r.detail,
            )
            for r in reports
        ]
        print_table(rows, ["PLAN", "SIGNER", "STATUS", "REASON", "DETAIL"])
        bad = sum(not r.ok for r in reports)
        print(
            f"{len(reports)} plan(s) in {source}: {len(reports) - bad} valid, {bad} not",
            file=sys.stderr,
        )
    if not args.json and sets:
        _print_sets(sets)
        bad = sum(not s.ok for s in sets)
        print(
            f"{len(sets)} plan set(s) in {source}: {len(sets) - bad} valid, {bad} not",
            file=sys.stderr,
        )
    return 0 if ok else 1


def cmd_ls(args: argparse.Namespace) -> int:
    policy = optional_policy(args)
    audit = _audit(args, policy)
    source, reports = audit.source, audit.reports
    sets = _sets(args, audit, policy)
    if not reports:
        print(f"plancache: {no_plans_message(source)}", file=sys.stderr)
    if args.json:
        report(
            args,
            True,
            location=str(source),
            plans=[r.to_json() for r in reports],
            plan_sets=[s.to_json() for s in sets],
        )
        return 0
    rows = [
        (
            r.fingerprint,
            gib(r.kv_cache_memory_bytes),
            gib(r.free_memory_baseline),
            ", ".join(r.signers),
            r.signed_at,
            r.expires_at,
            status_text(r.outcome, r.reason),
        )
        for r in reports
    ]
    print_table(
        rows, ["PLAN", "KV_GIB", "BASELINE_GIB", "SIGNER", "SIGNED_AT", "EXPIRES", "STATUS"]
    )
    _print_sets(sets)
    if policy is None:
        print(
            "no trusted keys given: values are shown unverified (--trusted-keys to verify)",
            file=sys.stderr,
        )
    return 0
