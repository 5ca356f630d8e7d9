"""Who a signature object's signatures count for: the step between its bytes and its statement
that every signed kind shares (plans, plan sets, compile-cache manifests, their headers).

:func:`open_envelope` checks a signature object (capped, canonical DSSE, our payload type, or a
Sigstore bundle) and returns its payload with the trusted signers whose signatures over it
verify; :func:`current_signers` keeps those whose validity windows cover both the verifier's
clock and when they signed (a key: the statement's ``signed_at``; a keyless identity: its
verified time, which ``signed_at`` must agree with), and applies the threshold and the
statement's own window. Split from :mod:`plancache.trust.verify`, which holds the order of
the steps and the plan's own checks: this module is the keyring's side of them, the same for
every kind. Pure, no IO.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from .. import envelope as dsse
from ..display import safe_text
from ..errors import Reason, Rejected
from ..statement import format_time
from .identities import IdentitySigner
from .identity_match import normal_issuer, normal_url
from .keyformat import canonical_keyid
from .keys import Keyring, TrustedKey

DEFAULT_CLOCK_SKEW = timedelta(minutes=5)

Signatory = TrustedKey | IdentitySigner
"""Who a signature object's valid signature counts for: a trusted key or a keyless identity."""


class _Count:
    """The distinct signers with a valid signature so far, in entry order, and why the others
    did not count: ``revoked`` over everything, else the first other failure (a key's
    ``bad-signature``, a keyless signature's own reason), else ``untrusted-key``."""

    def __init__(self) -> None:
        self.good: dict[object, Signatory] = {}
        self.failure = Reason.UNTRUSTED_KEY
        self.detail: str | None = None
        """A keyless failure's own detail; None: a key's, said by :func:`_no_key_detail`."""

    def failed(self, reason: Reason, detail: str | None = None) -> None:
        if self.failure is Reason.REVOKED or reason is Reason.UNTRUSTED_KEY:
            return
        if reason is Reason.REVOKED or self.failure is Reason.UNTRUSTED_KEY:
            self.failure, self.detail = reason, detail


def _signed_earlier(signer: IdentitySigner, than: Signatory) -> bool:
    """Whether ``signer`` (a line's signature) was verified before ``than`` (the same line's):
    a line signing twice counts once, by its first signature, whichever entry the envelope
    lists first (red team 48a: with the later entry first, a statement was
    ``signing-time-mismatch``, the other way round valid)."""
    return (
        isinstance(than, IdentitySigner)
        and signer.log_time is not None
        and than.log_time is not None
        and signer.log_time < than.log_time
    )


def _count(env: dsse.Envelope, keyring: Keyring) -> _Count:
    """Every entry that could count, verified: a key's against the trusted key its id names, a
    keyless one (only when the keyring names identities: sigstore-python is never imported for
    keys alone) as the bundle it came from, by :func:`~..keyless.sigstore_bundle.open_bundle`'s
    rules (a revoked-only policy included, so its reason is the bundle's). Each trusted key,
    and each trusted identity *line*, counts once: the line is what the operator trusted, as a
    key is (and each certified identity once, :func:`_distinct`)."""
    data = dsse.pae(env.payload_type, env.payload)
    count = _Count()
    policy = keyring.identities
    for signature in env.signatures:
        if signature.ext is not None:
            if policy is None or not (policy.trusted or policy.revoked):
                continue  # like an unknown key: nothing here could count or be revoked
            from ..keyless.dsse_extension import open_entry

            try:
                for who in open_entry(env, signature, policy):
                    kept = count.good.get(who.line.key)
                    if kept is None or _signed_earlier(who, kept):
                        count.good[who.line.key] = who
            except Rejected as exc:
                count.failed(exc.reason, exc.detail)
            continue
        # a trusted key's id is in normal form already (Keyring): only another needs normalising
        kid: str | None = signature.keyid
        if kid not in keyring.keys:
            kid = canonical_keyid(kid)
        if kid is None:
            continue
        if kid in keyring.revoked:
            count.failed(Reason.REVOKED)
            continue
        key = keyring.keys.get(kid)
        if key is None:
            continue
        if key.verifies(signature.sig, data):
            count.good.setdefault(key.keyid, key)
        else:
            count.failed(Reason.BAD_SIGNATURE)
    return count


