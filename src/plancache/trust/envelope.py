"""DSSE envelopes (the ``.sig`` sidecar) and their pre-authentication encoding.

A signature covers ``PAE(payloadType, payload)``, never the JSON around it, so the envelope
itself is not signed. To make *every* byte of a sidecar matter anyway (a flipped whitespace
or an unused base64 bit must not yield a second "valid" sidecar), an envelope is only
accepted in the exact canonical form :func:`encode` writes: decode, re-encode, compare.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from . import strictjson
from .errors import Reason, Rejected

PAYLOAD_TYPE = "application/vnd.in-toto+json"
MAX_SIG_BYTES = 64 * 1024
MAX_SIGNATURES = 16
"""More signatures than trusted keys can ever be useful only to an attacker burning CPU."""


@dataclass(frozen=True)
class Signature:
    keyid: str
    sig: bytes


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


def encode(envelope: Envelope) -> bytes:
    """The one canonical serialisation of an envelope (compact JSON, sorted keys, newline)."""
    obj = {
        "payload": _b64(envelope.payload),
        "payloadType": envelope.payload_type,
        "signatures": [{"keyid": s.keyid, "sig": _b64(s.sig)} for s in envelope.signatures],
    }
    return (
        json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True) + "\n"
    ).encode("ascii")


def _unb64(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise Rejected(Reason.MALFORMED, f"signature envelope: {what} is not a string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise Rejected(Reason.MALFORMED, f"signature envelope: {what} is not base64") from None


def decode(data: bytes, cap: int = MAX_SIG_BYTES) -> Envelope:
    """Parse a sidecar: a DSSE envelope, exactly in the canonical form :func:`encode` writes.

    Raises:
        Rejected: ``too-large`` (over ``cap``), ``malformed`` (not JSON, not exactly the
            envelope's keys and types, not base64, not 1 to :data:`MAX_SIGNATURES` signatures,
            not in canonical form).
    """
    if len(data) > cap:
        raise Rejected(Reason.TOO_LARGE, f"signature is {len(data)} bytes, the cap is {cap}")
    obj = strictjson.loads(data, "signature envelope")
    if not isinstance(obj, dict) or set(obj) != {"payload", "payloadType", "signatures"}:
        raise Rejected(
            Reason.MALFORMED,
            "signature envelope must have exactly payload, payloadType, signatures",
        )
    payload_type = obj["payloadType"]
    if not isinstance(payload_type, str):
        raise Rejected(Reason.MALFORMED, "signature envelope: payloadType is not a string")
    payload = _unb64(obj["payload"], "payload")
    raw_sigs = obj["signatures"]
    if not isinstance(raw_sigs, list) or not 1 <= len(raw_sigs) <= MAX_SIGNATURES:
        raise Rejected(
            Reason.MALFORMED, f"signature envelope must hold 1 to {MAX_SIGNATURES} signatures"
        )
    signatures = []
    for raw in raw_sigs:
        if (
            not isinstance(raw, dict)
            or set(raw) != {"keyid", "sig"}
            or not isinstance(raw["keyid"], str)
        ):
            raise Rejected(
                Reason.MALFORMED, "signature envelope: each signature needs exactly keyid and sig"
            )
        signatures.append(Signature(raw["keyid"], _unb64(raw["sig"], "sig")))
    envelope = Envelope(payload_type, payload, tuple(signatures))
    if encode(envelope) != data:
        raise Rejected(Reason.MALFORMED, "signature envelope is not in canonical form (altered?)")
    return envelope
