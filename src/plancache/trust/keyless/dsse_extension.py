"""Keyless signatures inside a DSSE envelope: DSSE v1.1 signature extensions of Sigstore's kind.

A Sigstore bundle v0.3 holds exactly one signature, so a threshold above 1 with keyless signers
needs them in one envelope, beside key signatures. DSSE v1.1 (envelope.md, "signature
extensions"; extensions.md) names the way: the signature entry carries
``{"kind": "application/vnd.dev.sigstore.verificationmaterial;version=0.3", "ext": <the
bundle's verificationMaterial>}`` beside its ``sig`` (:mod:`plancache.trust.envelope` reads and
writes it).

Nothing in an ``ext`` is trusted as it stands. :func:`open_entry` rebuilds the single-signature
bundle the entry came from (the envelope's payload and type, the entry's signature, the ``ext``
as the verification material) and verifies it with
:func:`~.sigstore_bundle.open_bundle`: sigstore-python's verifier and the identity policy, each
failure its own reason. The rebuilt bundle verifies exactly when the original did: the DSSE
signature covers the PAE, not the envelope's JSON; Rekor's ``dsse`` 0.0.1 entry is checked by
its payload hash and signature list (an envelope hash it cannot recompute is not compared), and
a ``hashedrekord`` 0.0.2 entry covers the PAE and the signature. So an ``ext`` moved under
another payload fails (``bad-signature``, ``bad-log-proof``), never passes.

The envelope's canonical form covers an ``ext`` only as JSON text, and sigstore-python reads it
leniently: base64 with characters outside the alphabet dropped, integers through ``int()``
(``"0139"`` is 139). So an ``ext`` must also be exactly what sigstore-python writes back for it,
or one keyless signature could be spelt as many envelopes that all verify, and a counted
signature's every byte would not matter as a key's does: :func:`~.sigstore_bundle.open_bundle`
holds a bare bundle's material to that rule, and so the entry verified as its bundle.
"""

from __future__ import annotations

import base64

from .. import envelope as dsse
from .. import strictjson
from ..errors import Reason, Rejected
from ..keyring.identities import IdentityPolicy, IdentitySigner
from .sigstore_bundle import BUNDLE_MEDIA_TYPES, open_bundle


def rebuilt_bundle(payload_type: str, payload: bytes, signature: dsse.Signature) -> bytes:
    """The single-signature Sigstore bundle v0.3 an extension entry came from."""
    bundle = {
        "dsseEnvelope": {
            "payload": base64.b64encode(payload).decode("ascii"),
            "payloadType": payload_type,
            "signatures": [{"keyid": "", "sig": base64.b64encode(signature.sig).decode("ascii")}],
        },
        "mediaType": BUNDLE_MEDIA_TYPES[0],
        "verificationMaterial": signature.ext,
    }
    return dsse.canonical_json(bundle).encode("ascii")


def open_entry(
    env: dsse.Envelope, signature: dsse.Signature, policy: IdentityPolicy
) -> list[IdentitySigner]:
    """The trusted identity whose keyless signature ``signature`` (an extension entry of
    ``env``) is, verified as the bundle it came from.

    Raises:
        Rejected: :func:`~.sigstore_bundle.open_bundle`'s reasons (``wrong-identity``,
            ``revoked``, ``bad-signature``, ``bad-log-proof``, ``no-log-proof``,
            ``foreign-trust-root``, ``bad-bundle``, ...); ``malformed`` for a key's entry.
    """
    if signature.ext is None:
        raise Rejected(Reason.MALFORMED, "not a keyless signature")
    rebuilt = rebuilt_bundle(env.payload_type, env.payload, signature)
    _, signers = open_bundle(rebuilt, policy, len(rebuilt))
    return signers


def as_extension(bundle: bytes, cap: int = dsse.MAX_SIG_BYTES) -> dsse.Envelope:
    """A bundle's one signature as an envelope holding it as an extension entry: what the bundle
    *claims*, unverified, for co-signing it (the entry verifies exactly when the bundle does)
    and for describing it. ``cap`` is the kind's (:func:`~..envelope.keyless_cap`).

    Raises:
        Rejected: not a Sigstore bundle v0.3 with a DSSE envelope of one signature, a base64
            payload and signature, and its verification material (``malformed``); over the
            caps (``too-large``).
    """
    if len(bundle) > dsse.keyless_cap(cap, 1):
        raise Rejected(
            Reason.TOO_LARGE,
            f"signature is {len(bundle)} bytes, the cap is {dsse.keyless_cap(cap, 1)}",
        )
    obj = strictjson.loads(bundle, "Sigstore bundle")
    if not isinstance(obj, dict) or obj.get("mediaType") not in BUNDLE_MEDIA_TYPES:
        raise Rejected(Reason.MALFORMED, "not a Sigstore bundle v0.3 (mediaType)")
    envelope, material = obj.get("dsseEnvelope"), obj.get("verificationMaterial")
    if not isinstance(envelope, dict) or not isinstance(material, dict):
        raise Rejected(Reason.MALFORMED, "the Sigstore bundle carries no DSSE envelope")
    signatures, payload_type = envelope.get("signatures"), envelope.get("payloadType")
    if (
        not isinstance(signatures, list)
        or len(signatures) != 1
        or not isinstance(payload_type, str)
    ):
        raise Rejected(Reason.MALFORMED, "a bundle's DSSE envelope holds exactly one signature")
    raw = signatures[0] if isinstance(signatures[0], dict) else {}
    # canonical, as open_bundle holds them: the entry verifies exactly when the bundle does
    signature = dsse.Signature(
        "", dsse.canonical_unb64(raw.get("sig"), "the Sigstore bundle's signature"), material
    )
    payload = dsse.canonical_unb64(envelope.get("payload"), "the Sigstore bundle's DSSE payload")
    # through the envelope's own rules (the ext's cap, the signature count)
    return dsse.decode(dsse.encode(dsse.Envelope(payload_type, payload, (signature,))), cap)
