"""The store subcommands: push, pull, prune (``verify URL`` and ``ls URL`` are in :mod:`.offline`).

Thin commands over the library: :class:`~plancache.pipeline.resolver.Resolver` pulls (fetch,
verify, persist), :mod:`plancache.pipeline.bulk` pushes and prunes. Exit codes as ``verify``:
0 every plan fine; 1 a plan was rejected or refused; 2 usage, configuration or store error
(unreachable, timed out), including one plan's fetch failing.
"""

from __future__ import annotations

import argparse
import sys
import time

from ..pipeline.audit import all_valid, report_of
from ..pipeline.bulk import STORE_REASONS, prune_plans, push_plans
from ..pipeline.locations import BULK_TIMEOUT, local_dir, require_url
from ..pipeline.resolver import Resolver, utcnow
from ..pipeline.trust_config import signer_for
from ..settings import SIGNING_KEY_ENV
from ..storage.deadline import DEFAULT_TIMEOUT
from ..storage.store import open_store
from ..trust.errors import ConfigError
from ..trust.plan import is_fingerprint
from ..trust.policy import TrustPolicy
from .args import duration, key_value
from .inputs import add_cosign_options, add_store_options, add_trust_options, required_policy, storage_options
from .offline import signing_request
from .output import Progress, print_json, print_table

EXIT_STORE = 2


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "push", help="sign (with --key) and upload plans to a store",
        description="Upload the plans in DIR and their signatures to URL. With --key, plans lacking a valid "
        "signature by that key are signed first. Unsigned plans are refused unless --allow-unsigned. Objects the "
        "store already holds byte-identical are skipped.",
    )
    p.add_argument("--key", metavar="KEY", help=f"sign with this private key first (default: ${SIGNING_KEY_ENV})")
    p.add_argument("--allow-unsigned", action="store_true", help="push plans without a signature too")
    p.add_argument("--expires-in", type=duration, metavar="DURATION", help="lifetime of new signatures, e.g. 30d")
    p.add_argument("--comment", help="free text recorded in new signatures")
    p.add_argument("--fact", type=key_value, action="append", metavar="KEY=VALUE",
                   help="provenance fact recorded in new signatures (repeatable)")
    add_cosign_options(p)
    add_store_options(p)
    p.add_argument("--json", action="store_true", help="print a JSON report")
    p.add_argument("dir", nargs="?", metavar="DIR", help="plan directory (default: vLLM's plan directory)")
    p.add_argument("url", metavar="URL", help="store URL, e.g. s3://bucket/prefix, gs://bucket/prefix, file:///path")
    p.set_defaults(func=cmd_push)

    p = sub.add_parser(
        "pull", help="fetch plans from a store, verify them, write the valid ones into DIR",
        description="Fetch each plan (or the --fingerprint ones) and its signature, verify them against the "
        "trusted keys, and write only verified plans into DIR, atomically. Exit 0 all verified, 1 any rejected, "
        "2 usage, configuration or store error.",
    )
    add_trust_options(p)
    p.add_argument("--fingerprint", action="append", metavar="FP", help="pull only this plan (repeatable)")
    add_store_options(p, f"end-to-end budget (default {DEFAULT_TIMEOUT:g} s with --fingerprint, else {BULK_TIMEOUT:g} s)")
    p.add_argument("--json", action="store_true", help="print a JSON report")
    p.add_argument("url", metavar="URL", help="store URL")
    p.add_argument("dir", nargs="?", metavar="DIR", help="plan directory (default: vLLM's plan directory)")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser(
        "prune", help="delete plans signed before a date or by revoked keys",
        description="Delete plans (and their signatures) from URL that were signed longer ago than --older-than, "
        "or (--revoked) that no longer verify because their signing key is revoked in the trusted-keys file.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--older-than", type=duration, metavar="DURATION", help="signed longer ago than this, e.g. 30d")
    what.add_argument("--revoked", action="store_true", help="signed only by keys the trusted-keys file revokes")
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    add_trust_options(p)
    add_store_options(p)
    p.add_argument("--json", action="store_true", help="print a JSON report")
    p.add_argument("url", metavar="URL", help="store URL")
    p.set_defaults(func=cmd_prune)


# -- push ---------------------------------------------------------------------------------------


