"""Making and extending signatures: the producer side of :mod:`plancache.trust.verify`.

Signing refuses a plan that would not pass the strict parser: a signature is a promise that
the numbers are sane, so it is never put on bytes the verifier would reject anyway.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, Mapping

from . import envelope as dsse
from .errors import ConfigError, Reason, Rejected
from .keys import Signer
from .plan import parse_plan
from .statement import Statement, check_provenance, parse_statement


def sign_plan(
    name: str,
    plan_bytes: bytes,
    signer: Signer,
    now: datetime,
    expires_at: datetime | None = None,
    comment: str = "",
    provenance: Mapping[str, Any] | None = None,
) -> bytes:
    """Return the sidecar bytes: a DSSE envelope over a fresh statement for this exact plan."""
    plan = parse_plan(plan_bytes, name)
    if expires_at is not None and expires_at <= now:
        raise ConfigError("the expiry must lie in the future")
    statement = Statement(
        subject_name=name,
        subject_sha256=hashlib.sha256(plan_bytes).hexdigest(),
        fingerprint=plan.fingerprint,
        signed_at=now,
        expires_at=expires_at,
        comment=comment,
        provenance=check_provenance(provenance or {}),
    )
    payload = statement.to_json_bytes()
    signature = dsse.Signature(signer.keyid, signer.sign(dsse.pae(dsse.PAYLOAD_TYPE, payload)))
    return dsse.encode(dsse.Envelope(dsse.PAYLOAD_TYPE, payload, (signature,)))


def add_signature(name: str, plan_bytes: bytes, sig_bytes: bytes, signer: Signer) -> bytes:
    """Co-sign an existing sidecar (for thresholds above 1): same statement, one more signature.

    The co-signer checks for itself that the statement describes these exact plan bytes;
    it does not need to trust the first signer to endorse the same facts.
    """
    env = dsse.decode(sig_bytes)
    statement = parse_statement(env.payload)
    if statement.subject_name != name or statement.subject_sha256 != hashlib.sha256(plan_bytes).hexdigest():
        raise Rejected(Reason.DIGEST_MISMATCH, "the existing signature is not for these plan bytes")
    parse_plan(plan_bytes, name)
    if any(s.keyid == signer.keyid for s in env.signatures):
        return sig_bytes
    if len(env.signatures) >= dsse.MAX_SIGNATURES:
        raise Rejected(Reason.MALFORMED, f"a sidecar holds at most {dsse.MAX_SIGNATURES} signatures")
    signature = dsse.Signature(signer.keyid, signer.sign(dsse.pae(env.payload_type, env.payload)))
    return dsse.encode(dsse.Envelope(env.payload_type, env.payload, env.signatures + (signature,)))
