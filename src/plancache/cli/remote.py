"""The store subcommands: push, pull, prune (``verify URL`` and ``ls URL`` go through
:func:`plancache.cli.locations.open_source`).

The trust boundary is the same as offline: bytes from a store are raw until
:func:`plancache.trust.verify.verify_plan` turns them into a ``VerifiedPlan``, and only those
are written into the plan directory (plan first, then sidecar, each atomically).

Exit codes as ``verify``: 0 every plan fine; 1 a plan was rejected or refused; 2 usage,
configuration or store error (unreachable, timed out), including one plan's fetch failing.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Callable

from ..storage.keyfiles import load_signer
from ..storage.localdir import LocalPlanDir
from ..storage.store import Store, md5_hex, open_store
from ..trust.errors import PlanCacheError, Reason
from ..trust.keys import Keyring, Signer
from ..trust.plan import fingerprint_of_plan_name, fingerprint_of_sig_name, is_fingerprint, plan_name, sig_name
from ..trust.statement import parse_time
from ..trust.verify import VerifiedPlan
from ..settings import SIGNING_KEY_ENV
from .args import duration, key_value
from .locations import BULK_TIMEOUT, add_store_options, is_url, local_dir, storage_options
from .offline import require_keyring, sign_one, utcnow
from .output import Progress, print_json, print_table
from .report import PlanReport, check_many, exit_code, report_error, report_verified, verify_item

PULL_ONE_TIMEOUT = 3.0
"""Default end-to-end budget of ``pull --fingerprint`` (a spot boot waits on it)."""

EXIT_STORE = 2
WRITE_THREADS = 8
_STORE_REASONS = (Reason.STORE_ERROR.value, Reason.TIMEOUT.value)

TrustOptions = Callable[[argparse.ArgumentParser], None]


def _require_url(url: str) -> str:
    if not is_url(url):
        raise ConfigError(f"not a store URL: {url!r} (expected e.g. s3://bucket/prefix)")
    return url


def add_parsers(sub: argparse._SubParsersAction, trust_options: TrustOptions) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "push", help="sign (with --key) and upload plans to a store",
        description="Upload the plans in DIR and their signatures to URL. With --key, plans lacking a valid "
        "signature by that key are signed first. Unsigned plans are refused unless --allow-unsigned. Objects the "
        "store already holds byte-identical are skipped.",
    )
    p.add_argument("--key", metavar="KEY", help=f"sign with this private key first (default: ${SIGNING_KEY_ENV})")
    p.add_argument("--allow-unsigned", action="store_true", help="push plans without a signature too")
    p.add_argument("--expires-in", type=duration, metavar="DURATION", help="lifetime of new signatures, e.g. 30d")
    p.add_argument("--comment", default="", help="free text recorded in new signatures")
    p.add_argument("--fact", type=key_value, action="append", metavar="KEY=VALUE",
                   help="provenance fact recorded in new signatures (repeatable)")
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
    trust_options(p)
    p.add_argument("--fingerprint", action="append", metavar="FP", help="pull only this plan (repeatable)")
    add_store_options(p, f"end-to-end budget (default {PULL_ONE_TIMEOUT:g} s with --fingerprint, else {BULK_TIMEOUT:g} s)")
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
    trust_options(p)
    add_store_options(p)
    p.add_argument("--json", action="store_true", help="print a JSON report")
    p.add_argument("url", metavar="URL", help="store URL")
    p.set_defaults(func=cmd_prune)


# -- push ---------------------------------------------------------------------------------------


def _push_signer(args: argparse.Namespace) -> Signer | None:
    ref = args.key or os.environ.get(SIGNING_KEY_ENV)
    return load_signer(ref) if ref else None


def _unchanged(store: Store, objects: dict[str, bytes], deadline: float) -> set[str]:
    """Names whose bytes the store already holds: decided from the listing's size and MD5
    when it states them (S3, GCS: no download); otherwise same-size objects are fetched."""
    listing = store.list_objects(deadline)
    same: set[str] = set()
    to_compare: set[str] = set()
    for name, data in objects.items():
        info = listing.get(name)
        if info is None or (info.size is not None and info.size != len(data)):
            continue
        if info.md5 is not None:
            if info.md5 == md5_hex(data):
                same.add(name)
        else:
            to_compare.add(name)
    fps = sorted({fp for n in to_compare if (fp := fingerprint_of_plan_name(n) or fingerprint_of_sig_name(n))})
    for fp, plan, sig in store.fetch_items(fps, deadline):
        for name, remote in ((plan_name(fp), plan), (sig_name(fp), sig)):
            if name in to_compare and isinstance(remote, bytes) and remote == objects[name]:
                same.add(name)
    return same


def cmd_push(args: argparse.Namespace) -> int:
    url = _require_url(args.url)
    directory = local_dir(args.dir)
    signer = _push_signer(args)
    store = open_store(url, storage_options(args), args.timeout or BULK_TIMEOUT)
    deadline = time.monotonic() + store.timeout
    now = utcnow()
    results: list[dict[str, Any]] = []
    objects: dict[str, bytes] = {}
    for fp in directory.fingerprints():
        entry: dict[str, Any] = {"fingerprint": fp, "action": "", "detail": ""}
        results.append(entry)
        try:
            if signer is not None:
                sign_one(directory, fp, signer, now, args)
            plan, sig = directory.read(fp)
            if plan is None:
                raise PlanCacheError(Reason.NO_PLAN, "plan file vanished")
        except PlanCacheError as exc:
            entry["action"], entry["detail"] = "refused", f"{exc.reason.value}: {exc.detail}"
            continue
        if sig is None and not args.allow_unsigned:
            entry["action"], entry["detail"] = "refused", "unsigned (sign it: --key KEY, or --allow-unsigned)"
            continue
        entry["names"] = [plan_name(fp)] + ([sig_name(fp)] if sig is not None else [])
        objects[plan_name(fp)] = plan
        if sig is not None:
            objects[sig_name(fp)] = sig
    same = _unchanged(store, objects, deadline) if objects else set()
    upload = {n: d for n, d in objects.items() if n not in same}
    progress = Progress(len(upload), "push")
    store.put_many(upload, deadline, on_done=progress.advance)
    progress.close()
    for entry in results:
        names = entry.pop("names", None)
        if names is not None:
            entry["action"] = "uploaded" if any(n in upload for n in names) else "unchanged"
            entry["detail"] = "unsigned" if len(names) == 1 else ""
    counts = {a: sum(r["action"] == a for r in results) for a in ("uploaded", "unchanged", "refused")}
    if args.json:
        print_json({"url": url, "key": signer.keyid if signer else None, "plans": results,
                    "objects_uploaded": len(upload), **counts})
    else:
        for r in results:
            if r["action"] == "refused":
                print(f"plancache: refused {r['fingerprint']}: {r['detail']}", file=sys.stderr)
        print(f"{len(results)} plan(s) from {directory} to {url}: {counts['uploaded']} uploaded, "
              f"{counts['unchanged']} unchanged, {counts['refused']} refused")
    return 1 if counts["refused"] else 0


# -- pull ---------------------------------------------------------------------------------------


def _write_verified(directory: LocalPlanDir, vp: VerifiedPlan) -> str | PlanCacheError:
    """Write a verified plan and sidecar unless DIR already holds exactly these bytes."""
    try:
        if directory.read(vp.fingerprint) == (vp.plan_bytes, vp.sig_bytes):
            return "unchanged"
    except PlanCacheError:
        pass  # an unreadable local copy is simply replaced
    try:
        directory.write(vp.fingerprint, vp.plan_bytes, vp.sig_bytes, sync=False)  # synced once by the caller
    except PlanCacheError as exc:
        return exc
    return "written"


def cmd_pull(args: argparse.Namespace) -> int:
    started = time.monotonic()
    url = _require_url(args.url)
    keyring = require_keyring(args)
    wanted = list(dict.fromkeys(args.fingerprint or []))
    bad = [fp for fp in wanted if not is_fingerprint(fp)]
    if bad:
        raise ConfigError(f"not a plan fingerprint (16 lowercase hex): {bad[0]!r}")
    budget = args.timeout or (PULL_ONE_TIMEOUT if wanted else BULK_TIMEOUT)
    directory = local_dir(args.dir, must_exist=False)
    store = open_store(url, storage_options(args), budget)
    deadline = started + budget
    fps = wanted or store.fingerprints(deadline)
    progress = Progress(len(fps), "pull")
    # The bulk phase allocates much but leaves almost no cyclic garbage (same peak RSS with
    # the collector off), while each full collection walks the whole heap s3fs/aiobotocore
    # built: pausing the collector makes a 1000-plan pull ~9 % faster.
    collecting = gc.isenabled()
    gc.disable()
    try:
        items = store.fetch_items(fps, deadline, on_done=progress.advance)
        progress.close()
        now = utcnow()
        outcomes = [verify_item(item, keyring, now) for item in items]
        verified = [o for o in outcomes if isinstance(o, VerifiedPlan)]
        # Each write fsyncs its file; threads overlap those waits (fsync releases the GIL).
        # Plan-then-sidecar order holds within each fingerprint; the directory is fsynced once.
        with ThreadPoolExecutor(max_workers=WRITE_THREADS) as pool:
            written_or_error = dict(zip([v.fingerprint for v in verified], pool.map(
                lambda vp: _write_verified(directory, vp), verified)))
        if "written" in written_or_error.values():
            directory.sync()
    finally:
        if collecting:
            gc.enable()
    reports: list[PlanReport] = []
    actions: dict[str, str] = {}
    for (fp, _, _), outcome in zip(items, outcomes):
        if isinstance(outcome, PlanCacheError):
            reports.append(report_error(fp, outcome))
            continue
        result = written_or_error[outcome.fingerprint]
        if isinstance(result, PlanCacheError):
            reports.append(report_error(outcome.fingerprint, result))
        else:
            actions[outcome.fingerprint] = result
            reports.append(report_verified(outcome))
    store_failed = any(r.reason in _STORE_REASONS for r in reports)
    written = sum(a == "written" for a in actions.values())
    rejected = sum(r.status != "valid" for r in reports)
    if args.json:
        plans = [{**r.to_json(), "action": actions.get(r.fingerprint, "rejected")} for r in reports]
        print_json({"url": url, "dir": str(directory), "plans": plans, "written": written, "ok": not rejected})
    else:
        if rejected or len(reports) <= 50:
            rows = [(r.fingerprint, r.status, actions.get(r.fingerprint, "rejected"),
                     r.reason if r.status != "valid" else "", r.detail) for r in reports]
            print_table(rows, ["PLAN", "STATUS", "ACTION", "REASON", "DETAIL"])
        print(f"{len(reports)} plan(s) from {url} into {directory}: {len(reports) - rejected} verified "
              f"({written} written), {rejected} rejected", file=sys.stderr)
    if store_failed:
        return EXIT_STORE
    return exit_code(reports)


# -- prune --------------------------------------------------------------------------------------


def _prune_reason(report: PlanReport, args: argparse.Namespace, now: datetime) -> str | None:
    if args.revoked:
        return "revoked" if report.reason == Reason.REVOKED.value else None
    if report.signed_at is None:
        return None  # no readable signature date: nothing says it is old
    signed = parse_time(report.signed_at, "signed_at")
    return f"signed {report.signed_at}" if signed < now - args.older_than else None


def cmd_prune(args: argparse.Namespace) -> int:
    url = _require_url(args.url)
    keyring: Keyring | None = require_keyring(args) if args.revoked else None
    store = open_store(url, storage_options(args), args.timeout or BULK_TIMEOUT)
    deadline = time.monotonic() + store.timeout
    items = store.fetch_items(store.fingerprints(deadline), deadline)
    now = utcnow()
    # Dates come from the statement as written (unverified is fine: deleting needs no trust);
    # revocation needs the keyring's verdict.
    reports = check_many(items, keyring, now, label="prune")
    failed = [r for r in reports if r.reason in _STORE_REASONS]
    doomed = [(r, why) for r in reports if r not in failed and (why := _prune_reason(r, args, now))]
    if doomed and not args.dry_run:
        store.delete([r.fingerprint for r, _ in doomed], deadline)
    verb = "would delete" if args.dry_run else "deleted"
    if args.json:
        print_json({"url": url, "dry_run": args.dry_run, "deleted": [
            {"fingerprint": r.fingerprint, "why": why, "signers": r.signers} for r, why in doomed
        ], "kept": len(reports) - len(doomed), "errors": [r.to_json() for r in failed]})
    else:
        print_table([(r.fingerprint, verb, why, ", ".join(r.signers)) for r, why in doomed],
                    ["PLAN", "ACTION", "WHY", "SIGNER"])
        for r in failed:
            print(f"plancache: could not read {r.fingerprint}: {r.detail}", file=sys.stderr)
        print(f"{len(reports)} plan(s) in {url}: {verb} {len(doomed)}, kept {len(reports) - len(doomed)}",
              file=sys.stderr)
    return EXIT_STORE if failed else 0

