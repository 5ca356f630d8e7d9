"""The store subcommands: push, pull, prune (``verify URL`` and ``ls URL`` are in :mod:`.offline`).

Thin commands over the library: :class:`~plancache.pipeline.resolver.Resolver` pulls (fetch,
verify, persist), :mod:`plancache.pipeline.bulk` pushes and prunes. Exit codes as ``verify``:
0 every plan fine; 1 a plan was rejected, missing or refused; 2 usage, configuration or store
error (unreachable, timed out, a bucket that does not exist), including one plan's fetch failing.

``pull`` is on a booting node's critical path: this module imports only what it needs, and
push and prune import the bulk machinery inside their functions.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ...clock import REAL_CLOCK, Deadline
from ...pipeline.audit import STORE_REASONS, all_valid, report_of
from ...pipeline.locations import (
    BULK_TIMEOUT,
    local_dir,
    open_url,
    require_existing,
    require_push_target,
)
from ...pipeline.resolver import Resolver, utcnow
from ...settings import BOOT_TIMEOUT
from ...storage.deadline import DEFAULT_TIMEOUT, checked_budget
from ...trust.errors import ConfigError
from ...trust.plans.gate import Verdict
from ..flag_objects import check_places, required_policy, storage_options, wanted_fingerprints
from ..output import Progress, print_table, report

EXIT_STORE = 2
DRY_RUN_WORDS = {"uploaded": "would upload", "unchanged": "already in the store (byte-identical)"}
"""``push --dry-run``'s table: what would happen, in words ("would be unchanged" said nothing)."""


# -- push ---------------------------------------------------------------------------------------


def cmd_push(args: argparse.Namespace) -> int:
    """Sign (with ``--key``) and upload a directory's plans, then their plan sets.

    Raises:
        ConfigError: ``--set-replicas`` out of range, or a bad DIR, URL or key
            (``config-error``).
    """
    from ...pipeline.bulk import PushRequest, push_plans
    from ...pipeline.trust_config import signer_for
    from ..flag_objects import signing_request
    from ..keys_cmd import terminal_prompt
    from .signing_commands import conditions_warning, unrecorded_conditions

    check_places(args)
    from ...trust.plans.plan_set_names import MAX_REPLICAS

    if not 1 <= args.set_replicas <= MAX_REPLICAS:
        raise ConfigError(f"--set-replicas must be 1 to {MAX_REPLICAS}, got {args.set_replicas}")
    wanted = wanted_fingerprints(args)
    directory = local_dir(args.dir)
    signer = signer_for(args.key, prompt=terminal_prompt())
    request = signing_request(args)
    started = REAL_CLOCK.monotonic()
    store = open_url(
        args.url, storage_options(args), BULK_TIMEOUT if args.timeout is None else args.timeout
    )
    require_push_target(store)
    with Progress("push", args.quiet) as bar:
        push = PushRequest(
            signer=signer,
            signing=request,
            allow_unsigned=args.allow_unsigned,
            fingerprints=wanted or None,
            dry_run=args.dry_run,
        )
        entries, uploaded = push_plans(
            directory, store, Deadline(started, store.timeout), utcnow(), push=push, progress=bar
        )
    sets, set_problems = _push_sets(
        args, directory, store, Deadline(started, store.timeout), signer, entries
    )
    counts = {a: sum(e.action == a for e in entries) for a in ("uploaded", "unchanged", "refused")}
    signs = any(e.detail in ("signed", "signed first") for e in entries)
    missing = unrecorded_conditions(dict(request.facts or {})) if signs else []
    warnings = ([conditions_warning(missing)] if missing else []) + set_problems
    for warning in warnings:
        print(f"plancache: warning: {warning}", file=sys.stderr)
    if args.json:
        report(
            args,
            not counts["refused"],
            url=store.url,
            key=signer.keyid if signer else None,
            objects_uploaded=uploaded,
            plans=[vars(e) for e in entries],
            dry_run=args.dry_run,
            warnings=warnings,
            plan_sets=[vars(s) for s in sets],
            uploaded=counts["uploaded"],
            unchanged=counts["unchanged"],
            refused=counts["refused"],
        )
    else:
        for e in entries:
            if e.action == "refused":
                print(f"plancache: refused {e.fingerprint}: {e.detail}", file=sys.stderr)
        if args.dry_run:
            print_table(
                [(e.fingerprint, DRY_RUN_WORDS.get(e.action, e.action), e.detail) for e in entries],
                ["PLAN", "ACTION", "DETAIL"],
            )
        verb = "would be uploaded" if args.dry_run else "uploaded"
        print(
            f"{len(entries)} plan(s) from {directory} to {store.url}: {counts['uploaded']} {verb}, "
            f"{counts['unchanged']} already in the store, {counts['refused']} refused"
        )
        if sets:
            print(f"{len(sets)} plan set(s) {verb}: {', '.join(s.name for s in sets)}")
    return 1 if counts["refused"] else 0


