"""Ed25519 keys: parsing, key ids, the trusted keyring, and the signer interface.

Key ids are OpenSSH's ``SHA256:…`` fingerprints, so ``ssh-keygen -lf key.pub`` prints the
same id that ``plancache verify`` shows: operators can check a key with a tool they trust.

Trusted-keys files are ``authorized_keys``-shaped, one key per line::

    # comment
    ssh-ed25519 AAAAC3Nz… ci-signer                          (a keygen .pub line as it is)
    name=ci-2026,valid-after=2026-01-01T00:00:00Z,valid-before=2027-01-01T00:00:00Z ssh-ed25519 AAAA…
    @revoked SHA256:3q2+7w… [comment]                        (a key id, with or without '=', or)
    @revoked ssh-ed25519 AAAA… old-laptop                    (a whole key line)
    -----BEGIN PUBLIC KEY-----                               (PEM public keys, anywhere)
    …
    -----END PUBLIC KEY-----

A key's validity window works as in OpenSSH's ``allowed_signers``: a signature counts only
while the *verifier's* clock is inside the window, and only if the statement's ``signed_at``
(written by the signer) is inside it too. After ``valid-before`` a key vouches for nothing,
so a retired key cannot sign a backdated plan; rotation is co-signing with the new key, then
retiring the old one. ``@revoked`` voids everything a key signed.

Every line must parse: a line that does not, a key listed twice, or a window that holds no
moment is a :class:`ConfigError` naming ``file:line``, never a line quietly skipped. Key ids
are compared in one normal form (:func:`canonical_keyid`). Parsing here is pure; reading
files lives in :mod:`plancache.storage.keyfiles`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from dataclasses import dataclass, field
from datetime import datetime
from typing import Mapping, Protocol

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .display import safe_text
from .errors import ConfigError, PlanCacheError
from .statement import parse_time

SSH_KEY_TYPE = "ssh-ed25519"
MAX_KEYS = 1024
KEYID_PREFIX = "SHA256:"
_PEM_BEGIN = "-----BEGIN PUBLIC KEY-----"
_PEM_END = "-----END PUBLIC KEY-----"


def _ssh_blob(public: Ed25519PublicKey) -> bytes:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    kind = SSH_KEY_TYPE.encode()
    return struct.pack(">I", len(kind)) + kind + struct.pack(">I", len(raw)) + raw


def key_id(public: Ed25519PublicKey) -> str:
    """OpenSSH's fingerprint of the key: ``SHA256:`` + unpadded base64 of sha256(wire blob)."""
    digest = hashlib.sha256(_ssh_blob(public)).digest()
    return KEYID_PREFIX + base64.b64encode(digest).decode("ascii").rstrip("=")


def canonical_keyid(value: object) -> str | None:
    """The normal form of a key id (what :func:`key_id` returns), or None if it is not one.

    Tools print SHA256 fingerprints with or without base64's ``=`` padding; both name the
    same key and must compare equal, or a padded ``@revoked`` line revokes nothing. Only the
    canonical 43-character encoding is accepted, so no two spellings that differ in more than
    the padding name one key (a flipped unused bit is not an alias).
    """
    if not isinstance(value, str) or not value.startswith(KEYID_PREFIX):
        return None
    body = value[len(KEYID_PREFIX) :]
    body = body[:-1] if body.endswith("=") else body
    if len(body) != 43:
        return None
    try:
        digest = base64.b64decode(body + "=", validate=True)
    except (binascii.Error, ValueError):
        return None
    normal = KEYID_PREFIX + base64.b64encode(digest).decode("ascii").rstrip("=")
    return normal if normal == KEYID_PREFIX + body else None


def openssh_line(public: Ed25519PublicKey, comment: str = "") -> str:
    """``ssh-ed25519 AAAA… comment``: the ``.pub`` format keygen writes."""
    line = f"{SSH_KEY_TYPE} {base64.b64encode(_ssh_blob(public)).decode('ascii')}"
    return f"{line} {comment}".rstrip()


