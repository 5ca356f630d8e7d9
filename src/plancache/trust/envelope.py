"""DSSE envelopes (the ``.sig`` sidecar) and their pre-authentication encoding.

A signature covers ``PAE(payloadType, payload)``, never the JSON around it, so the envelope
itself is not signed. To make *every* byte of a sidecar matter anyway (a flipped whitespace
or an unused base64 bit must not yield a second "valid" sidecar), an envelope is only
accepted in the exact canonical form :func:`encode` writes: decode, re-encode, compare.

A signature is a key's (``keyid``, ``sig``) or a keyless one: DSSE v1.1's signature extension
of kind :data:`SIGSTORE_EXTENSION`, whose ``ext`` is the Sigstore bundle's
``verificationMaterial`` (certificate, log entry, proofs) and whose ``sig`` is that bundle's
signature over the same PAE (``keyid`` empty: the certificate names the signer). So one
envelope holds key and keyless signatures together, as a threshold needs; nothing in an
``ext`` is trusted here, it is only carried: :mod:`plancache.trust.keyless.dsse_extension`
rebuilds the bundle and verifies it. Each keyless signature may add
:data:`KEYLESS_ALLOWANCE` bytes to a kind's cap (:func:`keyless_cap`), so a key envelope's
cap stays what it was and a keyless one near it still fits.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import strictjson
from .display import safe_text
from .errors import Reason, Rejected

PAYLOAD_TYPE = "application/vnd.in-toto+json"
MAX_SIG_BYTES = 64 * 1024
MAX_SIGNATURES = 16
"""More signatures than trusted keys can ever be useful only to an attacker burning CPU."""
SIGSTORE_EXTENSION = "application/vnd.dev.sigstore.verificationmaterial;version=0.3"
"""The one signature extension kind accepted (DSSE extensions.md): a Sigstore bundle v0.3's
verification material."""
MAX_EXT_BYTES = 16 * 1024
"""Cap on one keyless signature's ``ext``, encoded: a Fulcio certificate, the log entry with its
inclusion proof and checkpoint, a timestamp. Public-good bundles' are 9-10 KB (GitHub's
certificates are large); the local test instance's about 3 KB."""
KEYLESS_ALLOWANCE = MAX_EXT_BYTES + 1024
"""What one keyless signature may add to its kind's cap: its ``ext`` and the entry around it
(kind, signature, keys)."""


def keyless_cap(cap: int, keyless: int = MAX_SIGNATURES) -> int:
    """The size cap of a signature object of a kind capped at ``cap`` holding ``keyless``
    keyless signatures (by default the most an envelope may: what a reader reads at most)."""
    return cap + keyless * KEYLESS_ALLOWANCE


MAX_SIG_OBJECT_BYTES = keyless_cap(MAX_SIG_BYTES)
"""What a reader reads of a plan's sidecar or a plan set's head at most (:func:`keyless_cap`)."""


@dataclass(frozen=True)
class Signature:
    keyid: str
    sig: bytes
    ext: Mapping[str, Any] | None = None
    """A keyless signature's Sigstore verification material (the ``ext`` of a signature
    extension of kind :data:`SIGSTORE_EXTENSION`); None for a key's signature."""


@dataclass(frozen=True)
class Envelope:
    payload_type: str
    payload: bytes
    signatures: tuple[Signature, ...]


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what the Ed25519 signatures actually sign."""
    type_bytes = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(type_bytes), type_bytes, len(payload), payload)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def canonical_json(obj: object) -> str:
    """The one compact form of a JSON value: keys sorted, no spaces, ASCII (escapes for the
    rest). What an envelope's entries are written in, and what two readings of one value are
    compared in (:mod:`.keyless.sigstore_bundle`)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _entry(signature: Signature) -> dict[str, Any]:
    entry: dict[str, Any] = {"keyid": signature.keyid, "sig": _b64(signature.sig)}
    if signature.ext is not None:
        entry["extension"] = {"ext": signature.ext, "kind": SIGSTORE_EXTENSION}
    return entry


def _entry_json(signature: Signature) -> str:
    if signature.ext is not None:
        return canonical_json(_entry(signature))
    # A key's entry, written as canonical_json(_entry(...)) writes it (keys sorted, no spaces)
    # without walking a dict: base64 needs no JSON escape, json.dumps escapes the key id.
    return f'{{"keyid":{json.dumps(signature.keyid)},"sig":"{_b64(signature.sig)}"}}'


