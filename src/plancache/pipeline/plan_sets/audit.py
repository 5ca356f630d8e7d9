"""Plan sets in ``verify``, ``ls`` and ``prune`` of a store: one report per set object.

A set (or a replica of one) is verified exactly as a booting node verifies it: under the
set's own name (a replica too: its bytes must be the set's), through
:meth:`TrustPolicy.verify_set`. A replica whose bytes differ from its set's is reported as
``digest-mismatch`` even if it verifies on its own: it would be an older bake, a rollback for
the nodes that read that copy. Without trusted keys (``ls``), the members a set *claims* are
shown unverified. ``prune`` deletes the sets that hold a plan it deletes (else the set would
still serve it) or a plan the store no longer holds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Iterable

from ...storage.plansets import delete_sets, read_set, set_names
from ...storage.store import Store
from ...trust.errors import PlanCacheError, Reason
from ...trust.plans.planset import SET_PREFIX, SET_SUFFIX, claimed_members, set_object_id
from ...trust.policy import TrustPolicy


@dataclass
class SetReport:
    name: str
    set: str
    """The set's own name (a replica's set; the name itself for a set)."""
    replica: int
    status: str = "invalid"
    """``valid``, ``invalid``, ``unverified`` (no trusted keys), or ``store-error``."""
    reason: str = ""
    detail: str = ""
    fingerprints: list[str] = field(default_factory=list)
    signers: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status in ("valid", "unverified")

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def audit_sets(store: Store, policy: TrustPolicy | None, now: datetime, deadline: float | None = None) -> list[SetReport]:
    """A report per set or replica object the store lists (one listing, one read each)."""
    reports: list[SetReport] = []
    primaries: dict[str, bytes | None] = {}
    for name in set_names(store, deadline):
        ident, replica = set_object_id(name)  # type: ignore[misc]
        own = f"{SET_PREFIX}{ident}{SET_SUFFIX}"
        report = SetReport(name, own, replica)
        reports.append(report)
        try:
            data = read_set(store, name, deadline)
            if replica and own not in primaries:
                primaries[own] = read_set(store, own, deadline)
        except PlanCacheError as exc:
            report.status, report.reason, report.detail = "store-error", exc.reason.value, exc.detail
            continue
        if replica == 0:
            primaries[own] = data
        if data is None:
            report.reason, report.detail = "missing", "listed, then gone"
            continue
        try:
            if policy is None:  # ls without keys, prune: what the set claims, shown as unverified
                report.fingerprints = claimed_members(data)
                report.status, report.reason = "unverified", "unverified"
                continue
            verified = policy.verify_set(own, data, now)
        except PlanCacheError as exc:  # with keys, a set that fails shows no members: a claim is no evidence
            report.reason, report.detail = exc.reason.value, exc.detail
            continue
        report.fingerprints = [plan.fingerprint for plan in verified.plans]
        report.signers = list(verified.signers)
        if replica and primaries.get(own) not in (None, data):
            report.reason, report.detail = Reason.DIGEST_MISMATCH.value, f"replica bytes differ from {own}"
            continue
        report.status, report.reason = "valid", "ok"
    return reports


def prune_sets(store: Store, deleted: Iterable[str], deadline: float | None = None, dry_run: bool = False) -> list[str]:
    """Delete (or name, in a dry run) the set objects holding a plan just deleted or one the
    store no longer lists; returns their names. Their members are read as claimed: deleting
    needs no trust (as ``prune --older-than`` reads dates as written). Without this, a set
    would go on serving a plan prune deleted: its members verify on their own."""
    gone = set(deleted)
    present = set(store.fingerprints(deadline))
    doomed = []
    for report in audit_sets(store, None, datetime.now(), deadline):
        if report.status == "store-error":
            continue
        if not report.fingerprints or any(fp in gone or fp not in present for fp in report.fingerprints):
            doomed.append(report.name)
    if doomed and not dry_run:
        delete_sets(store, doomed, deadline)
    return doomed
