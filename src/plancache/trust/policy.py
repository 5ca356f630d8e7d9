"""The trust policy: what may be trusted, decided once from settings and passed in.

As sigstore-python passes a verification policy into its verifier, integrations build one
:class:`TrustPolicy` from their settings and hand it to the resolver; nothing downstream
branches on "are keys configured?" again. There are exactly three policies:

- ``signed``: a keyring (with its threshold). Every plan, local or from a store, must verify.
- ``unsigned-local``: no trusted keys configured. Local plans are admitted as vLLM itself
  admits them (its own cache directory is trusted), but parsed strictly; a store is never
  read, because bytes from a store are never used unverified.
- ``unusable``: trusted keys were configured but cannot be used (a missing file, a bad
  threshold). Nothing applies: a broken key setup must never downgrade to unsigned admission.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from .errors import ConfigError
from .keyring.keys import Keyring
from .verify import VerifiedPlan, admit_unsigned, verify_plan

if TYPE_CHECKING:
    from .plans.plan_set import VerifiedSet

Source = Literal["local", "store"]
PolicyKind = Literal["signed", "unsigned-local", "unusable"]


@dataclass(frozen=True)
class TrustPolicy:
    kind: PolicyKind
    keyring: Keyring | None = None
    problem: str = ""
    """Why an ``unusable`` policy is unusable (shown in the decision's detail)."""

    @classmethod
    def signed(cls, keyring: Keyring) -> TrustPolicy:
        return cls("signed", keyring)

    @classmethod
    def unsigned_local(cls) -> TrustPolicy:
        return cls("unsigned-local")

    @classmethod
    def unusable(cls, problem: str) -> TrustPolicy:
        return cls("unusable", None, problem)

    @property
    def reads_store(self) -> bool:
        """Only signed plans may come from a store."""
        return self.kind == "signed"

    def verify(
        self, name: str, plan_bytes: bytes, sig_bytes: bytes | None, source: Source, now: datetime
    ) -> VerifiedPlan:
        """Bytes from ``source`` in, a :class:`VerifiedPlan` out, or a typed error.

        Raises:
            ConfigError: the policy is ``unusable``, or bytes from a store meet an
                ``unsigned-local`` policy (reason ``config-error``).
            Rejected: the bytes fail :func:`~.verify.verify_plan` (a ``signed`` policy) or the
                strict parser (``unsigned-local``), with that check's reason.
        """
        if self.kind == "signed" and self.keyring is not None:
            return verify_plan(name, plan_bytes, sig_bytes, self.keyring, now)
        if self.kind == "unusable":
            raise ConfigError(f"trusted keys unusable ({self.problem})")
        if source != "local":
            raise ConfigError("no trusted keys: a plan from a store is never admitted unsigned")
        return admit_unsigned(name, plan_bytes)

    def verify_set(self, name: str, data: bytes, now: datetime) -> VerifiedSet:
        """A plan set's bytes (always from a store) in, a :class:`VerifiedSet` out, or a typed
        error: only a ``signed`` policy reads stores, so only it admits a set.

        Raises:
            ConfigError: the policy is not ``signed`` (reason ``config-error``).
            Rejected: the set fails :func:`~.plans.plan_set.verify_set`, with that check's
                reason.
        """
        if self.kind == "signed" and self.keyring is not None:
            from .plans.plan_set import verify_set  # plan sets only: a directory's audit has none

            return verify_set(name, data, self.keyring, now)
        if self.kind == "unusable":
            raise ConfigError(f"trusted keys unusable ({self.problem})")
        raise ConfigError("no trusted keys: a plan set from a store is never admitted unsigned")
