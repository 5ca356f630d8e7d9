"""Signing and verifying a compile cache's manifest: its envelope, its keys, its seal.

Verification keeps :mod:`plancache.trust.verify`'s order: size cap, canonical DSSE envelope,
payloadType, signatures by distinct trusted keys, then (signed, so now parsed by
:func:`.manifest.parse_manifest`) the statement, subject, key windows, threshold, validity
window. Split from :mod:`.manifest` where trust enters: that module is the manifest as a value
(rules and bytes, what storage needs to write and walk a cache), this one is what makes a value
a :class:`VerifiedManifest`, the only proof that a cache's bytes may run. No IO here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from ..envelope import keyless_cap
from ..errors import ConfigError, Reason, Rejected
from ..keyring.identities import BundleSigner, IdentitySigner
from ..keyring.keys import Keyring, Signer
from ..keyring.signatories import DEFAULT_CLOCK_SKEW
from ..sealing import seal
from ..verify import SignedKind, open_signed
from .manifest import Manifest, check_manifest, parse_manifest

MAX_SIG_BYTES = 16 * 2**20
"""~130 bytes per file entry, base64 in the envelope: room for MAX_FILES entries."""
MAX_SIG_OBJECT_BYTES = keyless_cap(MAX_SIG_BYTES)
"""What a reader reads of a manifest's signature at most (keyless signatures' allowance)."""

MANIFEST_SIGNATURE = SignedKind(parse_manifest, lambda m: m.subject, "manifest is", MAX_SIG_BYTES)
"""A cache's sidecar: the manifest names the cache directory."""

_SEAL = object()


@dataclass(frozen=True)
class VerifiedManifest:
    """A manifest whose signature verified. Only :func:`verify_manifest` makes these."""

    manifest: Manifest
    sig_bytes: bytes
    signers: tuple[str, ...]
    _seal: object = None
    key_ids: tuple[str, ...] = ()
    """Key ids of the signers, in the order of ``signers`` (as a verified plan's)."""
    identities: tuple[IdentitySigner, ...] = ()
    """Keyless signers (identity, issuer, log index), among ``signers``."""

    def __post_init__(self) -> None:
        if self._seal is not _SEAL:
            raise TypeError(
                "VerifiedManifest is created by "
                "plancache.trust.compile_cache.manifest_signature only"
            )


def sign_manifest(manifest: Manifest, signer: Signer) -> bytes:
    """The sidecar bytes: a DSSE envelope over the manifest's statement, signed by ``signer``.

    Raises:
        Rejected: the manifest breaks :func:`check_manifest`'s rules (``malformed``,
            ``too-large``), or its signature would be over :data:`MAX_SIG_BYTES` (a bundle:
            over it and one keyless signature's allowance) (``too-large``).
        ConfigError: an expiry not after ``signed_at``, a time outside the calendar, or a
            remote key that refuses to sign (reason ``config-error``).
        StoreTimeout: a remote key did not answer within its budget (reason ``timeout``).
    """
    check_manifest(manifest)
    if manifest.expires_at is not None and manifest.expires_at <= manifest.signed_at:
        raise ConfigError("the expiry must lie in the future")
    payload = manifest.to_json_bytes()
    sig = seal(payload, signer)
    cap = keyless_cap(MAX_SIG_BYTES, 1) if isinstance(signer, BundleSigner) else MAX_SIG_BYTES
    if len(sig) > cap:
        raise Rejected(
            Reason.TOO_LARGE, f"the manifest signature would be {len(sig)} bytes, the cap is {cap}"
        )
    return sig


def verify_manifest(
    subject: str,
    sig_bytes: bytes | None,
    keyring: Keyring,
    now: datetime,
    *,
    clock_skew: timedelta = DEFAULT_CLOCK_SKEW,
) -> VerifiedManifest:
    """Verify the sidecar of cache directory ``subject``; the verified manifest or a typed error.

    Raises:
        Rejected: ``unsigned`` (no sidecar), then :func:`~..verify.open_signed`'s reasons in its
            order: the signatures' (``too-large``, ``malformed``, ``revoked``,
            ``bad-signature``, ``untrusted-key``, the keyless ones), :func:`parse_manifest`'s
            (``malformed``, ``too-large``), ``name-mismatch`` (the manifest of another cache
            directory), the signers' (``expired``, ``threshold-not-met``, ``not-yet-valid``).
    """
    if sig_bytes is None:
        raise Rejected(Reason.UNSIGNED, "no manifest signature beside the compile cache")
    opened = open_signed(
        sig_bytes, keyring, MANIFEST_SIGNATURE, subject, now=now, clock_skew=clock_skew
    )
    return VerifiedManifest(
        opened.statement, sig_bytes, opened.names, _SEAL, opened.key_ids, opened.identities
    )