def _push_sets(
    args: argparse.Namespace,
    directory: Any,
    store: Any,
    deadline: Deadline,
    signer: Any,
    entries: list[Any],
) -> tuple[list[Any], list[str]]:
    """With a signing key: one signed plan set per complete world among the pushed plans
    (docs/boot-storm.md); without one, none (a set is signed as one, by the key)."""
    from ...pipeline.plan_sets.push import push_sets

    if signer is None or any(e.action == "refused" for e in entries):
        return [], []
    fps = [e.fingerprint for e in entries]
    return push_sets(
        directory,
        store,
        deadline,
        utcnow(),
        signer,
        fingerprints=fps,
        replicas=args.set_replicas,
        expires_in=getattr(args, "expires_in", None),
        dry_run=args.dry_run,
    )


# -- pull ---------------------------------------------------------------------------------------


def cmd_pull(args: argparse.Namespace) -> int:
    started = REAL_CLOCK.monotonic()
    check_places(args)
    policy = required_policy(args)
    wanted = wanted_fingerprints(args)
    budget = checked_budget(
        args.timeout, DEFAULT_TIMEOUT if wanted else BOOT_TIMEOUT if args.boot else BULK_TIMEOUT
    )
    directory = local_dir(args.dir, must_exist=False)
    deadline = Deadline(started, budget)
    store = open_url(
        args.url, storage_options(args), budget, deadline=deadline
    )  # the SDK's import counts
    resolver = Resolver(directory, policy, store)
    actions = {True: "written", False: "unchanged", None: "rejected"}
    with Progress("pull", args.quiet or len(wanted) == 1) as bar:
        bar.start(len(wanted))  # 0: the store's size is not known before it is listed
        # Streamed: one report row per plan is kept, never the plans' bytes.
        reports = [
            (report_of(result), actions[result.written])
            for result in resolver.pull(wanted or None, deadline, bar.advance)
        ]
    if all(r.reason == Verdict.NO_PLAN.value for r, _ in reports):
        require_existing(
            store
        )  # nothing found: a missing bucket is a configuration error, not a miss
    store_failed = any(r.reason in STORE_REASONS for r, _ in reports)
    written = sum(a == "written" for _, a in reports)
    rejected = sum(not r.ok for r, _ in reports)
    if args.json:
        plans = [{**r.to_json(), "action": action} for r, action in reports]
        report(
            args,
            not rejected,
            url=store.url,
            dir=str(directory),
            plans=plans,
            written=written,
            budget_seconds=budget,
        )
    else:
        if rejected or len(reports) <= 50:
            rows = [
                (
                    r.fingerprint,
                    r.outcome,
                    action,
                    r.reason if r.reason not in ("ok", r.outcome) else "",
                    r.detail,
                )
                for r, action in reports
            ]
            print_table(rows, ["PLAN", "STATUS", "ACTION", "REASON", "DETAIL"])
        missing = sum(r.outcome == "missing" for r, _ in reports)
        unread = sum(r.reason in STORE_REASONS for r, _ in reports)
        notes = [f"{missing} not in the store"] * bool(missing) + [
            f"{unread} could not be read"
        ] * bool(unread)
        print(
            f"{len(reports)} plan(s) from {store.url} into {directory}: {len(reports) - rejected} "
            f"verified ({written} written), {rejected} rejected"
            + (f" ({', '.join(notes)})" if notes else ""),
            file=sys.stderr,
        )
    if store_failed:
        return EXIT_STORE
    return 0 if all_valid(r for r, _ in reports) else 1


