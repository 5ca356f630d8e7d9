"""Who a signature object's signatures count for: the step between its bytes and its statement
that every signed kind shares (plans, plan sets, compile-cache manifests, their headers).

:func:`open_envelope` checks a signature object (capped, canonical DSSE, our payload type, or a
Sigstore bundle) and returns its payload with the trusted signers whose signatures over it
verify; :func:`current_signers` keeps those whose validity windows cover both the verifier's
clock and the statement's ``signed_at``, and applies the threshold and the statement's own
window. Split from :mod:`plancache.trust.verify`, which holds the order of the steps and the
plan's own checks: this module is the keyring's side of them, the same for every kind. Pure,
no IO.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from .. import envelope as dsse
from ..display import safe_text
from ..errors import Reason, Rejected
from ..keyless.sigstore_bundle import is_bundle, open_bundle
from ..statement import format_time
from .identities import IdentitySigner
from .keyformat import canonical_keyid
from .keys import Keyring, TrustedKey

DEFAULT_CLOCK_SKEW = timedelta(minutes=5)

Signatory = TrustedKey | IdentitySigner
"""Who a signature object's valid signature counts for: a trusted key or a keyless identity."""


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
