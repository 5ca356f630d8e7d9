"""Whole-store work beside the resolver: push a directory's plans, prune a store's plans.

Both move bytes only; what may be uploaded (signed, or explicitly allowed unsigned) and
what may be deleted (old by its statement's date, unsigned, or failing verification under
the trusted keys) is decided here from the trust core's answers, and the commands only
render the outcome. Both can be dry runs that change nothing, local or remote.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ..storage.listing import md5_hex
from ..storage.local.localdir import LocalPlanDir
from ..storage.store import Store
from ..trust.errors import ConfigError, PlanCacheError, Reason
from ..trust.keyring.keys import Signer
from ..trust.plans.gate import Verdict
from ..trust.plans.plan import (
    fingerprint_of_plan_name,
    fingerprint_of_sig_name,
    plan_name,
    sig_name,
)
from ..trust.policy import TrustPolicy
from ..trust.statement import parse_time
from .audit import INVALID, STORE_REASONS, UNSIGNED, PlanReport, Tally, check_many
from .directory_signing import SigningRequest, sign_one

if TYPE_CHECKING:
    from ..clock import Deadline
    from .plan_sets.set_audit import SetPrune

__all__ = ["STORE_REASONS", "PruneOutcome", "PushEntry", "PushRequest", "prune_plans", "push_plans"]


@dataclass
class PushEntry:
    fingerprint: str
    action: str = ""
    """``uploaded``, ``unchanged`` or ``refused`` (in a dry run: what would happen)."""
    detail: str = ""
    """Why refused; or ``signed`` (a new signature was made), ``signed first`` (dry run: would
    be), ``unsigned``."""


@dataclass(frozen=True)
class PushRequest:
    """What a push was asked to do, beyond where from and where to."""

    signer: Signer | None = None
    """Signs plans that lack a current signature first; None uploads what is already signed."""
    signing: SigningRequest = field(default_factory=SigningRequest)
    allow_unsigned: bool = False
    fingerprints: Sequence[str] | None = None
    """Only these plans (a missing one is refused); None: every plan in the directory."""
    dry_run: bool = False
    """Sign nothing, upload nothing: the entries say what would happen."""


def _fp_of(name: str) -> str:
    return fingerprint_of_plan_name(name) or fingerprint_of_sig_name(name) or name


def _unchanged(store: Store, objects: dict[str, bytes], deadline: Deadline) -> set[str]:
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
    fps = sorted({_fp_of(n) for n in to_compare})
    for remote in store.fetch_many(fps, deadline):
        for name, held in (
            (plan_name(remote.fingerprint), remote.plan_bytes),
            (sig_name(remote.fingerprint), remote.sig_bytes),
        ):
            if name in to_compare and held is not None and held == objects[name]:
                same.add(name)
    return same


def _plan_share(objects: dict[str, bytes], progress: Tally | None) -> Callable[[int], None] | None:
    """Progress per uploaded object, counted in plans (a plan is its plan and sidecar objects)."""
    if progress is None or not objects:
        return None
    plans = len({_fp_of(n) for n in objects})
    progress.start(plans)
    share = plans / len(objects)
    return lambda count: progress.advance(count * share)


def push_plans(
    directory: LocalPlanDir,
    store: Store,
    deadline: Deadline,
    now: datetime,
    *,
    push: PushRequest = PushRequest(),
    progress: Tally | None = None,
) -> tuple[list[PushEntry], int]:
    """Sign (with ``push.signer``) and upload every plan and sidecar the store lacks byte for
    byte.

    A dry run's entries say what would happen (a plan that would be signed first counts as
    one to upload). Returns one entry per plan and the number of objects uploaded (or that
    would be).
    """
    signer, request, allow_unsigned, fingerprints, dry_run = (
        push.signer,
        push.signing,
        push.allow_unsigned,
        push.fingerprints,
        push.dry_run,
    )
    entries: list[PushEntry] = []
    objects: dict[str, bytes] = {}
    names: dict[str, list[str]] = {}
    would_sign: set[str] = set()
    signed: set[str] = set()
    present = set(directory.fingerprints())
    for fp in present if fingerprints is None else list(dict.fromkeys(fingerprints)):
        entry = PushEntry(fp)
        entries.append(entry)
        if fp not in present:
            entry.action, entry.detail = (
                "refused",
                f"{Verdict.NO_PLAN}: no plan file {plan_name(fp)} in {directory}",
            )
            continue
        try:
            if signer is not None:
                outcome = sign_one(directory, fp, signer, now, request, write=not dry_run)
                if outcome.refused:
                    entry.action, entry.detail = "refused", f"{outcome.reason}: {outcome.detail}"
                    continue
                if outcome.action in ("signed", "replaced"):
                    signed.add(fp)  # a fresh statement: it records this request's facts
                if dry_run and outcome.action != "kept":
                    would_sign.add(fp)
            plan, sig = directory.read(fp)
        except PlanCacheError as exc:
            entry.action, entry.detail = "refused", f"{exc.reason.value}: {exc.detail}"
            continue
        if plan is None:
            entry.action, entry.detail = "refused", f"{Verdict.NO_PLAN}: plan file vanished"
            continue
        if fp in would_sign:
            names[fp] = [plan_name(fp), sig_name(fp)]
            objects[plan_name(fp)] = plan
            continue  # its sidecar does not exist yet: it is certainly uploaded
        if sig is None and not allow_unsigned:
            entry.action, entry.detail = (
                "refused",
                "unsigned (sign it: --key KEY, or --allow-unsigned)",
            )
            continue
        names[fp] = [plan_name(fp)] + ([sig_name(fp)] if sig is not None else [])
        objects[plan_name(fp)] = plan
        if sig is not None:
            objects[sig_name(fp)] = sig
    same = _unchanged(store, objects, deadline) if objects else set()
    upload = {n: d for n, d in objects.items() if n not in same}
    upload_names = set(upload) | {sig_name(fp) for fp in would_sign}
    if not dry_run:
        store.put_many(upload, deadline, on_done=_plan_share(upload, progress))
    for entry in entries:
        if entry.fingerprint in names:
            mine = names[entry.fingerprint]
            entry.action = "uploaded" if any(n in upload_names for n in mine) else "unchanged"
            entry.detail = (
                "signed first"
                if entry.fingerprint in would_sign
                else "signed"
                if entry.fingerprint in signed
                else "unsigned"
                if len(mine) == 1
                else ""
            )
    return entries, len(upload_names)


# -- prune ----------------------------------------------------------------------------------------


@dataclass
class PruneOutcome:
    doomed: list[tuple[PlanReport, str]] = field(default_factory=list)
    """Plans deleted (or, in a dry run, that would be), with why."""
    failed: list[PlanReport] = field(default_factory=list)
    """Plans that could not be read: kept, and the command fails."""
    changed: list[str] = field(default_factory=list)
    """Judged for deletion but changed in the store before the delete: kept."""
    seen: int = 0
    sets: SetPrune | None = None
    """The plan sets deleted first (or that would be), and those that could not be read or
    deleted: then no plan was deleted (or, in a dry run, would be)."""

    @property
    def refused(self) -> bool:
        """A plan set stood in the way: every plan was kept, so no set serves a pruned plan."""
        return bool(self.sets and self.sets.errors)

    @property
    def deleted(self) -> list[tuple[PlanReport, str]]:
        if self.refused:
            return []
        return [(r, why) for r, why in self.doomed if r.fingerprint not in self.changed]


def _prune_reason(
    report: PlanReport, now: datetime, older_than: timedelta | None, criterion: str
) -> str | None:
    if report.reason in STORE_REASONS or report.reason == Verdict.NO_PLAN.value:
        return None  # unreadable or gone: nothing was judged
    if criterion == "revoked":
        return "revoked" if report.reason == Reason.REVOKED.value else None
    if criterion == "unsigned":
        return "unsigned" if report.status == UNSIGNED else None
    if criterion == "invalid":
        return report.reason if report.status in (INVALID, UNSIGNED) else None
    if report.signed_at is None or older_than is None:
        return None  # no readable signature date: nothing says it is old
    signed = parse_time(report.signed_at, "signed_at")
    return f"signed {report.signed_at}" if signed < now - older_than else None


def prune_plans(
    store: Store,
    deadline: Deadline,
    now: datetime,
    policy: TrustPolicy | None,
    *,
    older_than: timedelta | None = None,
    criterion: str = "older-than",
    dry_run: bool = False,
    progress: Tally | None = None,
    unconditional: bool = False,
) -> PruneOutcome:
    """Delete the plans that meet ``criterion``: ``older-than`` (signed before ``now -
    older_than``; dates as written, deleting needs no trust), ``unsigned`` (no sidecar),
    ``revoked`` (every trusted signature by a revoked key) or ``invalid`` (fails
    verification for any reason but a store error). The last two need ``policy``.

    Each plan is deleted only if the store still holds the bytes that were judged: re-read and
    compared right before the delete, and on S3, GCS and Azure deleted on the condition that it
    is still the version re-read (ETag or generation), so a plan re-pushed even after that
    re-read is kept and listed in ``changed`` (:mod:`..storage.conditional_deletes`). There,
    before the first delete, the store must show that it honours that precondition (else
    ConfigError, nothing deleted); ``unconditional`` deletes after the re-read without it.
    ``invalid`` refuses to delete anything when no plan verifies and some are signed by keys
    the policy does not know: the trusted keys are more likely wrong than the whole store.

    Plan sets go first (:func:`.plan_sets.set_audit.prune_sets`): those holding a plan to delete (or
    one the store no longer holds) are deleted before any plan, so a failure leaves plans that
    a set still serves, never a set serving a deleted plan; a set that cannot be read (it may
    hold any plan) or deleted keeps every plan (``outcome.refused``; the command fails).

    Raises:
        ConfigError: ``revoked`` or ``invalid`` without a ``policy`` (``needs trusted keys``);
            ``invalid`` where no plan verifies and some are signed by keys the policy does not
            know (nothing deleted); a store that does not exist
            (:func:`.locations.require_existing`); all ``config-error``.
    """
    needs_policy = criterion in ("revoked", "invalid")
    if needs_policy and policy is None:
        raise ConfigError(f"prune --{criterion} needs trusted keys")
    from ..storage.conditional_deletes import content_digest
    from .audit import STREAM_CHUNK

    if progress:
        progress.start(0)  # the store's size is not known before it is listed
    stream = store.fetch_stream(
        store.iter_fingerprints(deadline), deadline, on_done=progress.advance if progress else None
    )
    reports: list[PlanReport] = []
    outcome = PruneOutcome()
    judged: dict[str, str] = {}
    # Streamed: digests kept, not bytes.
    while chunk := list(itertools.islice(stream, STREAM_CHUNK)):
        chunk_reports = check_many(chunk, policy if needs_policy else None, now)
        for result, report in zip(chunk, chunk_reports, strict=True):
            why = _prune_reason(report, now, older_than, criterion)
            if why:
                outcome.doomed.append((report, why))
                judged[report.fingerprint] = content_digest(result.plan_bytes, result.sig_bytes)
        reports.extend(chunk_reports)
    if not reports:
        from .locations import require_existing

        require_existing(store, deadline)
    outcome.seen = len(reports)
    outcome.failed = [r for r in reports if r.reason in STORE_REASONS]
    if (
        criterion == "invalid"
        and reports
        and not any(r.ok for r in reports)
        and any(r.reason == Reason.UNTRUSTED_KEY.value for r in reports)
    ):
        raise ConfigError(
            f"none of the {len(reports)} plan(s) in {store} verifies and some are signed by keys "
            "not in the trusted keys: check --trusted-keys; nothing deleted"
        )
    from .plan_sets.set_audit import prune_sets

    present = [r.fingerprint for r in reports if r.reason != Verdict.NO_PLAN.value]
    outcome.sets = prune_sets(
        store,
        [r.fingerprint for r, _ in outcome.doomed],
        present,
        deadline=deadline,
        dry_run=dry_run,
    )
    if judged and not dry_run and not outcome.refused:
        from ..storage.conditional_deletes import delete_if_unchanged

        _, outcome.changed = delete_if_unchanged(
            store, judged, deadline=deadline, unconditional=unconditional
        )
    return outcome
