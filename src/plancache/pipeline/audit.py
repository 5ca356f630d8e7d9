"""One report per plan, for ``verify``, ``ls``, ``prune`` and offline scripts.

Verification is CPU-bound (Ed25519 plus hashing), so thousands of plans are checked in a
process pool with one worker per core; a handful are checked inline, where a pool's start-up
would cost more than it saves. For a local directory each worker reads its own share, so
reading is parallel too. Every plan goes through the same :func:`verify_result` as a pull.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from ..storage.local.localdir import LocalPlanDir
from ..trust.errors import PlanCacheError, Reason
from ..trust.plans.gate import Verdict
from ..trust.plans.plan import parse_plan, plan_name
from ..trust.policy import TrustPolicy
from ..trust.result import PlanResult
from ..trust.statement import format_time, parse_statement
from .keyless_report import claimed, keyless_facts, signed_by
from .locations import Location, open_location, require_existing
from .resolver import collector_paused, verify_result

if TYPE_CHECKING:
    from ..clock import Deadline
    from ..storage.store import Store

POOL_MIN_PLANS = 200
MAX_JOBS = 64
"""Worker processes at most, whatever ``--jobs`` asks: more only costs memory and start-up."""
STREAM_CHUNK = 2000
"""Plans from a store held at once while they are checked (a few MiB at the plans' size caps)."""

VALID = "valid"
INVALID = "invalid"
UNSIGNED = "unsigned"
UNVERIFIED = "unverified"
MISSING = "missing"


class Tally(Protocol):
    """Progress of long work, counted in plans: ``start`` once the total is known, then
    ``advance`` as plans (or fractions of one: a plan is two objects) are done."""

    def start(self, total: int) -> None: ...

    def advance(self, count: float = 1) -> None: ...


STORE_REASONS = (Reason.STORE_ERROR.value, Reason.TIMEOUT.value, Reason.CONFIG.value)
"""Reasons that say the bytes could not be moved (the store failed, or cannot be used as
configured: exit 2), not that they are bad."""


@dataclass
class PlanReport:
    """What a person or a script needs of one plan: status, reason, signers, numbers."""

    fingerprint: str
    status: str
    reason: str
    detail: str = ""
    signers: list[str] = field(default_factory=list)
    signed_at: str | None = None
    expires_at: str | None = None
    comment: str = ""
    kv_cache_memory_bytes: int | None = None
    free_memory_baseline: int | None = None
    signer_ids: list[str] = field(default_factory=list)
    """Key ids (``SHA256:…``) of the signers, in the order of ``signers``."""
    provenance: dict[str, Any] | None = None
    """The statement's provenance facts (the gate's conditions among them): signed, when the
    plan verified; claimed, for an ``unverified`` one; None when there is no statement to read."""
    inputs: dict[str, Any] | None = None
    """The fingerprint's inputs the statement signs (issue 20), for a ``valid`` plan only: an
    unverified claim is never shown as evidence; None when not verified or not recorded."""
    config_parts: dict[str, Any] | None = None
    """Beside ``inputs``: each part of vLLM's configuration, hashed (a valid plan's, signed)."""
    keyless: list[dict[str, Any]] = field(default_factory=list)
    """Keyless signers of a valid plan: identity, issuer, log index and time (keyless_report)."""
    candidates: list[dict[str, Any]] = field(default_factory=list)
    """With a ``subject``, for a plan that failed: each other manifest attached to the image
    with its name, judged (digest, status, reason, detail, valid: :mod:`.candidate_audit`)."""
    evidence: dict[str, Any] | str | None = None
    """How a valid plan was measured (issue 49: versions, compile state, vLLM's profiling
    numbers), signed; ``"none"`` for a plan signed without it; None when not verified."""

    @property
    def ok(self) -> bool:
        return self.status == VALID

    @property
    def outcome(self) -> str:
        """What happened, in one word: ``status``, except that an invalid plan says whether it
        is ``missing``, or could not be read (``store-error``, ``timeout``, ``config-error``)."""
        if self.status != INVALID:
            return self.status
        if self.reason == Verdict.NO_PLAN.value:
            return MISSING
        return self.reason if self.reason in STORE_REASONS else INVALID

    def __reduce__(self) -> tuple[type[PlanReport], tuple[Any, ...]]:
        """Pickled as its field values in order: a pool's workers send back 10,000 of these for
        a 10,000-plan ``verify``, and the default (the class and a dict of 16 named fields each)
        was ~3 us a report to pickle and as much to unpickle, in the parent's serial part."""
        return (PlanReport, _report_values(self))

    def to_json(self) -> dict[str, object]:
        """The report as JSON: every field, plus ``signed_by`` pairing each signer's name with its
        key id and ``outcome``."""
        pairs = signed_by(self.signers, self.signer_ids, self.keyless)
        # flat fields: no deep copy (asdict costs 90 us a plan)
        return {**vars(self), "signed_by": pairs, "outcome": self.outcome}


_report_values = operator.attrgetter(*(f.name for f in fields(PlanReport)))
"""A report's field values, in the order ``PlanReport(...)`` takes them (:meth:`__reduce__`)."""


def report_of(result: PlanResult) -> PlanReport:
    """A verified result's report, or the report of why it is not verified."""
    fp = result.fingerprint
    failure = result.error or result.write_error
    if failure is not None:
        status = UNSIGNED if failure.reason is Reason.UNSIGNED else INVALID
        return PlanReport(fp, status, failure.reason.value, failure.detail)
    vp = result.verified
    if vp is None:
        return PlanReport(fp, INVALID, Verdict.NO_PLAN.value, "plan file is missing")
    st = vp.statement
    return PlanReport(
        fingerprint=fp,
        status=VALID,
        reason="ok",
        signers=list(vp.signers),
        signer_ids=list(vp.key_ids),
        keyless=keyless_facts(vp.identities),
        signed_at=format_time(st.signed_at) if st else None,
        expires_at=format_time(st.expires_at) if st and st.expires_at else None,
        comment=st.comment if st else "",
        provenance=dict(st.provenance) if st else None,
        inputs=dict(st.inputs) if st and st.inputs else None,
        config_parts=dict(st.config_parts) if st and st.config_parts else None,
        evidence=dict(st.evidence) if st and st.evidence else "none",
        kv_cache_memory_bytes=vp.plan.kv_cache_memory_bytes,
        free_memory_baseline=vp.plan.free_memory_baseline,
    )


def describe_unverified(result: PlanResult) -> PlanReport:
    """What a plan and sidecar *claim*, for display when no trusted keys are configured.

    Nothing here is trusted: the values are shown so a person can look, with status
    ``unverified``, and both parsers are the same strict, capped ones verification uses.
    """
    fp = result.fingerprint
    report = PlanReport(fp, UNVERIFIED, "no-trusted-keys")
    if result.error is not None:  # the bytes could not be read: reported as a parse failure is
        error = result.error
        report.status, report.reason, report.detail = INVALID, error.reason.value, error.detail
        return report
    try:
        if result.plan_bytes is None:
            return PlanReport(fp, INVALID, Verdict.NO_PLAN.value, "plan file is missing")
        plan = parse_plan(result.plan_bytes, plan_name(fp))
        report.kv_cache_memory_bytes = plan.kv_cache_memory_bytes
        report.free_memory_baseline = plan.free_memory_baseline
        if result.sig_bytes is None:
            report.status, report.reason = UNSIGNED, Reason.UNSIGNED.value
            return report
        report.signer_ids, payload = claimed(result.sig_bytes)
        report.signers = list(report.signer_ids)
        st = parse_statement(payload)
        report.signed_at = format_time(st.signed_at)
        report.expires_at = format_time(st.expires_at) if st.expires_at else None
        report.comment = st.comment
        report.provenance = dict(st.provenance)
    except PlanCacheError as exc:
        report.status, report.reason, report.detail = INVALID, exc.reason.value, exc.detail
    return report


def check(result: PlanResult, policy: TrustPolicy | None, now: datetime) -> PlanReport:
    """One result's report: verified under ``policy``, or described unverified without one."""
    if policy is None:
        return describe_unverified(result)
    return report_of(verify_result(result, policy, now))


def _check_chunk(
    args: tuple[Sequence[Any], LocalPlanDir | None, TrustPolicy | None, datetime],
) -> list[PlanReport]:
    work, directory, policy, now = args
    results: Sequence[PlanResult] = directory.fetch_many(work) if directory is not None else work
    return [check(result, policy, now) for result in results]


def _guided_chunks(work: Sequence[Any], jobs: int) -> list[Sequence[Any]]:
    """``work`` cut in input order into chunks that shrink as it runs out (guided scheduling):
    each a quarter of a worker's share of what is left, 32 to 1000 plans. The pool ends when
    its slowest worker does, so its last chunks must be short (a worker still on a 156-plan
    chunk while the other idles costs up to ~25 ms of a 10,000-plan verify); its first ones
    long, for fewer round trips through the parent, which shares the workers' cores (64 even
    chunks for 10,000 plans before, 36 now, the last ones of 32)."""
    chunks = []
    start = 0
    while start < len(work):
        size = min(1000, max(32, (len(work) - start) // (jobs * 4)))
        chunks.append(work[start : start + size])
        start += size
    return chunks


def check_many(
    work: Sequence[PlanResult] | Sequence[str],
    policy: TrustPolicy | None,
    now: datetime,
    *,
    jobs: int | None = None,
    directory: LocalPlanDir | None = None,
    progress: Tally | None = None,
) -> list[PlanReport]:
    """Reports in input order; uses every core (or ``jobs``) when there are many plans.

    ``work`` is a list of results, or of fingerprints when ``directory`` is given: then each
    worker reads its own share of the directory.
    """
    jobs = min(jobs or os.cpu_count() or 1, MAX_JOBS)
    if jobs == 1 or len(work) < POOL_MIN_PLANS:
        reports = _check_chunk((work, directory, policy, now))
        if progress:
            progress.advance(len(reports))
        return reports
    import multiprocessing  # only for many plans: a boot-time pull never pays for it
    from concurrent.futures import ProcessPoolExecutor

    chunks = _guided_chunks(work, jobs)
    reports = []
    context = (
        multiprocessing.get_context("fork")
        if "fork" in multiprocessing.get_all_start_methods()
        else None
    )
    # the parent only gathers acyclic reports meanwhile; a worker collects as usual
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=gc.enable)
    with pool, collector_paused():
        for chunk_reports in pool.map(_check_chunk, [(c, directory, policy, now) for c in chunks]):
            reports.extend(chunk_reports)
            if progress:
                progress.advance(len(chunk_reports))
    return reports


def all_valid(reports: Iterable[PlanReport]) -> bool:
    return all(r.ok for r in reports)


def audit_location(
    location: str | os.PathLike[str] | Location | None,
    policy: TrustPolicy | None,
    now: datetime,
    *,
    storage_options: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    jobs: int | None = None,
    progress: Tally | None = None,
) -> tuple[Location, list[PlanReport]]:
    """Every plan in a directory or store URL, verified under ``policy`` (or described
    unverified without one): what ``plancache verify`` and ``ls`` print.

    A location that lists no plans is checked for existence: a missing bucket or directory
    raises ConfigError rather than passing as an empty audit.
    """
    source: Location
    if location is None or isinstance(location, (str, os.PathLike)):
        source = open_location(location, storage_options, timeout)
    else:
        source = location
    if isinstance(source, LocalPlanDir):
        return source, audit_plans(
            source, list_plans(source), policy, now, jobs=jobs, progress=progress
        )
    deadline = source.deadline(None)  # the opening's own: one budget for the whole audit
    reports = audit_store(
        source, None, policy, now, jobs=jobs, progress=progress, deadline=deadline
    )
    if not reports:
        require_existing(source, deadline)
    return source, reports


def list_plans(source: Location, deadline: Deadline | None = None) -> list[str]:
    """The location's fingerprints; ConfigError when there are none because it does not exist.
    A store's listing ends by ``deadline`` (the command's one budget, when it has one)."""
    if isinstance(source, LocalPlanDir):
        fingerprints = source.fingerprints()
    else:
        fingerprints = source.fingerprints(deadline)
    if not fingerprints:
        require_existing(source, deadline)
    return fingerprints


def audit_plans(
    source: Location,
    fingerprints: Sequence[str],
    policy: TrustPolicy | None,
    now: datetime,
    *,
    jobs: int | None = None,
    progress: Tally | None = None,
    deadline: Deadline | None = None,
    digests: dict[str, str] | None = None,
) -> list[PlanReport]:
    """Reports for these plans of ``source``. ``progress`` counts plans: as they are read and
    verified from a directory, as they are fetched from a store (the slow part there).
    ``deadline`` and ``digests``: see :func:`audit_store` (a directory has neither)."""
    if progress:
        progress.start(len(fingerprints))
    if isinstance(source, LocalPlanDir):  # local files: the pool's workers read their own share
        return check_many(fingerprints, policy, now, jobs=jobs, directory=source, progress=progress)
    return audit_store(
        source,
        fingerprints,
        policy,
        now,
        jobs=jobs,
        progress=progress,
        deadline=deadline,
        digests=digests,
    )


def audit_store(
    store: Store,
    fingerprints: Iterable[str] | None,
    policy: TrustPolicy | None,
    now: datetime,
    *,
    jobs: int | None = None,
    progress: Tally | None = None,
    deadline: Deadline | None = None,
    digests: dict[str, str] | None = None,
) -> list[PlanReport]:
    """Reports for a store's plans (all it lists when ``fingerprints`` is None), streamed: plans
    are fetched and checked :data:`STREAM_CHUNK` at a time and only the reports are kept, so
    memory does not grow with the store's size. The listing and every fetch share one
    ``deadline`` (the caller's, else one taken now): no part starts a fresh budget.
    ``digests`` collects each fetched plan's sha256, for comparing plan sets with the plans."""
    deadline = store.deadline(deadline)
    names = store.iter_fingerprints(deadline) if fingerprints is None else fingerprints
    stream = store.fetch_stream(names, deadline, on_done=progress.advance if progress else None)
    reports: list[PlanReport] = []
    while chunk := list(itertools.islice(stream, STREAM_CHUNK)):
        if digests is not None:
            digests.update(
                (r.fingerprint, hashlib.sha256(r.plan_bytes).hexdigest())
                for r in chunk
                if r.plan_bytes is not None
            )
        chunk_reports = check_many(chunk, policy, now, jobs=jobs)
        if policy is not None:
            from .candidate_audit import note_candidates

            failed = [r for r in chunk_reports if r.outcome in (INVALID, UNSIGNED)]
            note_candidates(store, failed, lambda r: check(r, policy, now), deadline)
        reports.extend(chunk_reports)
    return reports