def cmd_push(args: argparse.Namespace) -> int:
    url = require_url(args.url)
    directory = local_dir(args.dir)
    signer = signer_for(args.key)
    store = open_store(url, storage_options(args), args.timeout or BULK_TIMEOUT)
    progress = Progress("push")
    entries, uploaded = push_plans(directory, store, time.monotonic() + store.timeout, utcnow(), signer,
                                   signing_request(args), args.allow_unsigned, progress.advance)
    progress.close()
    counts = {a: sum(e.action == a for e in entries) for a in ("uploaded", "unchanged", "refused")}
    if args.json:
        print_json({"url": url, "key": signer.keyid if signer else None, "objects_uploaded": uploaded,
                    "plans": [vars(e) for e in entries], **counts})
    else:
        for e in entries:
            if e.action == "refused":
                print(f"plancache: refused {e.fingerprint}: {e.detail}", file=sys.stderr)
        print(f"{len(entries)} plan(s) from {directory} to {url}: {counts['uploaded']} uploaded, "
              f"{counts['unchanged']} unchanged, {counts['refused']} refused")
    return 1 if counts["refused"] else 0


# -- pull ---------------------------------------------------------------------------------------


def cmd_pull(args: argparse.Namespace) -> int:
    started = time.monotonic()
    url = require_url(args.url)
    policy: TrustPolicy = required_policy(args)
    wanted = list(dict.fromkeys(args.fingerprint or []))
    bad = [fp for fp in wanted if not is_fingerprint(fp)]
    if bad:
        raise ConfigError(f"not a plan fingerprint (16 lowercase hex): {bad[0]!r}")
    budget = args.timeout or (DEFAULT_TIMEOUT if wanted else BULK_TIMEOUT)
    directory = local_dir(args.dir, must_exist=False)
    resolver = Resolver(directory, policy, open_store(url, storage_options(args), budget))
    progress = Progress("pull")
    results = resolver.pull(wanted or None, started + budget, progress.advance)
    progress.close()
    actions = {True: "written", False: "unchanged", None: "rejected"}
    reports = [(report_of(result), actions[result.written]) for result in results]
    store_failed = any(r.reason in STORE_REASONS for r, _ in reports)
    written = sum(a == "written" for _, a in reports)
    rejected = sum(not r.ok for r, _ in reports)
    if args.json:
        plans = [{**r.to_json(), "action": action} for r, action in reports]
        print_json({"url": url, "dir": str(directory), "plans": plans, "written": written, "ok": not rejected})
    else:
        if rejected or len(reports) <= 50:
            rows = [(r.fingerprint, r.status, action, r.reason if r.status != "valid" else "", r.detail)
                    for r, action in reports]
            print_table(rows, ["PLAN", "STATUS", "ACTION", "REASON", "DETAIL"])
        print(f"{len(reports)} plan(s) from {url} into {directory}: {len(reports) - rejected} verified "
              f"({written} written), {rejected} rejected", file=sys.stderr)
    if store_failed:
        return EXIT_STORE
    return 0 if all_valid(r for r, _ in reports) else 1


# -- prune --------------------------------------------------------------------------------------


def cmd_prune(args: argparse.Namespace) -> int:
    url = require_url(args.url)
    policy = required_policy(args) if args.revoked else None
    store = open_store(url, storage_options(args), args.timeout or BULK_TIMEOUT)
    doomed, failed, seen = prune_plans(store, time.monotonic() + store.timeout, utcnow(), policy,
                                       args.older_than, args.revoked, args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    if args.json:
        print_json({"url": url, "dry_run": args.dry_run, "deleted": [
            {"fingerprint": r.fingerprint, "why": why, "signers": r.signers} for r, why in doomed
        ], "kept": seen - len(doomed), "errors": [r.to_json() for r in failed]})
    else:
        print_table([(r.fingerprint, verb, why, ", ".join(r.signers)) for r, why in doomed],
                    ["PLAN", "ACTION", "WHY", "SIGNER"])
        for r in failed:
            print(f"plancache: could not read {r.fingerprint}: {r.detail}", file=sys.stderr)
        print(f"{seen} plan(s) in {url}: {verb} {len(doomed)}, kept {seen - len(doomed)}", file=sys.stderr)
    return EXIT_STORE if failed else 0