def open_envelope(
    sig_bytes: bytes, keyring: Keyring, cap: int = dsse.MAX_SIG_BYTES
) -> tuple[bytes, list[Signatory]]:
    """A signature's payload and the trusted signers whose signatures over it verify, before
    anything of the payload is parsed: capped, canonical DSSE, our payload type. The first step
    of every verifier (plans, plan sets, compile-cache manifests, their headers). ``cap`` is
    the kind's for key signatures; each keyless one adds its allowance
    (:func:`~..envelope.keyless_cap`). A Sigstore bundle in its place is verified by
    :func:`~..keyless.sigstore_bundle.open_bundle`, with one keyless signature's allowance.

    Raises:
        Rejected: ``too-large`` (over the cap), ``malformed`` (no canonical DSSE envelope, or
            another payloadType), or no trusted signer's signature verifies (``revoked``,
            ``bad-signature``, ``untrusted-key``, a keyless signature's reasons:
            :func:`trusted_signers`); for a Sigstore bundle,
            :func:`~..keyless.sigstore_bundle.open_bundle`'s reasons (``wrong-identity``,
            ``wrong-issuer``, ``unanchored-identity``, ``no-log-proof``, ``bad-log-proof``,
            ``certificate-outside-validity``, ``foreign-trust-root``, ``bad-bundle``, ...).
    """
    if dsse.is_bundle(sig_bytes):
        from ..keyless.sigstore_bundle import open_bundle  # keyless modules only for a bundle

        allowance = dsse.keyless_cap(cap, 1)
        payload, identities = open_bundle(sig_bytes, keyring.identities, allowance)
        return payload, [*identities]
    env = dsse.decode(sig_bytes, cap)
    if env.payload_type != dsse.PAYLOAD_TYPE:
        raise Rejected(
            Reason.MALFORMED,
            f"payloadType is '{safe_text(env.payload_type, 60)}', expected {dsse.PAYLOAD_TYPE}",
        )
    return env.payload, trusted_signers(env, keyring)


def trusted_signers(env: dsse.Envelope, keyring: Keyring) -> list[Signatory]:
    """The distinct trusted signers (keys, identity lines) whose signatures over the envelope
    verify, in entry order. One signature rule for every kind.

    Raises:
        Rejected: no signature counts, with the reason why: ``revoked`` (a revoked key or
            identity signed), else the first other failure: ``bad-signature`` (a trusted key's
            signature does not verify) or a keyless signature's reason (``wrong-identity``,
            ``bad-log-proof``, ...), else ``untrusted-key`` (no trusted signer signed).
    """
    count = _count(env, keyring)
    if not count.good:
        raise Rejected(count.failure, count.detail or _no_key_detail(count.failure, env))
    return list(count.good.values())


def current_signers(
    keys: Sequence[Signatory],
    keyring: Keyring,
    *,
    signed_at: datetime,
    expires_at: datetime | None,
    now: datetime,
    clock_skew: timedelta = DEFAULT_CLOCK_SKEW,
) -> list[Signatory]:
    """The signing keys whose validity windows cover both now and when they signed (a key
    vouches only for what it signed while valid: for a key ``signed_at``, for a keyless
    identity its verified time, :func:`signed_when`), enough of them for the threshold, and a
    signature neither from the future nor expired. Shared by plans and manifests. The three
    times are named: swapped, they would still compare.

    Raises:
        Rejected: ``signing-time-mismatch`` (a keyless signer's verified time and
            ``signed_at`` differ by more than the skew: :func:`_check_signing_times`),
            ``expired`` (no key's window covers both moments, or the statement expired),
            ``threshold-not-met`` (fewer such keys than the keyring's threshold),
            ``not-yet-valid`` (``signed_at`` beyond the clock skew in the future).
    """
    _check_signing_times(keys, signed_at, now, clock_skew)
    current = _distinct(
        [k for k in keys if k.window_covers(now) and k.window_covers(signed_when(k, signed_at))]
    )
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


# -- keyless signers: the verified time decides (issue 48 item 2) ---------------------------------


