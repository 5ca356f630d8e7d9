"""Putting a statement under a signature: a DSSE envelope for a key, a Sigstore bundle for a
keyless signer. The one step every signed kind shares (plans, plan sets, compile-cache
manifests, their headers), so that a new kind of signer changes one place.

A keyless signer (:class:`~plancache.trust.keyring.identities.BundleSigner`, made in
:mod:`plancache.keys.sigstore_signer`) signs the statement's exact bytes into a bundle whose
``dsseEnvelope`` has our payload type; either object is one line ending in a newline, as a
plan set's head must be.
"""

from __future__ import annotations

import base64
import binascii

from . import envelope as dsse
from . import strictjson
from .errors import ConfigError, Reason, Rejected
from .keyless.sigstore_bundle import is_bundle
from .keyring.identities import BundleSigner
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


def refuse_cosign(sig_bytes: bytes, signer: Signer) -> None:
    """A bundle holds exactly one signature: neither adding a key's signature to one nor a
    keyless signature to an envelope can be done in place.

    Raises:
        Rejected: ``sig_bytes`` is a bundle, or ``signer`` is keyless (``statement-mismatch``).
    """
    if is_bundle(sig_bytes) or isinstance(signer, BundleSigner):
        raise Rejected(
            Reason.STATEMENT_MISMATCH,
            "a Sigstore bundle holds exactly one signature: it cannot be co-signed in place "
            "(--replace signs anew)",
        )
