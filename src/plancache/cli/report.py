"""Per-plan verification reports for ``verify``, ``ls``, ``pull`` and ``prune``, in parallel.

Verification is CPU-bound (Ed25519 plus hashing), so thousands of plans are checked in a
process pool with one worker per core; a handful are checked inline, where a pool's start-up
would cost more than it saves.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Callable, Iterable, Sequence

from ..storage.items import Item
from ..trust import envelope as dsse
from ..trust.errors import PlanCacheError, Reason
from ..trust.keys import Keyring
from ..trust.plan import parse_plan, plan_name
from ..trust.statement import format_time, parse_statement
from ..trust.verify import VerifiedPlan, verify_plan
from .output import Progress

POOL_MIN_PLANS = 200

VALID = "valid"
INVALID = "invalid"
UNSIGNED = "unsigned"
UNVERIFIED = "unverified"


@dataclass
class PlanReport:
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

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def report_verified(vp: VerifiedPlan) -> PlanReport:
    st = vp.statement
    return PlanReport(
        fingerprint=vp.fingerprint,
        status=VALID,
        reason="ok",
        signers=list(vp.signers),
        signed_at=format_time(st.signed_at) if st else None,
        expires_at=format_time(st.expires_at) if st and st.expires_at else None,
        comment=st.comment if st else "",
        kv_cache_memory_bytes=vp.plan.kv_cache_memory_bytes,
        free_memory_baseline=vp.plan.free_memory_baseline,
    )


def report_error(fingerprint: str, error: PlanCacheError) -> PlanReport:
    status = UNSIGNED if error.reason is Reason.UNSIGNED else INVALID
    return PlanReport(fingerprint, status, error.reason.value, error.detail)


def describe_unverified(
    fingerprint: str, plan_bytes: bytes | PlanCacheError | None, sig_bytes: bytes | None
) -> PlanReport:
    """What a plan and sidecar *claim*, for display when no trusted keys are configured.

    Nothing here is trusted: the values are shown so a person can look, with status
    ``unverified``, and both parsers are the same strict, capped ones verification uses.
    """
    report = PlanReport(fingerprint, UNVERIFIED, "no-trusted-keys")
    try:
        if isinstance(plan_bytes, PlanCacheError):
            raise plan_bytes
        if plan_bytes is None:
            raise PlanCacheError(Reason.NO_PLAN, "plan file is missing")
        plan = parse_plan(plan_bytes, plan_name(fingerprint))
        report.kv_cache_memory_bytes = plan.kv_cache_memory_bytes
        report.free_memory_baseline = plan.free_memory_baseline
        if sig_bytes is None:
            report.status, report.reason = UNSIGNED, Reason.UNSIGNED.value
            return report
        env = dsse.decode(sig_bytes)
        report.signers = [s.keyid for s in env.signatures]
        st = parse_statement(env.payload)
        report.signed_at = format_time(st.signed_at)
        report.expires_at = format_time(st.expires_at) if st.expires_at else None
        report.comment = st.comment
    except PlanCacheError as exc:
        report.status, report.reason, report.detail = INVALID, exc.reason.value, exc.detail
    return report


def verify_item(item: Item, keyring: Keyring, now: datetime) -> VerifiedPlan | PlanCacheError:
    """One fetched or read item through the trust core: the verified plan, or why not."""
    fingerprint, plan_bytes, sig_bytes = item
    if isinstance(plan_bytes, PlanCacheError):
        return plan_bytes
    if plan_bytes is None:
        return PlanCacheError(Reason.NO_PLAN, "plan file is missing")
    try:
        return verify_plan(plan_name(fingerprint), plan_bytes, sig_bytes, keyring, now)
    except PlanCacheError as exc:
        return exc


def check_one(item: Item, keyring: Keyring | None, now: datetime) -> PlanReport:
    if keyring is None:
        return describe_unverified(*item)
    result = verify_item(item, keyring, now)
    return report_error(item[0], result) if isinstance(result, PlanCacheError) else report_verified(result)


Loader = Callable[[Sequence[str]], list[Item]]
"""Reads the items of some fingerprints; a picklable one lets the pool's workers read too."""


def _check_chunk(args: tuple[Sequence[Any], Loader | None, Keyring | None, datetime]) -> list[PlanReport]:
    work, load, keyring, now = args
    items: Sequence[Item] = load(work) if load is not None else work
    return [check_one(item, keyring, now) for item in items]


def check_many(
    work: Sequence[Item] | Sequence[str],
    keyring: Keyring | None,
    now: datetime,
    jobs: int | None = None,
    label: str = "verify",
    load: Loader | None = None,
) -> list[PlanReport]:
    """Reports in input order; uses every core (or ``jobs``) when there are many plans.

    ``work`` is a list of items, or of fingerprints when ``load`` reads them: then each worker
    reads its own share (local files), so reading is parallel as well as verifying.
    """
    jobs = jobs or os.cpu_count() or 1
    progress = Progress(len(work), label)
    if jobs == 1 or len(work) < POOL_MIN_PLANS:
        items: Sequence[Item] = load(work) if load is not None else work  # type: ignore[arg-type]
        return [check_one(item, keyring, now) for item in progress.track(items)]
    size = max(32, min(1000, len(work) // (jobs * 8) or 1))
    chunks = [work[i : i + size] for i in range(0, len(work), size)]
    reports = []
    context = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        for chunk_reports in pool.map(_check_chunk, [(c, load, keyring, now) for c in chunks]):
            reports.extend(chunk_reports)
            progress.advance(len(chunk_reports))
    progress.close()
    return reports


def exit_code(reports: Iterable[PlanReport]) -> int:
    """0 when every plan is valid, 1 when any is invalid or unsigned (as ``verify`` documents)."""
    return 0 if all(r.status == VALID for r in reports) else 1
