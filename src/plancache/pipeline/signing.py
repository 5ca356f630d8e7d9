"""Signing a directory's plans in place: what ``plancache sign`` and ``push --key`` do.

A plan already validly signed by this key is kept as it is; one signed by other keys is
co-signed (same statement, one more signature); anything else gets a fresh statement. The
sidecar is written atomically beside the plan, so a reader sees the old or the new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Mapping

from ..storage.localdir import LocalPlanDir
from ..trust import envelope as dsse
from ..trust.errors import PlanCacheError
from ..trust.gate import Verdict
from ..trust.keys import Keyring, Signer, TrustedKey
from ..trust.plan import plan_name
from ..trust.signing import add_signature, sign_plan
from ..trust.statement import parse_statement
from ..trust.verify import verify_plan


@dataclass(frozen=True)
class SigningRequest:
    """What a new statement records: lifetime, free-text comment, provenance facts."""

    expires_in: timedelta | None = None
    comment: str = ""
    facts: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SignOutcome:
    fingerprint: str
    action: str
    """``signed``, ``co-signed``, ``kept`` or ``refused``."""
    detail: str = ""
    reason: str = ""
    """Why it was refused (a reason code)."""

    @property
    def refused(self) -> bool:
        return self.action == "refused"

    @property
    def label(self) -> str:
        """The action as ``sign`` prints it: ``refused (<reason>)`` for a refusal."""
        return f"refused ({self.reason})" if self.refused else self.action


def _own_keyring(signer: Signer) -> Keyring:
    """A keyring that trusts only this signer: "is it already validly signed by me?"."""
    public = getattr(signer, "public", None)
    if public is None:
        return Keyring()
    return Keyring({signer.keyid: TrustedKey(signer.keyid, "self", public)})


def sign_one(directory: LocalPlanDir, fp: str, signer: Signer, now: datetime, request: SigningRequest) -> SignOutcome:
    """Sign one plan in place. Existing valid co-signatures are kept."""
    name = plan_name(fp)
    plan_bytes, sig_bytes = directory.read(fp)
    if plan_bytes is None:
        return SignOutcome(fp, "refused", "plan file vanished", Verdict.NO_PLAN.value)
    try:
        verify_plan(name, plan_bytes, sig_bytes, _own_keyring(signer), now)
        return SignOutcome(fp, "kept", "already signed by this key")
    except PlanCacheError:
        pass
    new_sig: bytes | None = None
    action = "signed"
    if sig_bytes is not None:
        try:
            statement = parse_statement(dsse.decode(sig_bytes).payload)
            if statement.expires_at is None or statement.expires_at > now:
                new_sig = add_signature(name, plan_bytes, sig_bytes, signer)
                action = "co-signed"
        except PlanCacheError:
            new_sig = None  # an unusable old sidecar is replaced by a fresh signature
    if new_sig is None:
        expires = now + request.expires_in if request.expires_in else None
        new_sig = sign_plan(name, plan_bytes, signer, now, expires, request.comment, dict(request.facts))
    directory.write_sig(fp, new_sig)
    return SignOutcome(fp, action)


def sign_directory(
    directory: LocalPlanDir, signer: Signer, now: datetime, request: SigningRequest, fps: list[str] | None = None
) -> list[SignOutcome]:
    """Sign every plan in ``directory`` (or the given fingerprints); refusals are outcomes, not errors."""
    outcomes = []
    for fp in directory.fingerprints() if fps is None else fps:
        try:
            outcomes.append(sign_one(directory, fp, signer, now, request))
        except PlanCacheError as exc:
            outcomes.append(SignOutcome(fp, "refused", exc.detail, exc.reason.value))
    return outcomes
