"""Whole-store work beside the resolver: push a directory's plans, prune a store's plans.

Both move bytes only; what may be uploaded (signed, or explicitly allowed unsigned) and
what may be deleted (old by its statement's date, or revoked by the trusted keys' verdict)
is decided here from the trust core's answers, and the commands only render the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable

from ..storage.localdir import LocalPlanDir
from ..storage.store import Store, md5_hex
from ..trust.errors import PlanCacheError, Reason
from ..trust.gate import Verdict
from ..trust.keys import Signer
from ..trust.plan import fingerprint_of_plan_name, fingerprint_of_sig_name, plan_name, sig_name
from ..trust.policy import TrustPolicy
from ..trust.statement import parse_time
from .audit import PlanReport, check_many
from .signing import SigningRequest, sign_one

Progress = Callable[[int], None]
STORE_REASONS = (Reason.STORE_ERROR.value, Reason.TIMEOUT.value)


@dataclass
class PushEntry:
    fingerprint: str
    action: str = ""
    """``uploaded``, ``unchanged`` or ``refused``."""
    detail: str = ""


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
    for remote in store.fetch_many(fps, deadline):
        for name, data in ((plan_name(remote.fingerprint), remote.plan_bytes), (sig_name(remote.fingerprint), remote.sig_bytes)):
            if name in to_compare and data is not None and data == objects[name]:
                same.add(name)
    return same


def push_plans(
    directory: LocalPlanDir,
    store: Store,
    deadline: float,
    now: datetime,
    signer: Signer | None = None,
    request: SigningRequest = SigningRequest(),
    allow_unsigned: bool = False,
    progress: Progress | None = None,
) -> tuple[list[PushEntry], int]:
    """Sign (with a signer) and upload every plan and sidecar the store lacks byte for byte.

    Returns one entry per plan and the number of objects uploaded.
    """
    entries: list[PushEntry] = []
    objects: dict[str, bytes] = {}
    names: dict[str, list[str]] = {}
    for fp in directory.fingerprints():
        entry = PushEntry(fp)
        entries.append(entry)
        try:
            if signer is not None:
                outcome = sign_one(directory, fp, signer, now, request)
                if outcome.refused:
                    entry.action, entry.detail = "refused", f"{outcome.reason}: {outcome.detail}"
                    continue
            plan, sig = directory.read(fp)
        except PlanCacheError as exc:
            entry.action, entry.detail = "refused", f"{exc.reason.value}: {exc.detail}"
            continue
        if plan is None:
            entry.action, entry.detail = "refused", f"{Verdict.NO_PLAN}: plan file vanished"
            continue
        if sig is None and not allow_unsigned:
            entry.action, entry.detail = "refused", "unsigned (sign it: --key KEY, or --allow-unsigned)"
            continue
        names[fp] = [plan_name(fp)] + ([sig_name(fp)] if sig is not None else [])
        objects[plan_name(fp)] = plan
        if sig is not None:
            objects[sig_name(fp)] = sig
    same = _unchanged(store, objects, deadline) if objects else set()
    upload = {n: d for n, d in objects.items() if n not in same}
    store.put_many(upload, deadline, on_done=progress)
    for entry in entries:
        if entry.fingerprint in names:
            mine = names[entry.fingerprint]
            entry.action = "uploaded" if any(n in upload for n in mine) else "unchanged"
            entry.detail = "unsigned" if len(mine) == 1 else ""
    return entries, len(upload)


def _prune_reason(report: PlanReport, now: datetime, older_than: timedelta | None, revoked: bool) -> str | None:
    if revoked:
        return "revoked" if report.reason == Reason.REVOKED.value else None
    if report.signed_at is None or older_than is None:
        return None  # no readable signature date: nothing says it is old
    signed = parse_time(report.signed_at, "signed_at")
    return f"signed {report.signed_at}" if signed < now - older_than else None


def prune_plans(
    store: Store,
    deadline: float,
    now: datetime,
    policy: TrustPolicy | None,
    older_than: timedelta | None = None,
    revoked: bool = False,
    dry_run: bool = False,
) -> tuple[list[tuple[PlanReport, str]], list[PlanReport], int]:
    """Delete plans signed before ``now - older_than``, or (``revoked``) whose every trusted
    signature is by a revoked key. Returns (deleted with why, unreadable, plans seen).

    Dates come from the statement as written (unverified is fine: deleting needs no trust);
    revocation needs the policy's verdict.
    """
    results = store.fetch_many(store.fingerprints(deadline), deadline)
    reports = check_many(results, policy if revoked else None, now)
    failed = [r for r in reports if r.reason in STORE_REASONS]
    doomed = [(r, why) for r in reports if r not in failed and (why := _prune_reason(r, now, older_than, revoked))]
    if doomed and not dry_run:
        store.delete([r.fingerprint for r, _ in doomed], deadline)
    return doomed, failed, len(reports)
