"""The parts of a pinned Sigstore trust root and the times they were valid: what decides
whether a root can verify anything (:func:`unusable`), and whether the parts that proved one
bundle were in service when it was signed (:func:`retired_part`).

A ``trusted_root.json`` lists Fulcio CAs, CT logs, transparency logs and timestamp authorities,
each with a ``validFor`` window. Sigstore retires a part by giving it an end date, not by
removing it (the shipped public-good root keeps a CA retired at the end of 2022 whose
certificate is valid until 2031, and a retired CT log), because old signatures must still
verify. So the end date means "signatures made after this are not this part's": a bundle whose
chain, SCT or log entry is vouched for by a part retired before the bundle's *verified* time is
``retired-trust-root``, however valid its cryptography. sigstore-python 4.5 looks log and CT keys
up with their windows ignored and never compares a CA's window with the verified time; this is
the check it leaves out (sigstore-go makes it).

Read from the root's bytes as plain JSON (the documented protobuf-JSON format of
``dev.sigstore.trustroot.v1.TrustedRoot``), not from sigstore-python's objects: the same parts,
the same windows, for ``verify`` and for ``doctor``. Keys are named as sigstore-python and RFC
6962 name them: SHA-256 of the DER public key. Pure: bytes in, no IO, no sigstore import.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from .. import strictjson
from ..errors import Rejected
from ..statement import format_time

if TYPE_CHECKING:
    from cryptography.x509 import Certificate


@dataclass(frozen=True)
class Window:
    """A ``validFor``: from ``start`` (None: always) to ``end`` (None: no end), both included
    (as sigstore-python's own window test)."""

    start: datetime | None
    end: datetime | None

    def covers(self, moment: datetime) -> bool:
        return (self.start is None or self.start <= moment) and (
            self.end is None or moment <= self.end
        )

    def started(self, moment: datetime) -> bool:
        return self.start is None or self.start <= moment

    def describe(self) -> str:
        start = format_time(self.start) if self.start else "always"
        end = format_time(self.end) if self.end else "no end"
        return f"valid {start} to {end}"


@dataclass(frozen=True)
class LogKey:
    """A transparency log's or CT log's key: its RFC 6962 key id (SHA-256 of the DER key, as
    sigstore-python names keys), the log id the root declares (Rekor v2 logs declare their
    signed-note id, not the key's hash), and its window."""

    key_id: bytes
    window: Window
    url: str
    der: bytes = b""
    declared_id: bytes = b""

    def named(self, log_id: bytes) -> bool:
        return log_id in (self.key_id, self.declared_id)

    def verifies(self, signature: bytes, data: bytes) -> bool:
        """Whether ``signature`` over ``data`` is this key's (ECDSA with the curve's hash, as
        Sigstore's logs sign; Ed25519; RSA PKCS#1 v1.5 SHA-256)."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

        try:
            key = serialization.load_der_public_key(self.der)
            if isinstance(key, ec.EllipticCurvePublicKey):
                digest = {256: hashes.SHA256(), 384: hashes.SHA384()}.get(
                    key.curve.key_size, hashes.SHA512()
                )
                key.verify(signature, data, ec.ECDSA(digest))
            elif isinstance(key, ed25519.Ed25519PublicKey):
                key.verify(signature, data)
            elif isinstance(key, rsa.RSAPublicKey):
                key.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
            else:
                return False
        except (InvalidSignature, ValueError, TypeError):
            return False
        return True


@dataclass(frozen=True)
class Authority:
    """A Fulcio CA or a timestamp authority: its chain (DER, issuing certificate first) and its
    window."""

    certificates: tuple[bytes, ...]
    window: Window
    name: str


@dataclass(frozen=True)
class TrustRoot:
    cas: tuple[Authority, ...]
    tlogs: tuple[LogKey, ...]
    ctlogs: tuple[LogKey, ...]
    tsas: tuple[Authority, ...]

    def tlog(self, log_id: bytes) -> LogKey | None:
        return next((k for k in self.tlogs if k.named(log_id)), None)

    def ctlog(self, log_id: bytes) -> LogKey | None:
        return next((k for k in self.ctlogs if k.named(log_id)), None)

    def tlogs_named(self, log_id: bytes) -> list[LogKey]:
        """Every transparency-log entry ``log_id`` names: a key the root lists twice (served,
        retired, serving again) has one entry per window, and which comes first must not
        decide (the verdict does not depend on the order of entries)."""
        return [k for k in self.tlogs if k.named(log_id)]

    def ctlogs_signing(self, log_id: bytes) -> list[LogKey]:
        """The CT-log entries whose key an SCT naming ``log_id`` is checked with: those whose
        key hashes to it (RFC 6962's log id), else those that declare it; every one of them,
        in any order (see :meth:`tlogs_named`)."""
        by_key = [k for k in self.ctlogs if k.key_id == log_id]
        return by_key or [k for k in self.ctlogs if k.named(log_id)]


def parse_root(data: bytes) -> TrustRoot:
    """A ``trusted_root.json``'s parts.

    Raises:
        ValueError: not a trusted root (not strict JSON, a part without its key or chain, a
            window that is not an RFC 3339 time).
    """
    try:
        root = strictjson.loads(data, "Sigstore trusted root")
    except Rejected as exc:
        raise ValueError(exc.detail) from None
    if not isinstance(root, dict):
        raise ValueError("not a JSON object")
    return TrustRoot(
        tuple(
            _authority(c, "certificateAuthorities") for c in _list(root, "certificateAuthorities")
        ),
        tuple(_log_key(t, "tlogs") for t in _list(root, "tlogs")),
        tuple(_log_key(t, "ctlogs") for t in _list(root, "ctlogs")),
        tuple(_authority(t, "timestampAuthorities") for t in _list(root, "timestampAuthorities")),
    )


def unusable(root: TrustRoot, now: datetime) -> str | None:
    """Why ``root`` can verify no bundle at all, or None. A bundle needs a Fulcio CA, a CT log
    key for its SCT and a transparency-log key for its checkpoint (sigstore-python skips a key
    or CA whose window has not started: a root of such parts refuses every bundle, and each
    refusal would blame the bundle)."""
    if not root.cas:
        return "it names no Fulcio certificate authority"
    if not any(ca.window.started(now) for ca in root.cas):
        return "no certificate authority of it is valid yet"
    if not root.ctlogs:
        return "it names no CT log (every certificate's SCT would fail)"
    if not any(k.window.started(now) for k in root.ctlogs):
        return "no CT log key of it is valid yet"
    if not root.tlogs:
        return "it names no transparency log"
    if not any(k.window.started(now) for k in root.tlogs):
        return "no transparency-log key of it is valid yet"
    return None


def retired_part(
    root: TrustRoot,
    verified: datetime,
    *,
    issuers: list[Authority],
    sct_logs: list[bytes],
    logs: list[LogKey],
) -> str | None:
    """Which part that vouched for a verified bundle was out of service at ``verified`` (the
    bundle's verified signing time), or None: the CA that issued its certificate, the CT log of
    each SCT, and the transparency log of its entry (``logs``: the root's entries whose key
    signed its checkpoint). The same key may serve under several windows (a root that lists it
    once per window): one of its entries must cover the time, whichever the root lists first.
    A key id the root does not name is not this function's to judge (:func:`unnamed_part`)."""
    when = format_time(verified)
    if issuers and not any(ca.window.covers(verified) for ca in issuers):
        return f"the CA '{issuers[0].name}' ({issuers[0].window.describe()}) issued it at {when}"
    for sct in sct_logs:
        cts = root.ctlogs_signing(sct)
        if cts and not any(ct.window.covers(verified) for ct in cts):
            ct = cts[0]
            return f"the CT log {ct.url} ({ct.window.describe()}) vouched for it at {when}"
    if logs and not any(log.window.covers(verified) for log in logs):
        log = logs[0]
        return f"the transparency log {log.url} ({log.window.describe()}) logged it at {when}"
    return None


def issuing_cas(root: TrustRoot, cert: Certificate) -> list[Authority]:
    """The root's CAs one of whose certificates directly issued ``cert``."""
    from cryptography import x509

    found = []
    for ca in root.cas:
        for der in ca.certificates:
            try:
                cert.verify_directly_issued_by(x509.load_der_x509_certificate(der))
            except Exception:  # another issuer, a key of another type, a broken certificate
                continue
            found.append(ca)
            break
    return found


def sct_log_ids(cert: Certificate) -> list[bytes]:
    """The CT log ids of a certificate's embedded SCTs (none: the verifier refuses it)."""
    from cryptography import x509

    try:
        scts = cert.extensions.get_extension_for_class(
            x509.PrecertificateSignedCertificateTimestamps
        ).value
    except (x509.ExtensionNotFound, ValueError):
        return []
    return [sct.log_id for sct in scts]


def unnamed_part(root: TrustRoot, *, sct_logs: list[bytes], log_id: bytes) -> str | None:
    """Which key id of a bundle names no part of ``root``, or None. sigstore-python tries every
    key of the root when the named one is missing, so a bundle that names none could have
    been vouched for by any (a retired one included): plancache accepts only keys it can name."""
    if root.tlog(log_id) is None:
        return (
            f"its log entry names a transparency log the pinned root does not ({log_id[:8].hex()})"
        )
    for sct in sct_logs:
        if root.ctlog(sct) is None:
            return f"its SCT names a CT log the pinned root does not ({sct[:8].hex()})"
    return None


def _list(obj: dict[str, object], key: str) -> list[dict[str, object]]:
    value = obj.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError(f"{key} is not a list of objects")
    return value


def _window(obj: dict[str, object], where: str) -> Window:
    valid = obj.get("validFor")
    if valid is None:
        return Window(None, None)
    if not isinstance(valid, dict):
        raise ValueError(f"{where}: validFor is not an object")
    start, end = _time(valid.get("start"), where), _time(valid.get("end"), where)
    if start is not None and end is not None and end < start:  # a typo: in service never
        raise ValueError(f"{where}: a validFor ends ({format_time(end)}) before it starts")
    return Window(start, end)


def _time(value: object, where: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{where}: a validFor time is not a string")
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{where}: '{value[:40]}' is not an RFC 3339 time") from None
    if moment.tzinfo is None:
        raise ValueError(f"{where}: '{value[:40]}' has no time zone")
    try:  # in UTC, so every window can be said (format_time) and compared
        return moment.astimezone(timezone.utc)
    except OverflowError:
        raise ValueError(f"{where}: '{value[:40]}' is outside the calendar in UTC") from None


def _raw(value: object, where: str) -> bytes:
    try:
        raw = base64.b64decode(value, validate=True) if isinstance(value, str) else b""
    except (binascii.Error, ValueError):
        raw = b""
    if not raw:
        raise ValueError(f"{where}: rawBytes missing or not base64")
    return raw


def _log_key(obj: dict[str, object], where: str) -> LogKey:
    public = obj.get("publicKey")
    if not isinstance(public, dict):
        raise ValueError(f"{where}: an entry has no publicKey")
    der = _raw(public.get("rawBytes"), where)
    url = obj.get("baseUrl")
    log_id = obj.get("logId")
    declared = log_id.get("keyId") if isinstance(log_id, dict) else None
    return LogKey(
        hashlib.sha256(der).digest(),
        _window(public, where),
        str(url or "<no url>"),
        der,
        _raw(declared, where) if declared else b"",
    )


def _authority(obj: dict[str, object], where: str) -> Authority:
    chain = obj.get("certChain")
    certs = chain.get("certificates") if isinstance(chain, dict) else None
    if not isinstance(certs, list) or not certs:
        raise ValueError(f"{where}: an entry has no certChain")
    raw = tuple(_raw(c.get("rawBytes") if isinstance(c, dict) else None, where) for c in certs)
    subject = obj.get("subject")
    name = subject.get("commonName") if isinstance(subject, dict) else None
    return Authority(raw, _window(obj, where), str(name or obj.get("uri") or "<unnamed>"))
