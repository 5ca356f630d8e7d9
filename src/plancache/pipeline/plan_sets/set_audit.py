"""Plan sets in ``verify``, ``ls`` and ``prune`` of a store: one report per set object.

A set (or a replica of one) is verified exactly as a booting node verifies it: under the
set's own name (a replica too: its bytes must be the set's), through
:meth:`TrustPolicy.verify_set`. Without trusted keys (``ls``), the members a set *claims* are
shown unverified.

Bounded: one deadline for the listing and every read (the command's ``--timeout``, never a
fresh budget per read), and one set's bytes in memory at a time: each is read, verified and
reduced to its small report and digests, then dropped, whatever the number or size of sets.

Rollbacks: the verified copies of one set are compared once all of them are read. A copy whose
bytes differ from the newest verified copy (the set itself at a tie; a replica when the set is
gone or fails), or that holds a member signed earlier than the per-plan object (or signed at
the same time with other plan bytes), is ``digest-mismatch``: an older bake, a rollback for the
nodes that read that copy, even though it verifies on its own.

``prune`` deletes the sets that hold a plan it deletes (else the set would still serve it) or
a plan the store no longer holds; all or nothing (:func:`prune_sets`).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ...clock import Deadline
from ...storage.plan_set_objects import delete_sets, read_set, set_names
from ...storage.store import Store
from ...trust.errors import PlanCacheError, Reason, StoreError
from ...trust.plans.plan import plan_name
from ...trust.plans.plan_set import claimed_members
from ...trust.plans.plan_set_names import SET_PREFIX, SET_SUFFIX, set_object_id
from ...trust.policy import TrustPolicy
from ...trust.statement import format_time, parse_time
from ..keyless_report import keyless_facts, signers_of
from ..resolver import utcnow

if TYPE_CHECKING:
    from ..audit import PlanReport

STORE_ERROR = "store-error"

PlanFacts = Mapping[str, "tuple[str, datetime]"]
"""Per-plan objects that verified: fingerprint -> (sha256 of the plan bytes, signed_at)."""


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
    signed_at: str | None = None
    """The set statement's signing time, for a verified copy: which bake it is."""
    signed_by: list[dict[str, Any]] = field(default_factory=list)
    """Who signed a verified copy, as a plan's report says it (:func:`.keyless_report.signed_by`:
    name and key id; a keyless signer's identity, issuer and log index)."""
    keyless: list[dict[str, Any]] = field(default_factory=list)
    """A verified copy's keyless signers, as a plan's report lists them."""

    @property
    def ok(self) -> bool:
        return self.status in ("valid", "unverified")

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class _Copy:
    """What is kept of a verified copy once its bytes are dropped: enough to compare it."""

    report: SetReport
    digest: str
    signed_at: datetime
    members: tuple[tuple[str, str, datetime | None], ...]
    """(fingerprint, sha256 of its plan bytes, its own statement's signed_at) per member."""


def plan_facts(
    reports: Iterable[PlanReport], digests: Mapping[str, str]
) -> dict[str, tuple[str, datetime]]:
    """:data:`PlanFacts` of the per-plan objects that verified (an unverified claim is no
    evidence that a set is older); ``digests`` are the plan bytes' sha256 as fetched."""
    return {
        r.fingerprint: (digests[r.fingerprint], parse_time(r.signed_at, "signed_at"))
        for r in reports
        if r.ok and r.signed_at and r.fingerprint in digests
    }


def _listed_id(name: str) -> tuple[str, int]:
    """(set id, replica index) of a name :func:`set_names` listed: it lists only the names that
    have one."""
    found = set_object_id(name)
    assert found is not None, name
    return found


def audit_sets(
    store: Store,
    policy: TrustPolicy | None,
    now: datetime,
    *,
    deadline: Deadline | None = None,
    plans: PlanFacts | None = None,
) -> list[SetReport]:
    """A report per set or replica object the store lists (one listing, one read each, all
    inside one deadline), copies of one set compared with each other and with ``plans``."""
    deadline = store.deadline(deadline)
    reports: list[SetReport] = []
    names = set_names(store, deadline)  # sorted: the copies of one set are adjacent
    for _, group in itertools.groupby(names, key=lambda n: _listed_id(n)[0]):
        copies = []
        for name in sorted(group, key=lambda n: _listed_id(n)[1]):
            report, copy = _audit_one(store, name, policy, now, deadline)
            reports.append(report)
            if copy is not None:
                copies.append(copy)
        _compare(copies, plans or {})
    return reports


