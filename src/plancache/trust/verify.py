"""Bytes in, :class:`VerifiedPlan` out: the one place where a plan becomes trusted.

Modelled on python-tuf's ``TrustedMetadataSet``: unverified bytes enter here, are checked in
a fixed order, and only then parsed; everything that goes wrong leaves as a
``PlanCacheError`` with a reason. The order (cheapest, least-parsing checks first):

1. size caps on plan and sidecar;
2. the DSSE envelope (canonical form) and its payloadType;
3. signatures over the PAE by distinct trusted keys: a signature counts for key K only if
   its keyid names K (compared in normal form, see ``keys.canonical_keyid``) *and* it
   verifies with K (the keyid alone grants nothing);
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
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from . import envelope as dsse
from .display import safe_text
from .errors import Reason, Rejected
from .keyless.sigstore_bundle import is_bundle, open_bundle
from .keyring.identities import IdentitySigner
from .keyring.keyformat import canonical_keyid
from .keyring.keys import Keyring, TrustedKey
from .plans.plan import MAX_PLAN_BYTES, Plan, fingerprint_of_plan_name, parse_plan
from .statement import Statement, format_time, parse_statement

DEFAULT_CLOCK_SKEW = timedelta(minutes=5)

Signatory = TrustedKey | IdentitySigner
"""Who a signature object's valid signature counts for: a trusted key or a keyless identity."""

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


def _signing_keys(env: dsse.Envelope, keyring: Keyring) -> tuple[list[TrustedKey], Reason]:
    """The distinct trusted keys with a valid signature, and why the others did not count."""
    data = dsse.pae(env.payload_type, env.payload)
    good: dict[str, TrustedKey] = {}
    failure = Reason.UNTRUSTED_KEY
    for signature in env.signatures:
        kid = canonical_keyid(signature.keyid)
        if kid is None:
            continue
        if kid in keyring.revoked:
            failure = Reason.REVOKED
            continue
        key = keyring.keys.get(kid)
        if key is None:
            continue
        if key.verifies(signature.sig, data):
            good[key.keyid] = key
        elif failure is Reason.UNTRUSTED_KEY:
            failure = Reason.BAD_SIGNATURE
    return list(good.values()), failure


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
    payload, keys = open_envelope(sig_bytes, keyring)
    statement = parse_statement(payload)
    if statement.subject_name != name:
        raise Rejected(
            Reason.NAME_MISMATCH,
            f"signature is for '{safe_text(statement.subject_name, 80)}', "
            f"not for '{safe_text(name, 80)}'",
        )
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
    current = current_signers(
        keys,
        keyring,
        signed_at=statement.signed_at,
        expires_at=statement.expires_at,
        now=now,
        clock_skew=clock_skew,
    )
    plan = parse_plan(plan_bytes, name)
    return VerifiedPlan(
        name,
        plan,
        plan_bytes,
        sig_bytes,
        statement,
        tuple(k.name for k in current),
        _SEAL,
        tuple(k.keyid for k in current),
        tuple(k for k in current if isinstance(k, IdentitySigner)),
    )


def open_envelope(
    sig_bytes: bytes, keyring: Keyring, cap: int = dsse.MAX_SIG_BYTES
) -> tuple[bytes, list[Signatory]]:
    """A signature's payload and the trusted keys whose signatures over it verify, before
    anything of the payload is parsed: capped, canonical DSSE, our payload type. The first step
    of every verifier (plans, plan sets, compile-cache manifests, their headers). A Sigstore
    bundle in its place is verified by :func:`.keyless.sigstore_bundle.open_bundle` (same cap).

    Raises:
        Rejected: ``too-large`` (over ``cap``), ``malformed`` (no canonical DSSE envelope, or
            another payloadType), or no trusted key's signature verifies (``revoked``,
            ``bad-signature``, ``untrusted-key``: :func:`trusted_signers`); for a Sigstore
            bundle, :func:`~.keyless.sigstore_bundle.open_bundle`'s reasons (``wrong-identity``,
            ``wrong-issuer``, ``unanchored-identity``, ``no-log-proof``, ``bad-log-proof``,
            ``certificate-outside-validity``, ``foreign-trust-root``, ``bad-bundle``, ...).
    """
    if is_bundle(sig_bytes):
        payload, identities = open_bundle(sig_bytes, keyring.identities, cap)
        return payload, [*identities]
    env = dsse.decode(sig_bytes, cap)
    if env.payload_type != dsse.PAYLOAD_TYPE:
        raise Rejected(
            Reason.MALFORMED,
            f"payloadType is '{safe_text(env.payload_type, 60)}', expected {dsse.PAYLOAD_TYPE}",
        )
    return env.payload, [*trusted_signers(env, keyring)]


