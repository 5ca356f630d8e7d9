"""One error family for everything plancache rejects.

Every rejection carries a short, stable ``reason`` code (used in logs, ``--json`` output and
gate decisions) and a one-line human ``detail``. Callers never need to catch anything else
from the trust core, which is what lets the vLLM plugin promise that a bad plan can only ever
turn into "profile as usual".
"""

from __future__ import annotations

from enum import Enum


class Reason(str, Enum):
    """Stable reason codes. The string values are a contract: scripts grep for them."""

    APPLIED = "applied"
    NO_PLAN = "no-plan"
    UNSIGNED = "unsigned"
    TOO_LARGE = "too-large"
    MALFORMED = "malformed"
    BAD_SIGNATURE = "bad-signature"
    UNTRUSTED_KEY = "untrusted-key"
    REVOKED = "revoked"
    THRESHOLD = "threshold-not-met"
    DIGEST_MISMATCH = "digest-mismatch"
    NAME_MISMATCH = "name-mismatch"
    FINGERPRINT_MISMATCH = "fingerprint-mismatch"
    EXPIRED = "expired"
    NOT_YET_VALID = "not-yet-valid"
    CONDITION_MISMATCH = "condition-mismatch"
    BELOW_BASELINE = "below-baseline"
    ALREADY_SET = "already-set"
    STORE_ERROR = "store-error"
    TIMEOUT = "timeout"
    CONFIG = "config-error"
    INTERNAL = "internal-error"

    def __str__(self) -> str:  # so f"{reason}" prints the code, not "Reason.X"
        return self.value


class PlanCacheError(Exception):
    """A rejection with a reason code and a one-line explanation."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[object, ...]:  # picklable, for process pools
        return (PlanCacheError, (self.reason, self.detail))