def encode(envelope: Envelope) -> bytes:
    """The one canonical serialisation of an envelope (compact JSON, sorted keys, ASCII,
    newline): ``payload`` < ``payloadType`` < ``signatures``, each entry's keys sorted as
    :func:`canonical_json` sorts them. Spelled out rather than dumped from a dict: every sidecar
    read is re-encoded to check its form (:func:`decode`), and a dict dump cost a third of
    decoding."""
    entries = ",".join(_entry_json(s) for s in envelope.signatures)
    payload = _b64(envelope.payload)
    payload_type = json.dumps(envelope.payload_type)
    text = f'{{"payload":"{payload}","payloadType":{payload_type},"signatures":[{entries}]}}\n'
    return text.encode("ascii")


def unb64(value: object, what: str) -> bytes:
    """Strict base64 (no stray characters) of a JSON value; ``what`` names it in the error.

    Raises:
        Rejected: not a string, or not base64 (reason ``malformed``).
    """
    if not isinstance(value, str):
        raise Rejected(Reason.MALFORMED, f"{what} is not a string")
    try:  # not binascii's strict_mode directly: Python 3.10 (requires-python) has none
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise Rejected(Reason.MALFORMED, f"{what} is not base64") from None


def canonical_unb64(value: object, what: str) -> bytes:
    """:func:`unb64`, and ``value`` exactly the base64 of what it decodes to: Python's strict
    mode still reads padding a value does not need (``AAAA=`` on 3.10 and 3.11, other lengths
    on each), and a DSSE signature's or payload's base64 outside an envelope (a Sigstore
    bundle's, which is not re-encoded and compared as a whole) must have one spelling.

    Raises:
        Rejected: ``malformed``, not a string, not base64, or not canonical.
    """
    data = unb64(value, what)
    if base64.b64encode(data).decode("ascii") != value:
        raise Rejected(Reason.MALFORMED, f"{what} is not canonical base64 (altered?)")
    return data


def _extension(value: object) -> Mapping[str, Any]:
    """A signature extension's ``ext``: Sigstore's kind only, a JSON object, within its cap."""
    if not isinstance(value, dict) or set(value) != {"ext", "kind"}:
        raise Rejected(
            Reason.MALFORMED, "signature envelope: an extension must have exactly ext and kind"
        )
    if value["kind"] != SIGSTORE_EXTENSION:
        raise Rejected(
            Reason.MALFORMED,
            f"signature envelope: extension kind '{safe_text(value['kind'], 80)}' is not "
            f"{SIGSTORE_EXTENSION}",
        )
    ext = value["ext"]
    if not isinstance(ext, dict):
        raise Rejected(Reason.MALFORMED, "signature envelope: an extension's ext is not an object")
    size = len(canonical_json(ext))
    if size > MAX_EXT_BYTES:
        raise Rejected(
            Reason.TOO_LARGE,
            f"a keyless signature's verification material is {size} bytes, the cap is "
            f"{MAX_EXT_BYTES}",
        )
    return ext


def _signature(raw: object) -> Signature:
    # exactly these keys, asked without building a set (a dict's keys are distinct)
    if (
        isinstance(raw, dict)
        and len(raw) == 2
        and "keyid" in raw
        and "sig" in raw
        and isinstance(raw["keyid"], str)
    ):
        return Signature(raw["keyid"], unb64(raw["sig"], "signature envelope: sig"))
    if isinstance(raw, dict) and set(raw) == {"extension", "keyid", "sig"} and raw["keyid"] == "":
        ext = _extension(raw["extension"])
        return Signature("", unb64(raw["sig"], "signature envelope: sig"), ext)
    raise Rejected(
        Reason.MALFORMED,
        "signature envelope: each signature needs exactly keyid and sig, or an empty keyid, sig "
        "and a Sigstore extension",
    )


_ONE_KEY_ENVELOPE = re.compile(
    rb'\{"payload":"(?=([A-Za-z0-9+/]*={0,2}))\1","payloadType":"(?=([ !#-\[\]-~]*))\2",'
    rb'"signatures":\[\{"keyid":"(?=([ !#-\[\]-~]*))\3","sig":"(?=([A-Za-z0-9+/]*={0,2}))\4"'
    rb"\}\]\}\n"
)
"""The canonical form of the common sidecar, one key's signature, with every string in it one
that JSON writes as it is (printable ASCII but ``"`` and ``\\``): such bytes mean what they
spell, so :func:`_one_key` reads them without a JSON parse. Each string is taken whole (a
lookahead's group, then a backreference to it: Python 3.10 has no possessive ``*+``), so a
sidecar that is not the form fails in one pass: given characters back one by one, a 64 KiB
hostile sidecar cost ~1 ms here (~0.1 ms by JSON), a 16 MiB manifest signature's ~330 ms (red
team 8b). The same matches: each string ends at a ``"``, which its characters never are."""


