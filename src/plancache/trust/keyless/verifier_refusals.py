"""sigstore-python, where plancache meets it: its verifier built from a root's bytes, the time it
verified, and its refusals as plancache's reasons. The one module that knows sigstore-python's
shape; :mod:`.sigstore_bundle` holds what plancache accepts and in which order.

Only the public API of sigstore 4.5 (``>=4.5,<5``) is used: :class:`~sigstore.verify.Verifier`,
``verify_dsse``, :class:`~sigstore.models.Bundle` (``from_json``, ``signing_certificate``,
``verification_material``), :class:`~sigstore.errors.CertValidationError` and
:class:`~sigstore.errors.VerificationError`, and sigstore-models' ``TrustedRoot.from_json``.
What that API lacks, and how it is made up here (nowhere else):

1. **No public way to build a ``TrustedRoot`` from bytes** (only ``from_file(path)``, and the
   trust core reads no files): its constructor, documented ``@api private``, is given
   sigstore-models' public ``TrustedRoot.from_json`` (:func:`verifier`).
2. **``verify_dsse`` does not say which time it verified, nor which CA, CT log or log key
   vouched**: plancache reads them from the bundle's own JSON (the SET's ``integratedTime``, the
   log id) and from the certificate (the SCTs' log ids, the issuer), then checks them against
   the root's windows (:mod:`.trust_root`).
3. **Every refusal but the chain's is one ``VerificationError`` type**: the chain's refusal is
   told by its type (``CertValidationError``); which other step failed is told by its text,
   for the versions in the range (:func:`_classify`), tested against the oldest and newest.
4. **No public check of a log entry alone**: whether the log vouched for a time outside the
   certificate (``certificate-outside-validity``) or the time was altered (``bad-log-proof``)
   is told by verifying the signed entry timestamp here, by its documented format
   (:func:`_set_holds`); and which log key signed the checkpoint, since sigstore-python falls
   back to every key of the root (:func:`vouched_by_named_log`).
5. **A timestamp from a TSA outside its window is dropped without a word**: sigstore-python
   then says only that no verified time is left; :func:`_untimed` tells that case
   (``retired-trust-root``), and a stamp over another signature (``bad-bundle``), from a
   foreign TSA (``foreign-trust-root``).

One subtlety of sigstore-python's order: the certificate chain is checked at the log's time
*before* the log proof that vouches for the time. A bundle whose ``integratedTime`` was altered
fails the chain first; it is ``certificate-outside-validity`` only if its signed entry
timestamp verifies (the log itself said so), else ``bad-log-proof`` (the time is nobody's word).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..display import safe_text
from ..errors import Reason, Rejected
from ..statement import format_time
from .trust_root import LogKey, TrustRoot, issuing_cas, parse_root

if TYPE_CHECKING:
    from sigstore.models import Bundle
    from sigstore.verify import Verifier

_OUTSIDE = "the signing certificate was not valid at the logged time"


@dataclass(frozen=True)
class LogClaims:
    """What a bundle's log entry says of itself, read from its JSON (strict, already checked by
    the shape): claims until the verifier has run."""

    log_id: bytes
    log_index: int
    integrated_time: int
    """0 when absent (protobuf JSON leaves a zero out)."""
    promise: bytes | None
    """The signed entry timestamp (Rekor v1), or None (Rekor v2: the time is a TSA's)."""
    body: str
    checkpoint: str

    @classmethod
    def of(cls, entry: dict[str, Any]) -> LogClaims:
        log_id = entry.get("logId")
        promise = entry.get("inclusionPromise")
        signed = promise.get("signedEntryTimestamp") if isinstance(promise, dict) else None
        return cls(
            _unb64(log_id.get("keyId") if isinstance(log_id, dict) else None),
            _int(entry.get("logIndex")),
            _int(entry.get("integratedTime")),
            _unb64(signed) or None,
            str(entry.get("canonicalizedBody") or ""),
            _checkpoint(entry.get("inclusionProof")),
        )

    @property
    def time_is_signed(self) -> bool:
        """Whether the integrated time is the log's signed word (a SET covers it): what
        sigstore-python takes as a verified time, and so does plancache."""
        return self.promise is not None and self.integrated_time > 0


def verifier(trusted_root: bytes) -> Verifier:
    """One verifier per pinned root (parsing a root costs milliseconds; a store has thousands
    of bundles). Keyed by the root's bytes: a different root is a different verifier; and by
    which of its CAs have started on the real clock. sigstore-python's ``Verifier`` takes the
    CA certificates whose ``validFor`` has started when it is built (reading the real clock,
    as here) and keeps them: cached by the bytes alone, a long-running process would go on
    refusing, as ``foreign-trust-root``, every bundle of a CA that started after its first
    bundle (red team 48a: a rotation published ahead of time), until it restarts."""
    started = tuple(
        ca.window.started(datetime.now(timezone.utc)) for ca in _parts(trusted_root).cas
    )
    return _verifier(trusted_root, started)


@functools.lru_cache(maxsize=4)
def _parts(trusted_root: bytes) -> TrustRoot:
    return parse_root(trusted_root)


@functools.lru_cache(maxsize=4)
def _verifier(trusted_root: bytes, started: tuple[bool, ...]) -> Verifier:
    """sigstore-python's verifier of ``trusted_root`` while the CAs ``started`` names are the
    ones in service (part of the cache key only)."""
    from sigstore.models import TrustedRoot
    from sigstore.verify import Verifier
    from sigstore_models.trustroot import v1

    return Verifier(trusted_root=TrustedRoot(v1.TrustedRoot.from_json(trusted_root)))


def parse_trusted_root(data: bytes) -> Verifier:
    """A ``trusted_root.json``'s verifier (cached): what ``doctor`` and the keys layer check.

    Raises:
        ValueError: the bytes are not a Sigstore trusted root sigstore-python can use.
    """
    try:
        parse_root(data)  # what plancache reads of it too
        return verifier(data)
    except Exception as exc:
        raise ValueError(f"{type(exc).__name__}: {safe_text(str(exc), 160)}") from None


def verified_time(claims: LogClaims, bundle: Bundle) -> datetime:
    """The time the verifier established for a bundle that verified: Rekor v1's integrated
    time under its SET, else the bundle's one RFC 3161 timestamp (the shape allows exactly one
    without a SET, and sigstore-python needs one verified time: so that one verified). Never
    an ``integratedTime`` no SET covers: anyone can add one to a Rekor v2 bundle.

    Raises:
        Rejected: no SET and not exactly one timestamp (reason ``no-log-proof``).
    """
    if claims.time_is_signed:
        return datetime.fromtimestamp(claims.integrated_time, timezone.utc)
    data = bundle.verification_material.timestamp_verification_data
    stamps = data.rfc3161_timestamps if data is not None else []
    if len(stamps) != 1:  # the shape refused it before: belt and braces
        raise Rejected(Reason.NO_LOG_PROOF, "no single verified time for the bundle")
    moment = stamps[0].tst_info.gen_time
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def refusal(exc: Exception, bundle: Bundle, claims: LogClaims, root: TrustRoot) -> Rejected:
    """The reason for one refusal of ``verify_dsse`` (anything it raised, as raised)."""
    from sigstore.errors import CertValidationError

    if isinstance(exc, CertValidationError):
        moment = _claimed_time(claims, bundle)
        cert = bundle.signing_certificate
        if moment is not None and not (
            cert.not_valid_before_utc <= moment <= cert.not_valid_after_utc
        ):
            if not claims.time_is_signed or _set_holds(claims, root):
                return Rejected(Reason.CERT_OUTSIDE_VALIDITY, _OUTSIDE)
            return Rejected(
                Reason.BAD_LOG_PROOF,
                "the log time is outside the certificate, and the signed entry timestamp "
                "stating it does not verify (an altered time?)",
            )
        issuers = issuing_cas(root, cert)  # a CA of the root: sigstore-python left it out
        if issuers and not any(ca.window.started(datetime.now(timezone.utc)) for ca in issuers):
            return Rejected(  # as its Verifier does, on the real clock: not yet in service
                Reason.RETIRED_TRUST_ROOT,
                f"retired trust-root part: the CA '{safe_text(issuers[0].name, 80)}' "
                f"({issuers[0].window.describe()}) is not in service yet",
            )
        return Rejected(
            Reason.FOREIGN_TRUST_ROOT,
            f"the certificate does not chain to the pinned trust root ({safe_text(str(exc), 120)})",
        )
    reason, detail = _classify(str(exc))
    if reason is Reason.FOREIGN_TRUST_ROOT:  # no timestamp counted: the root's TSA's, perhaps
        return _untimed(bundle, root) or Rejected(reason, detail)
    return Rejected(reason, detail)


def _untimed(bundle: Bundle, root: TrustRoot) -> Rejected | None:
    """Why none of the bundle's timestamps gave sigstore-python a verified time, when a
    timestamp authority of the root signed one: it stamped another signature (``bad-bundle``:
    the bundle's, not the root's, fault), or it stamped this one outside its window
    (``retired-trust-root``); None when no authority of the root signed any (foreign).
    sigstore-python drops such a timestamp without a word and then says only that no verified
    time is left. The TSA's signature is checked as it checks it (rfc3161-client, its
    dependency, through its public API), over the stamp's own imprint, and the imprint is then
    compared with the bundle's signature here; the window as sigstore-python reads a TSA's: its
    end excluded (red team 48a: a stamp at the end was said to be foreign)."""
    from cryptography import x509
    from rfc3161_client import VerificationError, VerifierBuilder

    data = bundle.verification_material.timestamp_verification_data
    stamps = data.rfc3161_timestamps if data is not None else []
    for tsa in root.tsas:
        if len(tsa.certificates) < 2:
            continue
        certs = [x509.load_der_x509_certificate(der) for der in tsa.certificates]
        builder = VerifierBuilder().tsa_certificate(certs[0]).add_root_certificate(certs[-1])
        for cert in certs[1:-1]:
            builder = builder.add_intermediate_certificate(cert)
        checker = builder.build()
        for stamp in stamps:
            imprint = stamp.tst_info.message_imprint
            try:
                checker.verify(stamp, imprint.message)
            except (VerificationError, ValueError):
                continue
            if imprint.message != _digest(imprint.hash_algorithm.dotted_string, bundle.signature):
                return Rejected(
                    Reason.BAD_BUNDLE,
                    f"the RFC 3161 timestamp of '{safe_text(tsa.name, 80)}' does not cover "
                    "the bundle's signature",
                )
            moment = stamp.tst_info.gen_time
            moment = moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
            if not tsa.window.covers(moment) or moment == tsa.window.end:
                return Rejected(
                    Reason.RETIRED_TRUST_ROOT,
                    f"retired trust-root part: the timestamp authority "
                    f"'{safe_text(tsa.name, 80)}' ({tsa.window.describe()}, its end excluded) "
                    f"stamped it at {format_time(moment)}",
                )
    return None


_DIGESTS = {
    "2.16.840.1.101.3.4.2.1": "sha256",
    "2.16.840.1.101.3.4.2.2": "sha384",
    "2.16.840.1.101.3.4.2.3": "sha512",
}
"""The imprint hashes rfc3161-client verifies a message under (its ``verify_message``)."""


def _digest(oid: str, message: bytes) -> bytes | None:
    import hashlib

    name = _DIGESTS.get(oid)
    return hashlib.new(name, message).digest() if name else None


def _claimed_time(claims: LogClaims, bundle: Bundle) -> datetime | None:
    """The time the chain was checked at: the SET's, else the timestamp's (sigstore-python
    checks the chain only at timestamps that verified)."""
    try:
        return verified_time(claims, bundle)
    except (Rejected, OverflowError, OSError, ValueError):
        return None


def _set_holds(claims: LogClaims, root: TrustRoot) -> bool:
    """Whether the signed entry timestamp verifies under a root's log key its log id names."""
    return any(_set_signed_by(key, claims) for key in root.tlogs_named(claims.log_id))


def _set_signed_by(key: LogKey, claims: LogClaims) -> bool:
    """Whether ``key`` signed the entry's SET: Rekor v1 signs the canonical JSON of the entry's
    body, integrated time, log id (hex) and index (ASCII strings and integers only, so sorted
    compact JSON is its RFC 8785 form)."""
    if claims.promise is None:
        return False
    payload = json.dumps(
        {
            "body": claims.body,
            "integratedTime": claims.integrated_time,
            "logID": claims.log_id.hex(),
            "logIndex": claims.log_index,
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode("ascii")
    return key.verifies(claims.promise, payload)


def vouched_by_named_log(claims: LogClaims, root: TrustRoot) -> list[LogKey]:
    """The root's entries for the log the entry names whose key signed its checkpoint (and its
    SET, if any) itself; empty when none did. sigstore-python tries every log key of the root
    when the named one is not found by its key hash, which is always so for a Rekor v2 log (its
    declared id is its signed-note id): without this, a retired log's key could sign under a
    current log's name. Every entry is tried (a key listed once per window), so the order of
    the root's entries decides nothing."""
    return [key for key in root.tlogs_named(claims.log_id) if _signed_checkpoint(key, claims)]


def _signed_checkpoint(key: LogKey, claims: LogClaims) -> bool:
    """Whether ``key`` signed the entry's checkpoint (a signed note's line under its key hint)
    and, where the time is the log's word, its SET."""
    if claims.time_is_signed and not _set_signed_by(key, claims):
        return False
    text = claims.checkpoint
    if text.count("\n\n") != 1:
        return False
    note, block = text.split("\n\n")
    for line in block.splitlines():
        name_sig = line.removeprefix("\u2014 ").split(" ")
        raw = _unb64(name_sig[-1]) if line.startswith("\u2014 ") and len(name_sig) == 2 else b""
        if raw[:4] == claims.log_id[:4] and key.verifies(raw[4:], (note + "\n").encode()):
            return True
    return False


def _checkpoint(proof: object) -> str:
    checkpoint = proof.get("checkpoint") if isinstance(proof, dict) else None
    envelope = checkpoint.get("envelope") if isinstance(checkpoint, dict) else None
    return envelope if isinstance(envelope, str) else ""


def _classify(message: str) -> tuple[Reason, str]:
    """sigstore-python's ``VerificationError`` texts (4.5.x) to reasons: the one place that reads
    them (tests/test_keyless_hostile_bundles.py refuses each kind under the oldest and newest
    sigstore of the range)."""
    text = safe_text(message, 200)
    if message.startswith("invalid log entry") or "log entry" in message:
        return Reason.BAD_LOG_PROOF, f"the transparency-log proof does not verify: {text}"
    if "expired at time of signing" in message:
        return Reason.CERT_OUTSIDE_VALIDITY, _OUTSIDE
    if message.startswith("DSSE: invalid signature"):
        return (
            Reason.BAD_SIGNATURE,
            "the bundle's DSSE signature does not verify (altered payload?)",
        )
    if "verified time" in message:  # its timestamps verify under no authority of the root
        return Reason.FOREIGN_TRUST_ROOT, f"no timestamp the pinned root trusts: {text}"
    return Reason.BAD_BUNDLE, f"the Sigstore bundle does not verify: {text}"


def _unb64(value: object) -> bytes:
    try:
        return base64.b64decode(value, validate=True) if isinstance(value, str) else b""
    except (binascii.Error, ValueError):
        return b""


def _int(value: object) -> int:
    """An int64 field (a string in protobuf JSON); 0 unless plain ASCII digits."""
    text = str(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else ""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 20 else 0
