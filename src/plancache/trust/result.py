"""One fingerprint's outcome, the one shape every stage hands on.

A store or a directory fills in the raw bytes it read (or the error that stopped it); the
resolver adds the :class:`VerifiedPlan` (or the error that rejected the bytes) and what it
did locally. The CLI renders these, the plugin gates them. Nothing in the raw fields is
trusted: only ``verified`` is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from .errors import PlanCacheError
from .verify import VerifiedPlan

Origin = Literal["local", "store", "none"]


@dataclass(frozen=True)
class PlanResult:
    fingerprint: str
    source: Origin = "none"
    plan_bytes: bytes | None = None
    sig_bytes: bytes | None = None
    verified: VerifiedPlan | None = None
    error: PlanCacheError | None = None
    written: bool | None = None
    """Local copy after a store hit: True written, False already byte-identical, None not tried."""
    write_error: PlanCacheError | None = None
    """The local write of a verified store hit failed (the plan itself is still verified)."""
    note: str = ""
    """What else happened on the way (a rejected local copy, a failed local write, timings)."""

    @property
    def missing(self) -> bool:
        """No plan here, and nothing went wrong looking: a miss, not an error."""
        return self.error is None and self.verified is None and self.plan_bytes is None

    def judged(
        self, verified: VerifiedPlan | None = None, error: PlanCacheError | None = None
    ) -> PlanResult:
        """This result with the verifier's verdict, every other field kept: what
        ``replace(self, verified=..., error=...)`` makes, built directly (a 10,000-plan
        ``verify`` judges one a plan, and ``replace`` walks the fields each time: ~2.5 us of the
        ~50 us around each Ed25519 verify). A test holds it to every field."""
        return PlanResult(
            self.fingerprint,
            self.source,
            self.plan_bytes,
            self.sig_bytes,
            verified,
            error,
            self.written,
            self.write_error,
            self.note,
        )

    def with_note(self, note: str) -> PlanResult:
        if not note:
            return self
        return replace(self, note=f"{self.note}; {note}" if self.note else note)