def trusted_signers(env: dsse.Envelope, keyring: Keyring) -> list[TrustedKey]:
    """The distinct trusted keys whose signatures over the envelope verify. Shared by plans and
    compile-cache manifests: one signature rule for both.

    Raises:
        Rejected: no signature counts, with the reason why: ``revoked`` (a revoked key signed),
            else ``bad-signature`` (a trusted key's signature does not verify), else
            ``untrusted-key`` (no trusted key signed).
    """
    keys, failure = _signing_keys(env, keyring)
    if not keys:
        raise Rejected(failure, _no_key_detail(failure, env))
    return keys


def current_signers(
    keys: Sequence[Signatory],
    keyring: Keyring,
    *,
    signed_at: datetime,
    expires_at: datetime | None,
    now: datetime,
    clock_skew: timedelta = DEFAULT_CLOCK_SKEW,
) -> list[Signatory]:
    """The signing keys whose validity windows cover both now and ``signed_at`` (a key vouches
    only for what it signed while valid), enough of them for the threshold, and a signature
    neither from the future nor expired. Shared by plans and manifests. The three times are
    named: swapped, they would still compare.

    Raises:
        Rejected: ``expired`` (no key's window covers both moments, or the statement expired),
            ``threshold-not-met`` (fewer such keys than the keyring's threshold),
            ``not-yet-valid`` (``signed_at`` beyond the clock skew in the future).
    """
    current = [k for k in keys if k.window_covers(now) and k.window_covers(signed_at)]
    if not current:
        raise Rejected(Reason.EXPIRED, _window_detail(keys, now))
    if len(current) < keyring.threshold:
        raise Rejected(
            Reason.THRESHOLD, f"{len(current)} trusted key(s) signed, {keyring.threshold} required"
        )
    if signed_at - now > clock_skew:
        raise Rejected(Reason.NOT_YET_VALID, f"signed_at {format_time(signed_at)} is in the future")
    if expires_at is not None and now - expires_at >= clock_skew:
        raise Rejected(Reason.EXPIRED, f"signature expired at {format_time(expires_at)}")
    return current


def _window_detail(keys: Sequence[Signatory], now: datetime) -> str:
    names = ", ".join(safe_text(k.name, 40) for k in keys)
    if not any(k.window_covers(now) for k in keys):
        return (
            f"the signing key's validity window does not cover now ({names}): it vouches for "
            "nothing today"
        )
    return f"signed outside the signing key's validity window ({names})"


def _no_key_detail(failure: Reason, env: dsse.Envelope) -> str:
    ids = ", ".join(safe_text(s.keyid, 60) or "<none>" for s in env.signatures)
    if failure is Reason.REVOKED:
        return f"signed by a revoked key ({ids})"
    if failure is Reason.BAD_SIGNATURE:
        return "signature does not verify with the trusted key (altered signature?)"
    return f"no trusted key signed it (signed by {ids})"


def admit_unsigned(name: str, plan_bytes: bytes) -> VerifiedPlan:
    """Admit a local plan with no signature checks: the explicit policy for deployments that
    configured no trusted keys, where plancache must behave like vLLM (which trusts its own
    cache directory) but still parses strictly. Never used for bytes from a store."""
    plan = parse_plan(plan_bytes, name)
    return VerifiedPlan(name, plan, plan_bytes, None, None, (), _SEAL)
