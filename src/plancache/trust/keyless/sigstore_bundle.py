"""Sigstore bundles as signature objects: a keyless signature verified offline, before its
payload is parsed.

A signature object (a plan's sidecar, a plan set's head, a compile-cache manifest's or header
archive's signature) holds either plancache's DSSE envelope (:mod:`plancache.trust.envelope`)
or a Sigstore bundle v0.3 whose ``dsseEnvelope`` carries exactly the in-toto statement and
payload type a key would sign. :func:`open_bundle` is the bundle half of
:func:`plancache.trust.keyring.signatories.open_envelope`: bytes, a keyring's identities and
its pinned trust root in; the verified payload and who signed out.

sigstore-python's :class:`~sigstore.verify.Verifier` does the cryptography (the certificate
chain to the root's Fulcio CA at the logged time, the SCT, the Merkle inclusion proof and its
signed checkpoint, the SET or an RFC 3161 timestamp, the DSSE signature, the log entry against
the envelope); it is handed the root's bytes and the bundle's bytes and makes no network call.
The identity policy is plancache's (:mod:`plancache.trust.keyring.identities`): which line
matched says who signed, and a near miss says why not (``wrong-issuer``, ``wrong-identity``,
``unanchored-identity``). Each failure leaves as ``Rejected`` with its own reason; hostile
bytes that make sigstore-python raise anything else are ``bad-bundle``, never a crash.

A bundle is not re-encoded and compared as an envelope is: it is another ecosystem's format
(cosign and sigstore-python write it their own way), so the bytes are read as strict JSON (no
duplicate key, :mod:`plancache.trust.strictjson`) and only what was verified is used. Its DSSE
payload and signature must be canonical base64 all the same: sigstore-python decodes them
leniently (characters outside the alphabet dropped, anything after the padding ignored), and
plancache's own readers of what a bundle claims (``ls`` without keys, ``prune``, ``inspect``, a
co-signature moving it into an envelope) decode strictly; canonical, both read the same bytes,
the ones verified. So must its verification material be what sigstore-python writes back for
it (:func:`_check_material`): values, not layout.
sigstore-python is imported on the first bundle, never for a keyring of keys alone.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING

from .. import envelope as dsse
from .. import strictjson
from ..display import safe_text
from ..errors import Reason, Rejected
from ..keyring.identities import KEYID_PREFIX, IdentityPolicy, IdentitySigner, TrustedIdentity
from ..keyring.identity_match import CertifiedIdentity, trusted_lines
from .fulcio_certificate import certified_identity
from .trust_root import (
    TrustRoot,
    issuing_cas,
    parse_root,
    retired_part,
    sct_log_ids,
    unnamed_part,
)
from .verifier_refusals import (
    LogClaims,
    refusal,
    verified_time,
    verifier,
    vouched_by_named_log,
)

if TYPE_CHECKING:
    from cryptography.x509 import Certificate
    from sigstore.models import Bundle

BUNDLE_MEDIA_TYPES = (
    "application/vnd.dev.sigstore.bundle.v0.3+json",
    "application/vnd.dev.sigstore.bundle+json;version=0.3",
)


def open_bundle(
    sig_bytes: bytes, policy: IdentityPolicy | None, cap: int
) -> tuple[bytes, list[IdentitySigner]]:
    """The verified payload of a bundle and the trusted identity that signed it.

    ``revoked`` is said only of a bundle that verified, never of a claim: Fulcio certificates
    are public (CT and Rekor log them all), so anyone can paste a revoked identity's certificate
    over any payload, and judged by that claim a forgery would pass for the revoked signer's work
    and ``prune --revoked`` would delete it. Verified first, a forgery keeps its own reason
    (``bad-signature``, ...): rejected everywhere, deleted only by ``prune --invalid``, and an
    operator cleaning up after a compromised identity sees what it really signed. (A key is
    judged revoked by the key id it names, :mod:`plancache.trust.verify`'s order.) A policy that
    only revokes (``prune --revoked``) still verifies; a signer it does not revoke is
    ``untrusted-key``.

    Raises:
        Rejected: ``too-large``; ``malformed`` (not a v0.3 DSSE bundle of our payload type);
            ``untrusted-key`` (no identity is trusted, and the signer is not a revoked one);
            ``no-log-proof``; ``bad-log-proof``; ``foreign-trust-root``;
            ``certificate-outside-validity``; ``bad-signature``; ``wrong-issuer``,
            ``wrong-identity``, ``unanchored-identity``; ``retired-trust-root`` (the CA, a CT
            log or the log that vouched for it was outside its window at the verified time);
            ``revoked`` (a revoked identity signed a bundle that verifies); ``bad-bundle``
            (anything else the verifier refuses).
    """
    if len(sig_bytes) > cap:
        raise Rejected(Reason.TOO_LARGE, f"signature is {len(sig_bytes)} bytes, the cap is {cap}")
    obj = strictjson.loads(sig_bytes, "Sigstore bundle")
    _check_shape(obj)
    if (
        policy is None
        or not (policy.trusted or policy.revoked)
        or (not policy.trusted and policy.trusted_root is None)
    ):
        raise Rejected(Reason.UNTRUSTED_KEY, _NO_IDENTITY)
    if policy.trusted_root is None:
        raise Rejected(Reason.FOREIGN_TRUST_ROOT, "no Sigstore trust root is pinned")
    matcher = _IdentityMatch(policy)
    claims = LogClaims.of(obj["verificationMaterial"]["tlogEntries"][0])
    root = _root(policy.trusted_root)
    material = obj["verificationMaterial"]
    payload, bundle = _verify(sig_bytes, policy.trusted_root, matcher, claims, root, material)
    logs = vouched_by_named_log(claims, root)
    if not logs:
        raise Rejected(
            Reason.BAD_LOG_PROOF,
            "the log entry's checkpoint or SET is not signed by the log it names",
        )
    verified = verified_time(claims, bundle)
    cert = bundle.signing_certificate
    retired = retired_part(
        root,
        verified,
        issuers=issuing_cas(root, cert),
        sct_logs=sct_log_ids(cert),
        logs=logs,
    )
    if retired is not None:  # before revoked: a retired part's word makes no signature
        raise Rejected(
            Reason.RETIRED_TRUST_ROOT, f"retired trust-root part: {safe_text(retired, 200)}"
        )
    if matcher.revoked is not None:  # the bundle verified: now its signer's revocation counts
        raise Rejected(Reason.REVOKED, f"signed by a revoked identity ({matcher.revoked})")
    assert matcher.signer  # the verifier ran the policy, or raised
    (line, san), *others = matcher.signer
    signer = IdentitySigner(
        keyid=KEYID_PREFIX + san,
        name=line.name or san,
        identity=san,
        issuer=matcher.certified.issuer,
        log_index=claims.log_index,
        log_time=verified,
        line=line,
        also=tuple(other for other, _ in others),
        source=matcher.certified.source,
    )
    return payload, [signer]


def _check_shape(obj: object) -> None:
    """What plancache accepts of a bundle, checked before sigstore-python reads it."""
    if not isinstance(obj, dict) or obj.get("mediaType") not in BUNDLE_MEDIA_TYPES:
        raise Rejected(Reason.MALFORMED, "not a Sigstore bundle v0.3 (mediaType)")
    envelope, material = obj.get("dsseEnvelope"), obj.get("verificationMaterial")
    if not isinstance(envelope, dict) or "messageSignature" in obj:
        raise Rejected(Reason.MALFORMED, "the Sigstore bundle carries no DSSE envelope")
    if envelope.get("payloadType") != dsse.PAYLOAD_TYPE:
        raise Rejected(
            Reason.MALFORMED,
            f"payloadType is '{safe_text(envelope.get('payloadType'), 60)}', "
            f"expected {dsse.PAYLOAD_TYPE}",
        )
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or len(signatures) != 1:
        raise Rejected(Reason.MALFORMED, "a bundle's DSSE envelope holds exactly one signature")
    signature = signatures[0].get("sig") if isinstance(signatures[0], dict) else None
    for what, value in (("DSSE payload", envelope.get("payload")), ("signature", signature)):
        dsse.canonical_unb64(value, f"the Sigstore bundle's {what}")
    entries = material.get("tlogEntries") if isinstance(material, dict) else None
    if not isinstance(entries, list) or len(entries) != 1 or not isinstance(entries[0], dict):
        raise Rejected(Reason.NO_LOG_PROOF, "the bundle holds no transparency-log entry")
    proof = entries[0].get("inclusionProof")
    if not isinstance(proof, dict) or not proof.get("checkpoint"):
        raise Rejected(
            Reason.NO_LOG_PROOF, "the log entry has no inclusion proof with a checkpoint"
        )
    timestamps = material.get("timestampVerificationData") if isinstance(material, dict) else None
    stamped = isinstance(timestamps, dict) and timestamps.get("rfc3161Timestamps")
    if not entries[0].get("inclusionPromise") and not stamped:
        raise Rejected(
            Reason.NO_LOG_PROOF,
            "the log entry has no signed entry timestamp and no RFC 3161 timestamp",
        )
    count = len(stamped) if isinstance(stamped, list) else 0
    if not entries[0].get("inclusionPromise") and count != 1:
        raise Rejected(  # its one verified time must be the one the verifier used
            Reason.MALFORMED,
            "a bundle without a signed entry timestamp holds one RFC 3161 timestamp",
        )
    logged = _integrated_time(entries[0].get("integratedTime", 0))
    if logged is None:
        raise Rejected(Reason.MALFORMED, "the log entry's integratedTime is not a decimal number")
    if logged == 0 and not stamped:  # protobuf JSON leaves a zero out: absent is 0 too
        raise Rejected(
            Reason.NO_LOG_PROOF,
            "the log entry states no integrated time and there is no RFC "
            "3161 timestamp: nothing says when it was signed",
        )
    if logged > _LAST_TIME:  # the SET signs it: no log wrote this
        raise Rejected(
            Reason.BAD_LOG_PROOF, f"the log entry's integrated time ({logged}) is past year 9999"
        )


_LAST_TIME = 253402300799  # 9999-12-31T23:59:59Z, the last moment a datetime holds


def _integrated_time(value: object) -> int | None:
    """``integratedTime`` (an int64, a string in protobuf JSON); None unless plain ASCII digits
    (sigstore-python's reader would take ``"١٢"`` for 12)."""
    text = str(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else ""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 20 else None


def _check_material(bundle: Bundle, material: object) -> None:
    """A bundle's verification material is exactly what sigstore-python writes back for what it
    read of it: sigstore-python reads it leniently (base64 with characters outside the alphabet
    dropped, integers such as ``logIndex`` through ``int()``, so ``"0139"`` is 139), and a
    signature that verifies in many spellings would make a store's respelling invisible. One
    rule for a bare bundle and for an envelope's keyless entry, which is verified as the bundle
    it came from (:mod:`.dsse_extension`): a bundle and the entry co-signing makes of it verify
    alike (red team 8b: a respelt bundle verified, its entry was ``malformed``). Real bundles'
    material is in that form (sigstore-python's, sigstore-js's for GitHub's attestations, Rekor
    v2's: tests/data/sigstore). Compared as text: ``1 == 1.0 == True`` as Python values.

    Raises:
        Rejected: ``malformed``, the material is not in that form.
    """
    try:
        again = json.loads(bundle.to_json()).get("verificationMaterial")
    except Exception:  # what sigstore-python read, it writes; never a traceback all the same
        again = None
    if again is None or dsse.canonical_json(again) != dsse.canonical_json(material):
        raise Rejected(
            Reason.MALFORMED,
            "a keyless signature's verification material is not in canonical form (altered?)",
        )


@functools.lru_cache(maxsize=4)
def _root(trusted_root: bytes) -> TrustRoot:
    """The pinned root's parts and windows (:mod:`.trust_root`), once per root."""
    try:
        return parse_root(trusted_root)
    except ValueError as exc:
        raise Rejected(
            Reason.FOREIGN_TRUST_ROOT,
            f"the pinned Sigstore trust root is unusable ({safe_text(str(exc), 120)})",
        ) from None


class _IdentityMatch:
    """sigstore-python's ``VerificationPolicy``, run by its verifier on the certificate after
    the chain and the SCT: which trusted line the SAN and issuer match, or why none does."""

    def __init__(self, policy: IdentityPolicy) -> None:
        self.policy = policy
        self.signer: list[tuple[TrustedIdentity, str]] = []
        """Every trusted line the certificate matches, most specific first."""
        self.certified = CertifiedIdentity("", ())
        self.revoked: str | None = None
        """Who, when a revoked identity signed: said only once the whole bundle verified."""

    def verify(self, cert: Certificate) -> None:
        self.certified = certified = certified_identity(cert)
        if self.policy.revoking(certified) is not None:
            san = certified.sans[0] if certified.sans else "<no SAN>"
            self.revoked = _who(certified.issuer, san)
            return  # the verifier goes on: the log proof and the signature come next
        if not self.policy.trusted:
            raise _Refused(Reason.UNTRUSTED_KEY, _NO_IDENTITY)
        try:
            self.signer = trusted_lines(self.policy.trusted, certified)
        except Rejected as exc:
            raise _Refused(exc.reason, exc.detail) from None


_NO_IDENTITY = (
    "signed keylessly (a Sigstore bundle), and the trusted keys name no sigstore identity"
)


class _Refused(Exception):
    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _who(issuer: str, san: str) -> str:
    return f"{safe_text(san, 120)} from {safe_text(issuer, 80)}"


def _verify(
    sig_bytes: bytes,
    trusted_root: bytes,
    matcher: _IdentityMatch,
    claims: LogClaims,
    root: TrustRoot,
    material: object,
) -> tuple[bytes, Bundle]:
    """sigstore-python's verification, its errors mapped to reasons: first, that each key the
    bundle names is one of the root's (:func:`~.trust_root.unnamed_part`); last, that the
    bundle's ``material`` (its ``verificationMaterial``, as plancache read it) is what
    sigstore-python writes back for it (:func:`_check_material`)."""
    from sigstore.models import Bundle

    try:
        checker = verifier(trusted_root)
    except Exception as exc:
        raise Rejected(
            Reason.FOREIGN_TRUST_ROOT,
            f"the pinned Sigstore trust root is unusable ({type(exc).__name__})",
        ) from None
    try:
        bundle = Bundle.from_json(sig_bytes)
    except Exception as exc:  # pydantic's text spans lines: one line here
        detail = safe_text(" ".join(str(exc).split()), 160)
        raise Rejected(Reason.MALFORMED, f"Sigstore bundle: {detail}") from None
    cert = bundle.signing_certificate
    unnamed = unnamed_part(root, sct_logs=sct_log_ids(cert), log_id=claims.log_id)
    if unnamed is None and not issuing_cas(root, cert):
        unnamed = "no certificate authority of the pinned root issued its certificate"
    if unnamed is not None:
        raise Rejected(Reason.FOREIGN_TRUST_ROOT, f"another Sigstore instance: {unnamed}")
    try:
        payload_type, payload = checker.verify_dsse(bundle, matcher)
    except _Refused as exc:
        raise Rejected(exc.reason, exc.detail) from None
    except Exception as exc:
        raise refusal(exc, bundle, claims, root) from None
    if payload_type != dsse.PAYLOAD_TYPE:  # checked before, by _check_shape: belt and braces
        raise Rejected(Reason.MALFORMED, "the bundle's payloadType is not in-toto")
    # once it verified: a bundle that does is small (its proof, chain and stamps are checked), so
    # writing it back costs little, where a 16 MiB one of junk hashes would cost it twice over
    _check_material(bundle, material)
    return bytes(payload), bundle
