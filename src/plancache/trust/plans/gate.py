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

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from ..display import safe_text
from ..errors import PlanCacheError, Reason
from ..statement import CONDITION_KEYS
from ..verify import VerifiedPlan


class Verdict(str, Enum):
    """Outcomes of a lookup that are decisions, not errors. The values are a contract."""

    APPLIED = "applied"
    NO_PLAN = "no-plan"
    BELOW_BASELINE = "below-baseline"
    CONDITION_MISMATCH = "condition-mismatch"
    ALREADY_SET = "already-set"
    RANK_DISAGREEMENT = "rank-disagreement"
    WORKER_WITHOUT_PLANS = "worker-without-plans"
    """The worker's class never applies or saves a plan (vLLM's CPU worker): nothing to decide."""
    UNFINISHED_BOOT = "unfinished-boot"
    """An earlier boot applied this very plan and never finished its start-up: profile instead."""
    PLAN_EXCEEDS_PROFILE = "plan-exceeds-profile"
    """This node held the plan back: its KV exceeded what this node profiled by over the margin."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Decision:
    """What happened to one plan lookup: applied or not, the KV bytes, and why.

    ``reason`` is a :class:`Verdict` when the gate (or the lookup) decided, a
    :class:`~plancache.trust.errors.Reason` when an error decided for it.
    """

    applied: bool
    reason: Verdict | Reason
    detail: str = ""
    kv_cache_memory_bytes: int | None = None
    fingerprint: str | None = None

    @classmethod
    def rejected(cls, error: PlanCacheError, fingerprint: str | None = None) -> Decision:
        return cls(False, error.reason, error.detail, None, fingerprint)

    def noted(self, note: str) -> Decision:
        """The same decision with ``note`` (where the plan came from, how long it took) first."""
        if not note:
            return self
        return replace(self, detail=f"{note}; {self.detail}" if self.detail else note)


def _same(expected: Any, actual: Any) -> bool:
    if isinstance(expected, float) or isinstance(actual, float):
        return abs(float(expected) - float(actual)) < 1e-9
    return bool(expected == actual)


def decide(
    plan: VerifiedPlan, free_memory: int, conditions: Mapping[str, Any] | None = None
) -> Decision:
    """Apply ``plan`` only if free memory meets its baseline and the signed conditions hold.

    ``conditions`` are this worker's facts (keys from ``CONDITION_KEYS``); a fact the plan's
    statement does not record, or the worker cannot tell, is not compared.
    """
    fp = plan.fingerprint
    if type(free_memory) is not int or free_memory < 0:
        return Decision(
            False, Reason.INTERNAL, f"free memory is not a byte count: {free_memory!r}", None, fp
        )
    recorded = plan.statement.provenance if plan.statement else {}
    for key in CONDITION_KEYS:
        mine = (conditions or {}).get(key)
        theirs = recorded.get(key)
        if mine is not None and theirs is not None and not _same(theirs, mine):
            return Decision(
                False,
                Verdict.CONDITION_MISMATCH,
                f"{key} is {safe_text(repr(mine))} here, "
                f"the plan was made at {safe_text(repr(theirs))}",
                None,
                fp,
            )
    baseline = plan.plan.free_memory_baseline
    if free_memory < baseline:
        return Decision(
            False,
            Verdict.BELOW_BASELINE,
            f"free memory {free_memory} B is below the plan's baseline {baseline} B",
            None,
            fp,
        )
    kv = plan.plan.kv_cache_memory_bytes
    return Decision(True, Verdict.APPLIED, "", kv, fp)


EXCEEDS_PROFILE_MARGIN = 0.10
"""How far a plan's ``kv_cache_memory_bytes`` may exceed what a node freshly profiled before the
node holds it back (after a boot that applied it died): 10 %, twice the ~5 % that a cold compile
alone takes off a profile (vLLM #54383), so a node that re-profiles cold does not hold back a
good plan measured warm; a plan beyond it is larger than anything this node's profile explains."""


def exceeds_profile(plan_kv: int, profiled_kv: int, margin: float = EXCEEDS_PROFILE_MARGIN) -> bool:
    """Whether ``plan_kv`` exceeds ``profiled_kv`` (this node's fresh profile) by more than
    ``margin``. A profile of zero or less is exceeded by any plan."""
    if profiled_kv <= 0:
        return True
    return plan_kv > profiled_kv * (1 + margin)
