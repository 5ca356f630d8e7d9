"""What a Fulcio certificate says of its signer, read as text: the OIDC issuer, every SAN, and
the extensions that say which build it was issued to.

Fulcio's certificate extensions (its ``docs/oid-info.md``) are DER ``UTF8String`` values under
``1.3.6.1.4.1.57264.1``, apart from the deprecated ``.1.1`` to ``.1.6`` (raw bytes): the issuer
(``.1.8``, else ``.1.1``), the source repository URI (``.1.12``), its ref (``.1.14``), the build
config URI (``.1.18``: for GitHub the *calling* workflow) and the build trigger (``.1.20``: the
event, ``push``, ``pull_request_target``…). The SAN is decoded to its text whatever its type,
Sigstore's ``otherName`` (``.1.7``, a ``UTF8String``, for username issuers) included, so an exact
line can match it. A value that does not decode is left out (a pinned field then does not
match), never guessed: a ``.1.8`` that is not a ``UTF8String`` leaves the issuer
empty rather than falling back to ``.1.1``. Read only from a certificate the verifier has
chained to the trust root.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..keyring.identity_match import SOURCE_FIELDS, CertifiedIdentity

if TYPE_CHECKING:
    from cryptography.x509 import Certificate, GeneralName

_ISSUER_V2_OID = "1.3.6.1.4.1.57264.1.8"
_ISSUER_V1_OID = "1.3.6.1.4.1.57264.1.1"
SOURCE_OIDS = {
    "source-repository": "1.3.6.1.4.1.57264.1.12",
    "source-ref": "1.3.6.1.4.1.57264.1.14",
    "build-config": "1.3.6.1.4.1.57264.1.18",
    "build-trigger": "1.3.6.1.4.1.57264.1.20",
}
"""Each source field's Fulcio extension (issue 48 item 3)."""
assert tuple(SOURCE_OIDS) == SOURCE_FIELDS


def _utf8(der: bytes) -> str | None:
    """A DER ``UTF8String``'s text; None when the bytes are anything else."""
    from cryptography.hazmat import asn1

    try:
        return str(asn1.decode_der(str, der))
    except Exception:
        return None


def _san_text(name: GeneralName) -> str | None:
    """A SAN's text value: an e-mail, URI or DNS name as it is, an IP address written out, a
    directory name as RFC 4514, a registered id dotted, an ``otherName`` its DER string's text."""
    from cryptography import x509

    if isinstance(name, x509.OtherName):
        return _utf8(name.value)
    if isinstance(name, x509.DirectoryName):
        return name.value.rfc4514_string()
    if isinstance(name, x509.RegisteredID):
        return name.value.dotted_string
    return str(name.value)


def certified_identity(cert: Certificate) -> CertifiedIdentity:
    """The certificate's issuer, SANs (in the certificate's order) and source extensions."""
    from cryptography import x509

    issuer: str | None = None
    issuer_v1 = ""
    stated: dict[str, str] = {}
    fields = {oid: name for name, oid in SOURCE_OIDS.items()}
    for ext in cert.extensions:
        value = ext.value
        if not isinstance(value, x509.UnrecognizedExtension):
            continue
        oid = ext.oid.dotted_string
        if oid == _ISSUER_V2_OID:
            issuer = _utf8(value.value) or ""  # present but not text: no issuer, not the v1
        elif oid == _ISSUER_V1_OID:
            issuer_v1 = value.value.decode("utf-8", "replace")
        elif oid in fields and (text := _utf8(value.value)) is not None:
            stated[fields[oid]] = text
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        names: list[str] = []
    else:
        names = [text for name in san if (text := _san_text(name)) is not None]
    source = tuple((k, stated[k]) for k in SOURCE_FIELDS if k in stated)
    return CertifiedIdentity(issuer_v1 if issuer is None else issuer, tuple(names), source)
