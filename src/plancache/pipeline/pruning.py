"""Prune a store's plans: judge each under a criterion, delete those that meet it, if unchanged.

It moves bytes only; what may be deleted (old by its statement's date, unsigned, or failing
verification under the trusted keys) is decided here from the trust core's answers, and the
command only renders the outcome. It can be a dry run that changes nothing.

With a ``subject`` (a registry: ``prune --subject IMAGE``) one name can be claimed by several
manifests attached to the image, and a read takes the newest
(:meth:`..storage.oci.registry.RegistryBackend.candidate_manifests`).
A co-tenant who may push but holds no key can attach any number of them, each newer than the
signed plan: past ``MAX_CANDIDATES`` of them no reader reaches the signed one. So after a
round's deletes, the names it deleted are judged again, as a reader now takes them, and
deleted again if they still meet the criterion, round after round while a round deletes
something, at most :data:`MAX_ROUNDS` rounds, all within the command's one deadline: one run
removes every candidate that fails, and stops at the first that does not (what readers take).
Each round deletes only what it read and judged (:mod:`..storage.conditional_deletes`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ..storage.store import Store
from ..trust.errors import ConfigError, Reason
from ..trust.plans.gate import Verdict
from ..trust.policy import TrustPolicy
from ..trust.statement import parse_time
from .audit import INVALID, STORE_REASONS, UNSIGNED, PlanReport, Tally, check_many

if TYPE_CHECKING:
    from ..clock import Deadline
    from .plan_sets.set_audit import SetPrune

__all__ = ["MAX_ROUNDS", "PruneOutcome", "prune_plans"]

MAX_ROUNDS = 64
"""Judge-and-delete rounds of one prune at most. Only a store with a ``subject`` has a second
round (elsewhere a name is one object); each round deletes one candidate of each name still
failing, so one run removes up to this many per name, within its deadline. Past it the
outcome says more may remain (``more_candidates``): another run goes on."""


@dataclass
class PruneOutcome:
    doomed: list[tuple[PlanReport, str]] = field(default_factory=list)
    """Plans deleted (or, in a dry run, that would be), with why: one entry per object judged
    for deletion (with a ``subject``, a name's later candidates too)."""
    failed: list[PlanReport] = field(default_factory=list)
    """Plans that could not be read: kept, and the command fails."""
    changed: list[str] = field(default_factory=list)
    """Judged for deletion but changed in the store before the delete: kept."""
    seen: int = 0
    sets: SetPrune | None = None
    """The plan sets deleted first (or that would be), and those that could not be read or
    deleted: then no plan was deleted (or, in a dry run, would be)."""
    gone: list[tuple[PlanReport, str, str]] | None = None
    """Once deletes ran: each object deleted, with why and the store's version of what was
    deleted (a registry's manifest digest, an ETag, a generation; "" where it has none)."""
    survivors: set[str] = field(default_factory=set)
    """Names deleted in one round whose next candidate was kept (or changed, or unread)."""
    rounds: int = 0
    more_candidates: bool = False
    """More attached candidates than listed may meet the criterion: :data:`MAX_ROUNDS` were run
    and the last still deleted, or a dry run (one round: what a delete uncovers is not judged)."""

    @property
    def refused(self) -> bool:
        """A plan set stood in the way: every plan was kept, so no set serves a pruned plan."""
        return bool(self.sets and self.sets.errors)

    @property
    def deleted(self) -> list[tuple[PlanReport, str]]:
        if self.refused:
            return []
        if self.gone is not None:
            return [(r, why) for r, why, _ in self.gone]
        return [(r, why) for r, why in self.doomed if r.fingerprint not in self.changed]

    @property
    def kept(self) -> int:
        """Plans still in the store: those seen, less those of which every candidate judged was
        deleted (one whose later candidate was kept is kept)."""
        emptied = {r.fingerprint for r, _ in self.deleted} - self.survivors
        return self.seen - len(emptied)


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


@dataclass
class _Judge:
    """One criterion, judged the same way in every round."""

    store: Store
    deadline: Deadline
    now: datetime
    policy: TrustPolicy | None
    older_than: timedelta | None
    criterion: str

    def round(
        self, names: Iterable[str], progress: Tally | None = None
    ) -> tuple[list[PlanReport], list[tuple[PlanReport, str]], dict[str, str]]:
        """(every report, the doomed with why, fingerprint -> content digest judged), streamed:
        digests kept, not bytes."""
        from ..storage.conditional_deletes import content_digest
        from .audit import STREAM_CHUNK

        stream = self.store.fetch_stream(
            names, self.deadline, on_done=progress.advance if progress else None
        )
        reports: list[PlanReport] = []
        doomed: list[tuple[PlanReport, str]] = []
        judged: dict[str, str] = {}
        while chunk := list(itertools.islice(stream, STREAM_CHUNK)):
            chunk_reports = check_many(chunk, self.policy, self.now)
            for result, report in zip(chunk, chunk_reports, strict=True):
                why = _prune_reason(report, self.now, self.older_than, self.criterion)
                if why:
                    doomed.append((report, why))
                    judged[report.fingerprint] = content_digest(result.plan_bytes, result.sig_bytes)
            reports.extend(chunk_reports)
        return reports, doomed, judged


def _keys_look_wrong(criterion: str, reports: list[PlanReport]) -> bool:
    """``invalid`` where no plan verifies and some are signed by keys the policy does not know:
    the trusted keys are more likely wrong than the whole store."""
    return (
        criterion == "invalid"
        and bool(reports)
        and not any(r.ok for r in reports)
        and any(r.reason == Reason.UNTRUSTED_KEY.value for r in reports)
    )


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
    With a ``subject``, the names deleted are judged again, round after round (the module's
    docstring); a dry run judges one round.

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
    if progress:
        progress.start(0)  # the store's size is not known before it is listed
    judge = _Judge(store, deadline, now, policy if needs_policy else None, older_than, criterion)
    outcome = PruneOutcome(rounds=1)
    reports, outcome.doomed, judged = judge.round(store.iter_fingerprints(deadline), progress)
    if not reports:
        from .locations import require_existing

        require_existing(store, deadline)
    outcome.seen = len(reports)
    outcome.failed = [r for r in reports if r.reason in STORE_REASONS]
    if _keys_look_wrong(criterion, reports):
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
    if judged and dry_run and _many_candidates(store):
        outcome.more_candidates = True  # and each name may keep a candidate that verifies
        outcome.survivors.update(judged)
    if judged and not dry_run and not outcome.refused:
        _delete_rounds(judge, outcome, judged, reports, unconditional)
    return outcome


def _delete_rounds(
    judge: _Judge,
    outcome: PruneOutcome,
    judged: dict[str, str],
    reports: list[PlanReport],
    unconditional: bool,
) -> None:
    """Delete what round one judged; with a ``subject``, judge the names deleted again and
    delete again, while a round deletes something (at most :data:`MAX_ROUNDS` rounds)."""
    from ..storage.conditional_deletes import delete_if_unchanged

    store = judge.store
    doomed = outcome.doomed
    outcome.gone = []
    while True:
        versions: dict[str, str] = {}
        deleted, changed = delete_if_unchanged(
            store,
            judged,
            deadline=judge.deadline,
            unconditional=unconditional,
            versions=versions,
            checked=outcome.rounds > 1,  # the store showed it honours preconditions in round one
        )
        outcome.changed += changed
        outcome.survivors.update(changed)
        gone = set(deleted)
        outcome.gone += [
            (r, why, versions.get(r.fingerprint, "")) for r, why in doomed if r.fingerprint in gone
        ]
        if not deleted or not _many_candidates(store):
            return
        if outcome.rounds == MAX_ROUNDS:
            outcome.more_candidates = True
            outcome.survivors.update(deleted)  # not judged further: they may hold more
            return
        outcome.rounds += 1
        again, doomed, judged = judge.round(deleted)
        stopped = [r for r in again if r.reason in STORE_REASONS]
        outcome.failed += stopped
        reports = reports + again
        if _keys_look_wrong(judge.criterion, reports):
            doomed, judged = [], {}  # as round one would: the keys, not the store, look wrong
        outcome.doomed += doomed
        outcome.survivors.update(
            r.fingerprint
            for r in again
            if r.fingerprint not in judged and r.reason != Verdict.NO_PLAN.value
        )
        if not judged:
            return


def _many_candidates(store: Store) -> bool:
    """Whether a name in ``store`` can stand for more than one object: a registry's with a
    ``subject`` (the image's referrers)."""
    return store.subject is not None
