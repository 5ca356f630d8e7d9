"""Putting a statement under a signature: a DSSE envelope for a key, a Sigstore bundle for a
keyless signer; and one more signature beside those a signature object holds. The one step
every signed kind shares (plans, plan sets, compile-cache manifests, their headers), so that a
new kind of signer changes one place.

A keyless signer (:class:`~plancache.trust.keyring.identities.BundleSigner`, made in
:mod:`plancache.keys.sigstore_signer`) signs the statement's exact bytes into a bundle whose
``dsseEnvelope`` has our payload type; either object is one line ending in a newline, as a
plan set's head must be. A bundle holds one signature, so a second signer (key or keyless)
makes an envelope: the bundle's signature moves in as a DSSE signature extension
(:mod:`plancache.trust.keyless.dsse_extension`), as does a keyless co-signer's, whose bundle
must be over the envelope's exact payload.
"""

from __future__ import annotations

import base64
import binascii

from . import envelope as dsse
from . import strictjson
from .envelope import is_bundle
from .errors import ConfigError, Reason, Rejected
from .keyring.identities import BundleSigner
from .keyring.keyformat import canonical_keyid
from .keyring.keys import Signer


def seal(payload: bytes, signer: Signer) -> bytes:
    """The signature object over ``payload``: one line, newline-terminated.

    Raises:
        ConfigError: the signer failed (a key, HSM or KMS; Fulcio or Rekor), or a bundle came
            back that is not one line.
    """
    if isinstance(signer, BundleSigner):
        bundle = signer.sign_statement(payload).rstrip(b"\n")
        if b"\n" in bundle:
            raise ConfigError("the Sigstore bundle is not one line of JSON")
        return bundle + b"\n"
    signature = dsse.Signature(signer.keyid, signer.sign(dsse.pae(dsse.PAYLOAD_TYPE, payload)))
    return dsse.encode(dsse.Envelope(dsse.PAYLOAD_TYPE, payload, (signature,)))


def claimed_payload(sig_bytes: bytes) -> bytes:
    """The payload a signature object *claims*, unverified (``ls`` without keys, ``prune``):
    never a reason to use anything it says.

    Raises:
        Rejected: neither a canonical envelope nor a bundle with a base64 payload (``malformed``).
    """
    if not is_bundle(sig_bytes):
        return dsse.decode(sig_bytes).payload
    obj = strictjson.loads(sig_bytes[: dsse.keyless_cap(dsse.MAX_SIG_BYTES, 1)], "Sigstore bundle")
    envelope = obj.get("dsseEnvelope") if isinstance(obj, dict) else None
    payload = envelope.get("payload") if isinstance(envelope, dict) else None
    if not isinstance(payload, str):
        raise Rejected(Reason.MALFORMED, "the Sigstore bundle carries no DSSE payload")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise Rejected(Reason.MALFORMED, "the bundle's DSSE payload is not base64") from None


def as_envelope(sig_bytes: bytes) -> dsse.Envelope:
    """A signature object as an envelope, unverified: an envelope as it is, a bundle as an
    envelope holding its one signature as an extension entry (which verifies exactly when the
    bundle does).

    Raises:
        Rejected: neither a canonical envelope nor a usable bundle (``malformed``,
            ``too-large``).
    """
    if not is_bundle(sig_bytes):
        return dsse.decode(sig_bytes)
    from .keyless.dsse_extension import as_extension  # keyless modules only for a bundle

    return as_extension(sig_bytes)


def signature_by(env: dsse.Envelope, signer: Signer) -> dsse.Signature:
    """``signer``'s signature over ``env``'s payload: a key's over the PAE; a keyless signer's
    bundle over the same payload bytes, as an extension entry.

    Raises:
        ConfigError: the signer failed (a key, HSM or KMS; Fulcio or Rekor), or its bundle is
            unusable or over other bytes than it was handed.
        StoreTimeout: a remote key did not answer within its budget (reason ``timeout``).
    """
    if not isinstance(signer, BundleSigner):
        data = dsse.pae(env.payload_type, env.payload)
        return dsse.Signature(signer.keyid, signer.sign(data))
    from .keyless.dsse_extension import as_extension  # keyless modules only for a bundle

    try:
        signed = as_extension(signer.sign_statement(env.payload))
    except Rejected as exc:
        raise ConfigError(f"the Sigstore bundle is unusable: {exc.detail}") from None
    if (signed.payload_type, signed.payload) != (env.payload_type, env.payload):
        raise ConfigError(
            "the keyless signer's bundle is over other bytes than it was handed: not merged"
        )
    return signed.signatures[0]


def cosign(env: dsse.Envelope, signer: Signer) -> bytes:
    """``env`` with ``signer``'s signature added, as an envelope: the caller decided that none
    of its own already verifies, so a key's entries under its id are dropped (never reported as
    done); every other entry stays as it is.

    Raises:
        Rejected: the envelope already holds the most signatures it may (``malformed``).
        ConfigError: as :func:`signature_by`.
        StoreTimeout: as :func:`signature_by`.
    """
    others = tuple(
        s for s in env.signatures if s.ext is not None or canonical_keyid(s.keyid) != signer.keyid
    )
    if len(others) >= dsse.MAX_SIGNATURES:
        raise Rejected(
            Reason.MALFORMED, f"a signature holds at most {dsse.MAX_SIGNATURES} signatures"
        )
    signature = signature_by(env, signer)
    return dsse.encode(dsse.Envelope(env.payload_type, env.payload, (*others, signature)))
