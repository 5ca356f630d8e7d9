"""Bytes in, :class:`VerifiedPlan` out: the one place where a plan becomes trusted, and the
steps every signed kind shares (:func:`open_signed`: plans, plan sets, compile-cache manifests,
their headers), so that a rule added to them holds for all.

Modelled on python-tuf's ``TrustedMetadataSet``: unverified bytes enter here, are checked in
a fixed order, and only then parsed; everything that goes wrong leaves as a
``PlanCacheError`` with a reason. The order (cheapest, least-parsing checks first):

1. size caps on plan and sidecar;
2. the DSSE envelope (canonical form) and its payloadType;
3. signatures over the PAE by distinct trusted keys (:mod:`.signatories`): a signature counts
   for key K only if its keyid names K (compared in normal form, see ``keys.canonical_keyid``)
   *and* it verifies with K (the keyid alone grants nothing);
4. the statement (parsed only now that its bytes are known to be signed);
5. subject name and sha256 equal the plan file's name and exact bytes;
6. the statement's fingerprint equals the one in the file name;
7. each signing key's validity window covers both ``now`` (the verifier's clock: after
   ``valid-before`` a key vouches for nothing, so a retired key cannot backdate a new plan)
   and ``signed_at`` (it signed while current); the threshold counts such keys;
8. the statement's own window (``signed_at`` not in the future, ``expires_at`` not past),
   with a clock-skew tolerance;
9. only then the plan bytes are parsed, strictly.

Times are compared through differences (a ``timedelta`` never overflows), never by adding
the skew to a date: a statement dated 9999-12-31 is a rejection or a pass, never an
``OverflowError`` that aborts a batch. Untrusted strings in error details pass through
:func:`~plancache.trust.display.safe_text`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Generic, Protocol, TypeVar

from . import envelope as dsse
from .display import safe_text
from .errors import Reason, Rejected
from .keyring.identities import IdentitySigner
from .keyring.keys import Keyring
from .keyring.signatories import DEFAULT_CLOCK_SKEW, Signatory, current_signers, open_envelope
from .plans.plan import MAX_PLAN_BYTES, Plan, fingerprint_of_plan_name, parse_plan
from .statement import Statement, parse_statement

_SEAL = object()


@dataclass(frozen=True)
class VerifiedPlan:
    """A plan whose bytes passed every check. Only :func:`verify_plan` makes these.

    ``signers`` names the trusted keys that signed; it is empty only for a plan admitted by
    :func:`admit_unsigned`, the explicit no-keys-configured policy.
    """

    name: str
    plan: Plan
    plan_bytes: bytes
    sig_bytes: bytes | None
    statement: Statement | None
    signers: tuple[str, ...]
    _seal: object = None
    key_ids: tuple[str, ...] = ()
    """Key ids (``SHA256:…``) of the signing keys, in the order of ``signers``."""
    identities: tuple[IdentitySigner, ...] = ()
    """Keyless signers (a Sigstore bundle's identity, issuer, log index), among ``signers``."""

    def __post_init__(self) -> None:
        if self._seal is not _SEAL:
            raise TypeError("VerifiedPlan is created by plancache.trust.verify only")

    @property
    def fingerprint(self) -> str:
        return self.plan.fingerprint


def verify_plan(
    name: str,
    plan_bytes: bytes,
    sig_bytes: bytes | None,
    keyring: Keyring,
    now: datetime,
    clock_skew: timedelta = DEFAULT_CLOCK_SKEW,
) -> VerifiedPlan:
    """Verify a plan file and its sidecar; return the trusted plan or raise a typed error.

    Raises:
        Rejected: the bytes fail a check, in the module's order, with its reason:
            ``too-large`` (plan or sidecar over its cap), ``unsigned`` (no sidecar),
            ``malformed`` (no canonical envelope, another payloadType, a statement or plan off
            its schema), ``revoked``, ``bad-signature`` or ``untrusted-key`` (no trusted key
            signed: why the best signature did not count; a Sigstore bundle's own reasons are
            :func:`open_envelope`'s), ``name-mismatch``,
            ``digest-mismatch``, ``fingerprint-mismatch`` (statement, file name and plan
            disagree), ``expired`` (a key's window or the statement's expiry),
            ``threshold-not-met``, ``not-yet-valid``.
    """
    if len(plan_bytes) > MAX_PLAN_BYTES:
        raise Rejected(
            Reason.TOO_LARGE, f"plan is {len(plan_bytes)} bytes, the cap is {MAX_PLAN_BYTES}"
        )
    if sig_bytes is None:
        raise Rejected(Reason.UNSIGNED, "no signature sidecar (.sig) beside the plan")

    def same_plan(statement: Statement) -> None:
        if statement.subject_sha256 != hashlib.sha256(plan_bytes).hexdigest():
            raise Rejected(
                Reason.DIGEST_MISMATCH, "plan bytes do not match the signed sha256 (altered plan?)"
            )
        name_fp = fingerprint_of_plan_name(name)
        if statement.fingerprint != name_fp:
            raise Rejected(
                Reason.FINGERPRINT_MISMATCH,
                f"signed for fingerprint {statement.fingerprint}, file is {name_fp}",
            )

    opened = open_signed(
        sig_bytes, keyring, PLAN_SIGNATURE, name, now=now, clock_skew=clock_skew, check=same_plan
    )
    plan = parse_plan(plan_bytes, name)
    return VerifiedPlan(
        name,
        plan,
        plan_bytes,
        sig_bytes,
        opened.statement,
        opened.names,
        _SEAL,
        opened.key_ids,
        opened.identities,
    )


class Dated(Protocol):
    """What every signed statement says of time: when it was signed, until when it holds."""

    @property
    def signed_at(self) -> datetime: ...

    @property
    def expires_at(self) -> datetime | None: ...


T = TypeVar("T", bound=Dated)


@dataclass(frozen=True)
class SignedKind(Generic[T]):
    """What differs between the signed kinds (plans, plan sets, compile-cache manifests, their
    headers): the steps are :func:`open_signed`'s, the same for every kind."""

    parse: Callable[[bytes], T]
    """The kind's strict parser, run only on a payload whose signatures verified."""
    subject_of: Callable[[T], str]
    """The name the statement is for (a file's, an object's, a cache directory's)."""
    noun: str
    """How a ``name-mismatch`` names what was signed: ``signature is``, ``headers are``, ..."""
    cap: int = dsse.MAX_SIG_BYTES
    """The kind's signature cap (:func:`open_envelope`)."""


@dataclass(frozen=True)
class Opened(Generic[T]):
    """A signature object's statement, parsed once its signatures verified, and the signers
    that count (each current, enough of them for the threshold)."""

    statement: T
    signers: tuple[Signatory, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple([k.name for k in self.signers])

    @property
    def key_ids(self) -> tuple[str, ...]:
        """The signers' key ids (``SHA256:…``, ``sigstore:…``), in the order of :attr:`names`."""
        return tuple([k.keyid for k in self.signers])

    @property
    def identities(self) -> tuple[IdentitySigner, ...]:
        """The keyless signers among them (identity, issuer, log index): what every verified
        kind carries beside the names, for the reports to say who signed."""
        return tuple([k for k in self.signers if isinstance(k, IdentitySigner)])


def open_signed(
    sig_bytes: bytes,
    keyring: Keyring,
    kind: SignedKind[T],
    subject: str,
    *,
    now: datetime,
    clock_skew: timedelta = DEFAULT_CLOCK_SKEW,
    check: Callable[[T], None] | None = None,
) -> Opened[T]:
    """The steps every signed kind shares, in the module's order: the signatures
    (:func:`open_envelope`), then the statement (``kind.parse``), its subject against
    ``subject``, the kind's own ``check`` of what the statement binds (digests, member lists),
    then who counts (:func:`current_signers`).

    Raises:
        Rejected: :func:`open_envelope`'s reasons, ``kind.parse``'s, ``name-mismatch`` (the
            statement is for another name), ``check``'s, :func:`current_signers`'.
    """
    payload, keys = open_envelope(sig_bytes, keyring, kind.cap)
    statement = kind.parse(payload)
    named = kind.subject_of(statement)
    if named != subject:
        raise Rejected(
            Reason.NAME_MISMATCH,
            f"{kind.noun} for '{safe_text(named, 100)}', not for '{safe_text(subject, 100)}'",
        )
    if check is not None:
        check(statement)
    current = current_signers(
        keys,
        keyring,
        signed_at=statement.signed_at,
        expires_at=statement.expires_at,
        now=now,
        clock_skew=clock_skew,
    )
    return Opened(statement, tuple(current))


PLAN_SIGNATURE = SignedKind(parse_statement, lambda s: s.subject_name, "signature is")
"""A plan's sidecar: the statement names the plan file."""


def admit_unsigned(name: str, plan_bytes: bytes) -> VerifiedPlan:
    """Admit a local plan with no signature checks: the explicit policy for deployments that
    configured no trusted keys, where plancache must behave like vLLM (which trusts its own
    cache directory) but still parses strictly. Never used for bytes from a store."""
    plan = parse_plan(plan_bytes, name)
    return VerifiedPlan(name, plan, plan_bytes, None, None, (), _SEAL)
