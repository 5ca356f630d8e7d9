"""The free-memory gate, and the :class:`Decision` every caller logs as one line.

vLLM's plan records how much memory was free when it was profiled (``free_memory_baseline``)
and how much of it the KV cache then took. Applying the plan on a GPU with *less* free
memory would hand the KV cache bytes that other allocations (another process, a bigger
activation peak) now need, and the worker OOMs later, mid-serving, instead of at boot. So a
plan only applies when free memory now is at least the baseline; otherwise vLLM profiles.

The gate also checks the *conditions* the fingerprint misses (see
:data:`plancache.trust.statement.CONDITION_KEYS`): a plan profiled at a different
``gpu_memory_utilization`` or on another device model holds numbers for another budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .errors import PlanCacheError, Reason
from .statement import CONDITION_KEYS
from .verify import VerifiedPlan


@dataclass(frozen=True)
class Decision:
    """What happened to one plan lookup: applied or not, the KV bytes, and why."""

    applied: bool
    reason: Reason
    detail: str = ""
    kv_cache_memory_bytes: int | None = None
    fingerprint: str | None = None

    @classmethod
    def rejected(cls, error: PlanCacheError, fingerprint: str | None = None) -> "Decision":
        return cls(False, error.reason, error.detail, None, fingerprint)


def _same(expected: Any, actual: Any) -> bool:
    if isinstance(expected, float) or isinstance(actual, float):
        return abs(float(expected) - float(actual)) < 1e-9
    return bool(expected == actual)


def decide(plan: VerifiedPlan, free_memory: int, conditions: Mapping[str, Any] | None = None) -> Decision:
    """Apply ``plan`` only if free memory meets its baseline and the signed conditions hold.

    ``conditions`` are this worker's facts (keys from ``CONDITION_KEYS``); a fact the plan's
    statement does not record, or the worker cannot tell, is not compared.
    """
    fp = plan.fingerprint
    if type(free_memory) is not int or free_memory < 0:
        return Decision(False, Reason.INTERNAL, f"free memory is not a byte count: {free_memory!r}", None, fp)
    recorded = plan.statement.provenance if plan.statement else {}
    for key in CONDITION_KEYS:
        mine = (conditions or {}).get(key)
        theirs = recorded.get(key)
        if mine is not None and theirs is not None and not _same(theirs, mine):
            return Decision(
                False, Reason.CONDITION_MISMATCH, f"{key} is {mine!r} here, the plan was made at {theirs!r}", None, fp
            )
    baseline = plan.plan.free_memory_baseline
    if free_memory < baseline:
        return Decision(
            False,
            Reason.BELOW_BASELINE,
            f"free memory {free_memory} B is below the plan's baseline {baseline} B",
            None,
            fp,
        )
    kv = plan.plan.kv_cache_memory_bytes
    return Decision(True, Reason.APPLIED, f"kv_cache_memory_bytes={kv}", kv, fp)
