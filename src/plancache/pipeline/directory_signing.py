"""Signing a directory's plans in place: what ``plancache sign`` and ``push --key`` do.

The decision what to write is the trust core's (:func:`~plancache.trust.signing.sign_or_cosign`):
a plan already validly signed by this key, saying what was asked, is kept; one signed by
other keys is co-signed only if its statement verifies under the trusted keys given and says
what this command would write; anything else is refused unless ``replace`` (a fresh statement
by this key alone). The sidecar is written atomically beside the plan, so a reader sees the
old or the new one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from ..storage.local.localdir import LocalPlanDir
from ..trust.errors import PlanCacheError
from ..trust.keyring.identities import BundleSigner
from ..trust.keyring.keys import Keyring, Signer
from ..trust.plans.evidence import evidence_for, refuse_cold
from ..trust.plans.gate import Verdict
from ..trust.plans.plan import plan_name
from ..trust.signing import sign_or_cosign


@dataclass(frozen=True)
class SigningRequest:
    """What this command would sign. ``None`` means "not asked": an adopted statement's value
    stands, and a fresh statement records nothing (no expiry, no comment, no facts)."""

    expires_in: timedelta | None = None
    comment: str | None = None
    facts: Mapping[str, Any] | None = None
    keyring: Keyring | None = None
    """Trusted keys an existing statement must verify under before it is co-signed."""
    replace: bool = False
    """Sign anew (this key alone) instead of refusing a sidecar that cannot be adopted."""
    inputs: Mapping[str, Mapping[str, Any]] | None = None
    """Fingerprint -> its inputs (``plancache fingerprint --json``'s ``factors``), signed into fresh
    statements in the clear so that ``plancache explain`` can name the input a node differs in."""
    config_parts: Mapping[str, Any] | None = None
    """The configuration's parts, hashed (``plancache fingerprint --json``'s ``config_parts``)."""
    sign_cold: bool = False
    """Sign a plan whose boot the plugin saw compile cold (``--sign-cold``; refused by default)."""


@dataclass(frozen=True)
class SignOutcome:
    fingerprint: str
    action: str
    """``signed``, ``co-signed``, ``kept``, ``replaced`` or ``refused``."""
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


def sign_one(
    directory: LocalPlanDir,
    fp: str,
    signer: Signer,
    now: datetime,
    request: SigningRequest,
    *,
    write: bool = True,
) -> SignOutcome:
    """Sign one plan in place (see the module docstring); raises a typed error when refused.

    ``write=False`` decides without writing (``push --dry-run``: what would be signed)."""
    plan_bytes, sig_bytes = directory.read(fp)
    if plan_bytes is None:
        return SignOutcome(fp, "refused", "plan file vanished", Verdict.NO_PLAN.value)
    expires_at = now + request.expires_in if request.expires_in else None
    # how the plugin saw this plan measured (issue 49): signed with it; a cold boot's is refused
    evidence = evidence_for(directory.read_evidence(fp), plan_bytes)
    if sig_bytes is None or request.replace:
        refuse_cold(evidence, request.sign_cold)
    action, new_sig = sign_or_cosign(
        plan_name(fp),
        plan_bytes,
        sig_bytes,
        signer,
        now,
        keyring=request.keyring,
        expires_at=expires_at,
        comment=request.comment,
        provenance=request.facts,
        replace=request.replace,
        inputs=(request.inputs or {}).get(fp),
        config_parts=request.config_parts,
        evidence=evidence,
    )
    if action == "kept":
        return SignOutcome(fp, action, "already signed by this key")
    if write:
        directory.write_sig(fp, new_sig)
    return SignOutcome(fp, action)


def signing_moment(signer: Signer, now: datetime) -> datetime:
    """When a statement by ``signer`` says it was signed: the batch's ``now`` for a key; the
    present moment for a keyless signer, whose transparency log records the moment it signs:
    a keyless statement's ``signed_at`` must agree with that within the clock skew (issue 48),
    however many Rekor round trips the batch took before it."""
    if isinstance(signer, BundleSigner):
        return datetime.now(timezone.utc)
    return now


def sign_directory(
    directory: LocalPlanDir,
    signer: Signer,
    now: datetime,
    request: SigningRequest,
    *,
    fps: list[str] | None = None,
) -> list[SignOutcome]:
    """Sign every plan in ``directory`` (or the given fingerprints); refusals are outcomes, not
    errors."""
    outcomes = []
    for fp in directory.fingerprints() if fps is None else fps:
        try:
            outcomes.append(sign_one(directory, fp, signer, signing_moment(signer, now), request))
        except PlanCacheError as exc:
            outcomes.append(SignOutcome(fp, "refused", exc.detail, exc.reason.value))
    return outcomes