# -- prune --------------------------------------------------------------------------------------


def cmd_prune(args: argparse.Namespace) -> int:
    from ...pipeline.pruning import prune_plans

    criterion = (
        next(c for c in ("revoked", "unsigned", "invalid") if getattr(args, c))
        if args.older_than is None
        else "older-than"
    )
    # --revoked only asks "is this signer revoked?": a file of revocations alone will do
    policy = (
        required_policy(args, revocations_only=criterion == "revoked")
        if criterion in ("revoked", "invalid")
        else None
    )
    started = REAL_CLOCK.monotonic()
    budget = checked_budget(args.timeout, BULK_TIMEOUT)
    deadline = Deadline(started, budget)  # once: the listing, every read and delete, and the sets
    store = open_url(args.url, storage_options(args), budget, deadline=deadline)
    with Progress("prune", args.quiet) as bar:
        outcome = prune_plans(
            store,
            deadline,
            utcnow(),
            policy,
            older_than=args.older_than,
            criterion=criterion,
            dry_run=args.dry_run,
            progress=bar,
            unconditional=args.unconditional,
        )
    deleted = outcome.deleted
    versions = [v or None for _, _, v in outcome.gone or []] if deleted else []
    sets = outcome.sets.deleted if outcome.sets else []
    set_errors = outcome.sets.errors if outcome.sets else []
    verb = "would delete" if args.dry_run else "deleted"
    if args.json:
        report(
            args,
            not outcome.failed and not set_errors,
            url=store.url,
            dry_run=args.dry_run,
            criterion=criterion,
            deleted=[
                {
                    "fingerprint": r.fingerprint,
                    "why": why,
                    "signers": r.signers,
                    "signer_ids": r.signer_ids,
                    "signed_by": r.to_json()["signed_by"],
                    "version": versions[i] if i < len(versions) else None,
                }
                for i, (r, why) in enumerate(deleted)
            ],
            changed=outcome.changed,
            kept=outcome.kept,
            more_candidates=outcome.more_candidates,
            errors=[r.to_json() for r in outcome.failed],
            plan_sets_deleted=sets,
            plan_set_errors=[s.to_json() for s in set_errors],
        )
    else:
        print_table(
            [(r.fingerprint, verb, why, ", ".join(r.signers)) for r, why in deleted],
            ["PLAN", "ACTION", "WHY", "SIGNER"],
        )
        for fp in outcome.changed:
            print(
                f"plancache: kept {fp}: it changed in the store after it was judged",
                file=sys.stderr,
            )
        for r in outcome.failed:
            print(f"plancache: could not read {r.fingerprint}: {r.detail}", file=sys.stderr)
        names = len({r.fingerprint for r, _ in deleted})
        several = f" (candidates attached for {names} plan(s))" if names < len(deleted) else ""
        print(
            f"{outcome.seen} plan(s) in {store.url}: {verb} {len(deleted)}{several}, kept "
            f"{outcome.kept}",
            file=sys.stderr,
        )
        if outcome.more_candidates:
            print(
                "plancache: a dry run judges the newest candidate attached for each plan; the "
                "run judges the next ones as it deletes"
                if args.dry_run
                else f"plancache: {outcome.rounds} rounds deleted attached candidates that failed "
                "and more may remain: run prune again",
                file=sys.stderr,
            )
        if sets:
            print(
                f"plan set(s) holding them or a plan no longer in the store: {verb} "
                f"{', '.join(sets)}",
                file=sys.stderr,
            )
    if set_errors:
        print(_set_errors_line(set_errors, args.dry_run), file=sys.stderr)
    return EXIT_STORE if outcome.failed or set_errors else 0


def _set_errors_line(errors: list[Any], dry_run: bool) -> str:
    """One line naming every plan set prune could not read or delete, and what it kept for it."""
    unread = [e for e in errors if not e.detail.startswith("not deleted")]
    what = "could not be read" if unread else "could not be deleted"
    first = (unread or errors)[0]
    kept = "no plan would be deleted" if dry_run else "no plan was deleted"
    return (
        f"plancache: prune refused: plan set(s) {', '.join(e.name for e in unread or errors)} "
        f"{what} ({first.reason}: {first.detail}); {kept}, so no set goes on serving a pruned plan"
    )