def _audit_one(
    store: Store, name: str, policy: TrustPolicy | None, now: datetime, deadline: Deadline
) -> tuple[SetReport, _Copy | None]:
    """One object read, verified and reduced to its report (and, verified, its digests); its
    bytes are dropped on return."""
    ident, replica = _listed_id(name)
    report = SetReport(name, f"{SET_PREFIX}{ident}{SET_SUFFIX}", replica)
    if deadline.expired():  # no read is started that cannot finish in the budget
        report.status, report.reason = STORE_ERROR, Reason.TIMEOUT.value
        report.detail = f"cannot read {name}: no time left in the budget"
        return report, None
    try:
        data = read_set(store, name, deadline)
    except StoreError as exc:
        report.status, report.reason, report.detail = STORE_ERROR, exc.reason.value, exc.detail
        return report, None
    except PlanCacheError as exc:  # read, and refused (too large): bad bytes, not a failed store
        report.reason, report.detail = exc.reason.value, exc.detail
        return report, None
    if data is None:
        report.reason, report.detail = "missing", "listed, then gone"
        return report, None
    try:
        if policy is None:  # ls without keys, prune: what the set claims, shown as unverified
            report.fingerprints = claimed_members(data)
            report.status, report.reason = "unverified", "unverified"
            return report, None
        verified = policy.verify_set(report.set, data, now)
    except (
        PlanCacheError
    ) as exc:  # with keys, a set that fails shows no members: a claim is no evidence
        report.reason, report.detail = exc.reason.value, exc.detail
        return report, None
    report.fingerprints = [plan.fingerprint for plan in verified.plans]
    report.signers = list(verified.signers)
    report.signed_by = signers_of(verified)
    report.keyless = keyless_facts(verified.identities)
    report.signed_at = format_time(verified.statement.signed_at)
    report.status, report.reason = "valid", "ok"
    members = tuple(
        (
            p.fingerprint,
            hashlib.sha256(p.plan_bytes).hexdigest(),
            p.statement.signed_at if p.statement else None,
        )
        for p in verified.plans
    )
    return report, _Copy(
        report, hashlib.sha256(data).hexdigest(), verified.statement.signed_at, members
    )


def _compare(copies: list[_Copy], plans: PlanFacts) -> None:
    """Fail every verified copy that is older than another copy of its set or than a per-plan
    object: it verifies on its own, but the nodes that read it would apply yesterday's bake."""
    if not copies:
        return
    newest = max(copies, key=lambda c: (c.signed_at, c.report.replica == 0))
    for copy in copies:
        if copy.digest == newest.digest:
            continue
        when = (
            f"signed {format_time(copy.signed_at)}; "
            f"{newest.report.name} signed {format_time(newest.signed_at)}"
        )
        if copy.report.replica and newest.report.replica == 0:
            _older(
                copy.report,
                f"replica bytes differ from {newest.report.name} ({when}): an older bake",
            )
        else:
            _older(
                copy.report,
                f"bytes differ from the newest copy {newest.report.name} ({when}): a rollback "
                "for the nodes reading this copy",
            )
    for copy in copies:
        for fp, sha, signed in copy.members:
            held = plans.get(fp)
            if (
                held is None
                or signed is None
                or signed > held[1]
                or (signed == held[1] and sha == held[0])
            ):
                continue
            _older(
                copy.report,
                f"holds {fp} signed {format_time(signed)}, but {plan_name(fp)} in the store is "
                f"signed {format_time(held[1])}"
                + (" with other bytes" if signed == held[1] else "")
                + ": an older bake, a rollback for the nodes reading this copy",
            )
            break


def _older(report: SetReport, detail: str) -> None:
    if report.status == "valid":  # the first reason found is the one told
        report.status, report.reason, report.detail = (
            "invalid",
            Reason.DIGEST_MISMATCH.value,
            detail,
        )


@dataclass
class SetPrune:
    """What prune did to the sets: all or nothing, see :func:`prune_sets`."""

    deleted: list[str] = field(default_factory=list)
    """Sets deleted (or, in a dry run, that would be)."""
    errors: list[SetReport] = field(default_factory=list)
    """Sets that could not be read (then nothing was deleted) or deleted (then no plan may be)."""


def prune_sets(
    store: Store,
    deleted: Iterable[str],
    present: Iterable[str],
    *,
    deadline: Deadline | None = None,
    dry_run: bool = False,
) -> SetPrune:
    """Delete (or name, in a dry run) the set objects holding a plan about to be deleted or one
    the store no longer lists (``present``). Called before the plans are deleted, and the
    plans may be deleted only if ``errors`` is empty: a set that cannot be read may hold any
    plan (its name cannot be inverted), so then no set is deleted and the caller deletes no
    plan either; a set that cannot be deleted would go on serving the plans, so those stay too.
    Members are read as claimed: deleting needs no trust (as ``prune --older-than`` reads
    dates as written). Without this, a set would serve a pruned plan: its members verify alone."""
    gone, listed = set(deleted), set(present)
    outcome, doomed = SetPrune(), []
    deadline = store.deadline(deadline)  # one budget for the listing, the reads and the deletes
    for report in audit_sets(store, None, utcnow(), deadline=deadline):
        if report.status == STORE_ERROR:
            outcome.errors.append(report)
        elif report.reason != "missing" and (
            not report.fingerprints
            or any(fp in gone or fp not in listed for fp in report.fingerprints)
        ):
            doomed.append(report.name)
    if outcome.errors:
        return outcome
    failed = delete_sets(store, doomed, deadline) if doomed and not dry_run else {}
    outcome.deleted = [name for name in doomed if name not in failed]
    for name, exc in failed.items():
        ident, replica = _listed_id(name)
        outcome.errors.append(
            SetReport(
                name,
                f"{SET_PREFIX}{ident}{SET_SUFFIX}",
                replica,
                STORE_ERROR,
                exc.reason.value,
                f"not deleted: {exc.detail}",
            )
        )
    return outcome