def _one_key(data: bytes) -> Envelope | None:
    """The envelope in ``data`` when ``data`` is :data:`_ONE_KEY_ENVELOPE` with canonical
    base64; None for anything else, which :func:`decode` reads the general way (and refuses as
    it always did). Why: every plan of a 10,000-plan verify has such a sidecar, and the pattern
    and two base64 round trips cost half the JSON parse and re-encoding (~4 us a plan). Why it
    is the same: the pattern fixes the keys, their order, the separators, the one signature and
    the newline, and leaves no string an escape could spell; what is left of :func:`encode`'s
    form is the base64, compared here as the re-encoding compares it."""
    match = _ONE_KEY_ENVELOPE.fullmatch(data)
    if match is None:
        return None
    payload_b64, payload_type, keyid, sig_b64 = match.groups()
    try:
        payload, sig = binascii.a2b_base64(payload_b64), binascii.a2b_base64(sig_b64)
    except binascii.Error:  # padding in the wrong place: the general path says so
        return None
    if (
        binascii.b2a_base64(payload, newline=False) != payload_b64
        or binascii.b2a_base64(sig, newline=False) != sig_b64
    ):
        return None  # not canonical base64 (unused bits set): refused by the general path
    return Envelope(payload_type.decode("ascii"), payload, (Signature(keyid.decode("ascii"), sig),))


def decode(data: bytes, cap: int = MAX_SIG_BYTES) -> Envelope:
    """Parse a sidecar: a DSSE envelope, exactly in the canonical form :func:`encode` writes.

    ``cap`` is the kind's cap for key signatures; each keyless signature adds its allowance
    (:func:`keyless_cap`), counted before anything is parsed from the extensions the bytes
    name, then again from those they hold.

    Raises:
        Rejected: ``too-large`` (over the cap, or an ``ext`` over :data:`MAX_EXT_BYTES`),
            ``malformed`` (not JSON, not exactly the envelope's keys and types, not base64, not
            1 to :data:`MAX_SIGNATURES` signatures, an extension of another kind or with other
            fields, not in canonical form).
    """
    named = min(data.count(b'"extension":'), MAX_SIGNATURES)
    if len(data) > keyless_cap(cap, named):
        raise Rejected(
            Reason.TOO_LARGE,
            f"signature is {len(data)} bytes, the cap is {keyless_cap(cap, named)}",
        )
    envelope = None if named else _one_key(data)
    return envelope if envelope is not None else _decode_any(data, cap, named)


def _decode_any(data: bytes, cap: int, named: int) -> Envelope:
    """:func:`decode` of any envelope within its cap, ``named`` keyless signatures counted: the
    JSON parse, each field's checks, then the canonical re-encoding compared with ``data``.

    Raises:
        Rejected: :func:`decode`'s reasons.
    """
    obj = strictjson.loads(data, "signature envelope")
    if not isinstance(obj, dict) or set(obj) != {"payload", "payloadType", "signatures"}:
        raise Rejected(
            Reason.MALFORMED,
            "signature envelope must have exactly payload, payloadType, signatures",
        )
    payload_type = obj["payloadType"]
    if not isinstance(payload_type, str):
        raise Rejected(Reason.MALFORMED, "signature envelope: payloadType is not a string")
    payload = unb64(obj["payload"], "signature envelope: payload")
    raw_sigs = obj["signatures"]
    if not isinstance(raw_sigs, list) or not 1 <= len(raw_sigs) <= MAX_SIGNATURES:
        raise Rejected(
            Reason.MALFORMED, f"signature envelope must hold 1 to {MAX_SIGNATURES} signatures"
        )
    signatures = tuple([_signature(raw) for raw in raw_sigs])
    keyless = sum(s.ext is not None for s in signatures) if named else 0
    if keyless < named and len(data) > keyless_cap(cap, keyless):  # fewer than the bytes named
        raise Rejected(
            Reason.TOO_LARGE,
            f"signature is {len(data)} bytes, the cap is {keyless_cap(cap, keyless)}",
        )
    envelope = Envelope(payload_type, payload, signatures)
    if encode(envelope) != data:
        raise Rejected(Reason.MALFORMED, "signature envelope is not in canonical form (altered?)")
    return envelope


def is_bundle(sig_bytes: bytes) -> bool:
    """Whether a signature object is a Sigstore bundle rather than a DSSE envelope: a canonical
    envelope starts with its ``payload`` key, a bundle names its ``mediaType``. Cheap, parses
    nothing: what it says is only which verifier runs. Here rather than beside the bundle's
    verifier (:mod:`.keyless.sigstore_bundle`) so that a keyring of keys alone never imports
    the keyless modules to ask."""
    return not sig_bytes.startswith(b'{"payload":') and b'"mediaType"' in sig_bytes[:4096]