def signed_when(signer: Signatory, signed_at: datetime) -> datetime:
    """When ``signer`` signed, as far as the verifier knows: a keyless signer's verified time
    (Rekor's integrated time under its SET, or a TSA's timestamp: never the statement's word),
    a key's ``signed_at`` (a key's signature carries no other time)."""
    if isinstance(signer, IdentitySigner) and signer.log_time is not None:
        return signer.log_time
    return signed_at


def _check_signing_times(
    keys: Sequence[Signatory], signed_at: datetime, now: datetime, clock_skew: timedelta
) -> None:
    """A keyless statement's ``signed_at`` agrees with when it was signed: no keyless signer's
    verified time is before it by more than the clock skew (nobody signs a statement before its
    date: a forward-dated one), and, unless a current key signed it too (a key dates what it
    signs, as it always could), the first keyless signer's verified time is within the skew of
    it (the signer who dated it signed then: a backdated one). A statement its signer misdated
    would otherwise carry a false date into every report and every ``expires_at`` measured from
    it. A co-signer who signs later did not write the date (docs/keys.md's key first, identity
    later): a day later is a co-signature, not a misdated statement (red team 48a: a key-signed
    plan that verified alone was refused once the bake job co-signed it a day later).

    Raises:
        Rejected: ``signing-time-mismatch``.
    """
    keyless = [k for k in keys if isinstance(k, IdentitySigner) and k.log_time is not None]
    if not keyless:
        return  # no keyless signer with a verified time: nothing to compare
    for k in keyless:
        if k.log_time is not None and signed_at - k.log_time > clock_skew:
            raise _mismatch(k, signed_at, k.log_time, clock_skew)
    dated_by_key = any(
        not isinstance(k, IdentitySigner) and k.window_covers(signed_at) and k.window_covers(now)
        for k in keys
    )
    if not dated_by_key:
        first = min(keyless, key=lambda k: k.log_time or signed_at)
        if first.log_time is not None and first.log_time - signed_at > clock_skew:
            raise _mismatch(first, signed_at, first.log_time, clock_skew)


def _mismatch(
    signer: IdentitySigner, signed_at: datetime, verified: datetime, clock_skew: timedelta
) -> Rejected:
    return Rejected(
        Reason.SIGNING_TIME_MISMATCH,
        f"signed_at {format_time(signed_at)} is not the verified signing time "
        f"{format_time(verified)} ({safe_text(signer.name, 40)}) within "
        f"{int(clock_skew.total_seconds())} s",
    )


def _distinct(signers: list[Signatory]) -> list[Signatory]:
    """One entry per signer, in order. Keys are one per key id already, identity lines one per
    line (:func:`_count`); but one CI identity can match several lines (the same workflow
    pinned to ``build-trigger=push`` on one line and ``workflow_dispatch`` on another), and two
    of its runs must not meet a threshold of two: a keyless signer is its certificate's issuer
    and SAN, compared as trusting does."""
    seen: set[object] = set()
    distinct: list[Signatory] = []
    for signer in signers:
        mark: object = signer.keyid
        if isinstance(signer, IdentitySigner):
            mark = (normal_issuer(signer.issuer), normal_url(signer.identity))
        if mark not in seen:
            seen.add(mark)
            distinct.append(signer)
    return distinct


def _window_detail(keys: Sequence[Signatory], now: datetime) -> str:
    names = ", ".join(safe_text(k.name, 40) for k in keys)
    if not any(k.window_covers(now) for k in keys):
        return (
            f"the signing key's validity window does not cover now ({names}): it vouches for "
            "nothing today"
        )
    return f"signed outside the signing key's validity window ({names})"


def _no_key_detail(failure: Reason, env: dsse.Envelope) -> str:
    ids = ", ".join(
        "sigstore (keyless)" if s.ext is not None else safe_text(s.keyid, 60) or "<none>"
        for s in env.signatures
    )
    if failure is Reason.REVOKED:
        return f"signed by a revoked key ({ids})"
    if failure is Reason.BAD_SIGNATURE:
        return "signature does not verify with the trusted key (altered signature?)"
    return f"no trusted key signed it (signed by {ids})"