def parse_openssh_public(kind: str, blob_b64: str) -> Ed25519PublicKey:
    if kind != SSH_KEY_TYPE:
        raise ConfigError(f"only ssh-ed25519 keys are supported, got '{safe_text(kind, 40)}'")
    try:
        blob = base64.b64decode(blob_b64, validate=True)
        key = serialization.load_ssh_public_key(f"{kind} {blob_b64}".encode("ascii"))
    except (binascii.Error, ValueError, UnsupportedAlgorithm):
        raise ConfigError("not a valid ssh-ed25519 public key") from None
    if not isinstance(key, Ed25519PublicKey) or _ssh_blob(key) != blob:
        raise ConfigError("not a valid ssh-ed25519 public key")
    return key


def parse_pem_public(data: bytes) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise ConfigError("not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError("the PEM public key is not Ed25519")
    return key


def parse_private_key(data: bytes, passphrase: bytes | None) -> Ed25519PrivateKey:
    """Load a PEM PKCS#8 or OpenSSH Ed25519 private key (encrypted ones need ``passphrase``)."""
    try:
        if b"-----BEGIN OPENSSH PRIVATE KEY-----" in data:
            key = serialization.load_ssh_private_key(data, passphrase)
        else:
            key = serialization.load_pem_private_key(data, passphrase)
    except TypeError:
        if passphrase is None:
            raise ConfigError("the private key is encrypted: set PLANCACHE_KEY_PASSPHRASE") from None
        raise ConfigError("the private key is not encrypted, but a passphrase was given") from None
    except (ValueError, UnsupportedAlgorithm):
        raise ConfigError("cannot load the private key (wrong passphrase, or not PEM PKCS#8 / OpenSSH)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError("the private key is not Ed25519")
    return key


def private_key_pem(key: Ed25519PrivateKey, passphrase: bytes | None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption()
    )
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


class Signer(Protocol):
    """What signing needs: a key id, the public key, and a way to sign bytes.

    The public key is needed because signing checks its own result: a sidecar is only
    written after it verifies. A KMS signer fits the same shape.
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
        raw = self.public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return (_trusted_key_from_raw, (self.keyid, self.name, raw, self.valid_after, self.valid_before))

    def window_covers(self, moment: datetime) -> bool:
        """Whether ``moment`` lies in ``[valid_after, valid_before)``: comparisons only, so
        dates at the ends of the calendar (year 1, year 9999) cannot overflow."""
        return (self.valid_after is None or moment >= self.valid_after) and (
            self.valid_before is None or moment < self.valid_before
        )


def _trusted_key_from_raw(
    keyid: str, name: str, raw: bytes, after: datetime | None, before: datetime | None
) -> TrustedKey:
    public = Ed25519PublicKey.from_public_bytes(raw)
    if key_id(public) != keyid:
        raise ValueError("key id does not match the key")
    return TrustedKey(keyid, name, public, after, before)


@dataclass(frozen=True)
class Keyring:
    """The trusted keys by id, the revoked key ids, and how many distinct keys must sign."""

    keys: Mapping[str, TrustedKey] = field(default_factory=dict)
    revoked: frozenset[str] = frozenset()
    threshold: int = 1

    def __post_init__(self) -> None:
        """Key ids are stored in normal form only, so a lookup is one dict access."""
        if self.threshold < 1:
            raise ConfigError("the signature threshold must be at least 1")
        for kid, key in self.keys.items():
            if canonical_keyid(kid) != kid or key.keyid != kid:
                raise ConfigError(f"keyring entry {safe_text(kid, 60)} is not the normal key id of its key")
        for kid in self.revoked:
            if canonical_keyid(kid) != kid:
                raise ConfigError(f"revoked id {safe_text(kid, 60)} is not a key id in normal form")

    def with_threshold(self, threshold: int) -> "Keyring":
        return Keyring(self.keys, self.revoked, threshold)

    def merged(self, other: "Keyring") -> "Keyring":
        revoked = self.revoked | other.revoked
        keys = {k: v for k, v in {**self.keys, **other.keys}.items() if k not in revoked}
        return Keyring(keys, revoked, max(self.threshold, other.threshold))


def signer_keyring(signer: Signer) -> Keyring:
    """A keyring trusting only ``signer``: "does this sidecar carry my valid signature?"."""
    public = signer.public
    if key_id(public) != signer.keyid:
        raise ConfigError(f"the signer's key id {safe_text(signer.keyid, 60)} does not match its public key")
    return Keyring({signer.keyid: TrustedKey(signer.keyid, "self", public)})


_OPTIONS = ("name", "valid-after", "valid-before")


def _parse_options(text: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or key not in _OPTIONS or key in options:
            raise ConfigError(f"unknown or repeated option '{safe_text(part, 40)}' (use {', '.join(_OPTIONS)})")
        options[key] = value.strip('"')
    return options


def _revoked_id(fields: list[str]) -> str:
    """``@revoked SHA256:… [comment]`` or ``@revoked ssh-ed25519 AAAA… [comment]``."""
    if len(fields) >= 2 and fields[1].startswith(KEYID_PREFIX):
        kid = canonical_keyid(fields[1])
        if kid is None:
            raise ConfigError(f"'{safe_text(fields[1], 60)}' is not a key id (SHA256: and 43 base64 characters)")
        return kid
    if len(fields) >= 3:
        return key_id(parse_openssh_public(fields[1], fields[2]))
    raise ConfigError("@revoked takes a key id (SHA256:…) or a key line")


def _key_line(fields: list[str]) -> TrustedKey:
    """``[options] ssh-ed25519 AAAA… [name]``; a window must hold at least one moment."""
    options = _parse_options(fields[0]) if "=" in fields[0] else {}
    fields = fields[1:] if options else fields
    if len(fields) < 2:
        raise ConfigError("expected 'ssh-ed25519 AAAA… [name]'")
    public = parse_openssh_public(fields[0], fields[1])
    kid = key_id(public)
    name = options.get("name") or " ".join(fields[2:]) or kid[:15]
    after = parse_time(options["valid-after"], "valid-after") if "valid-after" in options else None
    before = parse_time(options["valid-before"], "valid-before") if "valid-before" in options else None
    if after is not None and before is not None and after >= before:
        raise ConfigError("valid-after is not before valid-before: the key would never count")
    return TrustedKey(kid, name, public, after, before)


def _pem_key(lines: list[str], start: int) -> tuple[TrustedKey, int]:
    """The PEM block opening at ``lines[start]``; returns the key and the index of its END line."""
    for end in range(start + 1, len(lines)):
        if lines[end].strip() == _PEM_END:
            block = "\n".join(line.strip() for line in lines[start : end + 1]) + "\n"
            public = parse_pem_public(block.encode("ascii", "replace"))
            kid = key_id(public)
            return TrustedKey(kid, kid[:15], public), end
    raise ConfigError(f"{_PEM_BEGIN} without {_PEM_END}")


def _entry(lines: list[str], index: int) -> tuple[TrustedKey | str | None, int]:
    """The entry at ``lines[index]``: a key, a revoked id, or None; and the last line it used."""
    line = lines[index].strip()
    if not line or line.startswith("#"):
        return None, index
    if line == _PEM_BEGIN:
        return _pem_key(lines, index)
    if line.startswith("-----BEGIN "):
        raise ConfigError(f"'{safe_text(line, 60)}' is not a public key (a private key does not belong here)")
    fields = line.split()
    if fields[0] == "@revoked":
        return _revoked_id(fields), index
    return _key_line(fields), index


def parse_trusted_keys(text: str, source: str) -> Keyring:
    """Parse a trusted-keys file (format in the module docstring). Every line counts.

    The keyring may hold revocations only; whether that is enough is the caller's decision
    (verifying needs a key, pruning revoked plans does not).
    """
    source = safe_text(source, 120)
    lines = text.split("\n")  # as editors number lines: not at \x85 or U+2028 inside a name
    keys: dict[str, TrustedKey] = {}
    listed_at: dict[str, int] = {}
    revoked: set[str] = set()
    index = 0
    while index < len(lines):
        where = f"{source}:{index + 1}"
        try:
            entry, last = _entry(lines, index)
        except PlanCacheError as exc:
            raise ConfigError(f"{where}: {exc.detail.removeprefix('statement: ')}") from None
        if isinstance(entry, str):
            revoked.add(entry)
        elif entry is not None:
            if entry.keyid in keys:
                raise ConfigError(f"{where}: key {entry.keyid} is already listed at line {listed_at[entry.keyid]}")
            keys[entry.keyid] = entry
            listed_at[entry.keyid] = index + 1
            if len(keys) > MAX_KEYS:
                raise ConfigError(f"{source}: more than {MAX_KEYS} keys")
        index = last + 1
    return Keyring({k: v for k, v in keys.items() if k not in revoked}, frozenset(revoked))
