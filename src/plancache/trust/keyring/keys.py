"""The trusted keyring and the signer interface: what the verifier and the signer hold.

A :class:`Keyring` is the trusted keys by id, the revoked ids and the threshold; a
:class:`TrustedKey` carries a validity window that works as in OpenSSH's ``allowed_signers``: a
signature counts only while the *verifier's* clock is inside the window, and only if the
statement's ``signed_at`` (written by the signer) is inside it too. After ``valid-before`` a key
vouches for nothing, so a retired key cannot sign a backdated plan; rotation is co-signing with
the new key, then retiring the old one. ``@revoked`` voids everything a key signed. Key ids are
compared in one normal form (:func:`~.keyformat.canonical_keyid`). Keyless signers (Sigstore
identities) are :mod:`.identities`'s, held here as :attr:`Keyring.identities`.

Reading a trusted-keys file into a keyring is :mod:`.trusted_keys_file`'s (the text format);
key encodings are :mod:`.keyformat`'s. Pure: reading files lives in :mod:`plancache.keys`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..display import safe_text
from ..errors import ConfigError
from .identities import BundleSigner, IdentityPolicy
from .identity_match import CertifiedIdentity
from .keyformat import canonical_keyid, key_id


class Signer(Protocol):
    """What signing needs: a key id, the public key, and a way to sign bytes.

    The public key is needed because signing checks its own result: a sidecar is only
    written after it verifies. Key files, environment variables, HSMs (PKCS#11) and cloud
    KMS keys all fit this shape (:mod:`plancache.keys`); ``sign`` may raise
    :class:`ConfigError` or ``StoreTimeout`` when a remote key cannot be reached.
    """

    @property
    def keyid(self) -> str: ...

    @property
    def public(self) -> Ed25519PublicKey: ...

    def sign(self, data: bytes) -> bytes: ...


@dataclass(frozen=True)
class Ed25519Signer:
    private: Ed25519PrivateKey

    @property
    def keyid(self) -> str:
        return key_id(self.private.public_key())

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    def sign(self, data: bytes) -> bytes:
        return self.private.sign(data)


@dataclass(frozen=True)
class TrustedKey:
    keyid: str
    name: str
    public: Ed25519PublicKey
    valid_after: datetime | None = None
    valid_before: datetime | None = None

    def verifies(self, signature: bytes, data: bytes) -> bool:
        try:
            self.public.verify(signature, data)
            return True
        except InvalidSignature:
            return False

    def __reduce__(self) -> tuple[object, ...]:
        # cryptography's key objects do not pickle; a process pool verifying in parallel needs
        # to ship the keyring to its workers, so travel as raw public bytes.
        raw = self.public.public_bytes_raw()
        return (
            _trusted_key_from_raw,
            (self.keyid, self.name, raw, self.valid_after, self.valid_before),
        )

    def window_covers(self, moment: datetime) -> bool:
        """Whether ``moment`` lies in ``[valid_after, valid_before)``: comparisons only, so
        dates at the ends of the calendar (year 1, year 9999) cannot overflow."""
        return (self.valid_after is None or moment >= self.valid_after) and (
            self.valid_before is None or moment < self.valid_before
        )


def _trusted_key_from_raw(  # positional: pickle calls it with __reduce__'s tuple
    keyid: str, name: str, raw: bytes, after: datetime | None, before: datetime | None
) -> TrustedKey:
    public = Ed25519PublicKey.from_public_bytes(raw)
    if key_id(public) != keyid:
        raise ValueError("key id does not match the key")
    return TrustedKey(keyid, name, public, after, before)


@dataclass(frozen=True)
class Keyring:
    """The trusted keys by id, the revoked key ids, and how many distinct keys must sign.

    Raises:
        ConfigError: on construction, a threshold below 1, or a key or revoked id not in normal
            form (:func:`~.keyformat.canonical_keyid`) or not its key's (reason
            ``config-error``).
    """

    keys: Mapping[str, TrustedKey] = field(default_factory=dict)
    revoked: frozenset[str] = frozenset()
    threshold: int = 1
    identities: IdentityPolicy | None = None
    """Trusted Sigstore identities and their trust root (None: keys only, as before them)."""

    def __post_init__(self) -> None:
        """Key ids are stored in normal form only, so a lookup is one dict access."""
        if self.threshold < 1:
            raise ConfigError("the signature threshold must be at least 1")
        for kid, key in self.keys.items():
            if canonical_keyid(kid) != kid or key.keyid != kid:
                raise ConfigError(
                    f"keyring entry {safe_text(kid, 60)} is not the normal key id of its key"
                )
        for kid in self.revoked:
            if canonical_keyid(kid) != kid:
                raise ConfigError(f"revoked id {safe_text(kid, 60)} is not a key id in normal form")

    def with_threshold(self, threshold: int) -> Keyring:
        return Keyring(self.keys, self.revoked, threshold, self.identities)

    def revokes(self, signer: Signer) -> bool:
        """Whether this keyring revokes ``signer``: its key id, or for a keyless signer the
        identity its certificate names (read from the certificate, as the verifier will).

        Raises:
            ConfigError: a keyless signer could get no certificate.
        """
        if not isinstance(signer, BundleSigner):
            return signer.keyid in self.revoked
        policy = self.identities
        if policy is None or not policy.revoked:
            return False  # nothing to compare: no certificate asked for
        mine = signer.own_keyring().identities
        return mine is not None and any(
            policy.revoking(CertifiedIdentity(line.issuer, (line.identity,), line.source))
            for line in mine.trusted
        )

    def merged(self, other: Keyring) -> Keyring:
        revoked = self.revoked | other.revoked
        keys = {k: v for k, v in {**self.keys, **other.keys}.items() if k not in revoked}
        ids = other.identities if self.identities is None else self.identities.merged(other)
        return Keyring(keys, revoked, max(self.threshold, other.threshold), ids)


def signer_keyring(signer: Signer) -> Keyring:
    """A keyring trusting only ``signer``: "does this sidecar carry my valid signature?".

    Raises:
        ConfigError: the signer's key id is not its public key's (reason ``config-error``).
    """
    if isinstance(signer, BundleSigner):  # keyless: its identity under its instance's root
        return signer.own_keyring()
    public = signer.public
    if key_id(public) != signer.keyid:
        raise ConfigError(
            f"the signer's key id {safe_text(signer.keyid, 60)} does not match its public key"
        )
    return Keyring({signer.keyid: TrustedKey(signer.keyid, "self", public)})
