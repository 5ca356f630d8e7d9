"""Ed25519 keys: parsing, key ids, the trusted keyring, and the signer interface.

Key ids are OpenSSH's ``SHA256:…`` fingerprints, so ``ssh-keygen -lf key.pub`` prints the
same id that ``plancache verify`` shows: operators can check a key with a tool they trust.

Trusted-keys files are ``authorized_keys``-shaped, one key per line::

    # comment
    ssh-ed25519 AAAAC3Nz… ci-signer                          (a keygen .pub line as it is)
    name=ci-2026,valid-after=2026-01-01T00:00:00Z,valid-before=2027-01-01T00:00:00Z ssh-ed25519 AAAA…
    @revoked SHA256:3q2+7w…                                  (a key id, or)
    @revoked ssh-ed25519 AAAA… old-laptop                    (a whole key line)

A key's validity window is compared with the statement's ``signed_at``: signatures made
while a key was current stay valid after it is rotated out; ``@revoked`` voids them all.
Parsing here is pure; reading files lives in :mod:`plancache.storage.keyfiles`.
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

from .errors import ConfigError, PlanCacheError
from .statement import parse_time

SSH_KEY_TYPE = "ssh-ed25519"
MAX_KEYS = 1024


def _ssh_blob(public: Ed25519PublicKey) -> bytes:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    kind = SSH_KEY_TYPE.encode()
    return struct.pack(">I", len(kind)) + kind + struct.pack(">I", len(raw)) + raw


def key_id(public: Ed25519PublicKey) -> str:
    """OpenSSH's fingerprint of the key: ``SHA256:`` + unpadded base64 of sha256(wire blob)."""
    digest = hashlib.sha256(_ssh_blob(public)).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def openssh_line(public: Ed25519PublicKey, comment: str = "") -> str:
    """``ssh-ed25519 AAAA… comment``: the ``.pub`` format keygen writes."""
    line = f"{SSH_KEY_TYPE} {base64.b64encode(_ssh_blob(public)).decode('ascii')}"
    return f"{line} {comment}".rstrip()


def _bad_key(detail: str) -> ConfigError:
    return ConfigError(detail)


def parse_openssh_public(kind: str, blob_b64: str) -> Ed25519PublicKey:
    if kind != SSH_KEY_TYPE:
        raise _bad_key(f"only ssh-ed25519 keys are supported, got {kind!r}")
    try:
        blob = base64.b64decode(blob_b64, validate=True)
        key = serialization.load_ssh_public_key(f"{kind} {blob_b64}".encode("ascii"))
    except (binascii.Error, ValueError, UnsupportedAlgorithm):
        raise _bad_key("not a valid ssh-ed25519 public key") from None
    if not isinstance(key, Ed25519PublicKey) or _ssh_blob(key) != blob:
        raise _bad_key("not a valid ssh-ed25519 public key")
    return key


def parse_pem_public(data: bytes) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise _bad_key("not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise _bad_key("the PEM public key is not Ed25519")
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
            raise _bad_key("the private key is encrypted: set PLANCACHE_KEY_PASSPHRASE") from None
        raise _bad_key("the private key is not encrypted, but a passphrase was given") from None
    except (ValueError, UnsupportedAlgorithm):
        raise _bad_key("cannot load the private key (wrong passphrase, or not PEM PKCS#8 / OpenSSH)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise _bad_key("the private key is not Ed25519")
    return key


def private_key_pem(key: Ed25519PrivateKey, passphrase: bytes | None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption()
    )
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


class Signer(Protocol):
    """What signing needs: a key id and a way to sign bytes. A KMS signer fits the same shape."""

    @property
    def keyid(self) -> str: ...

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
        if self.threshold < 1:
            raise _bad_key("the signature threshold must be at least 1")

    def with_threshold(self, threshold: int) -> "Keyring":
        return Keyring(self.keys, self.revoked, threshold)

    def merged(self, other: "Keyring") -> "Keyring":
        revoked = self.revoked | other.revoked
        keys = {k: v for k, v in {**self.keys, **other.keys}.items() if k not in revoked}
        return Keyring(keys, revoked, max(self.threshold, other.threshold))


_OPTIONS = ("name", "valid-after", "valid-before")


def _parse_options(text: str, where: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or key not in _OPTIONS or key in options:
            raise _bad_key(f"{where}: unknown or repeated option {part!r} (use {', '.join(_OPTIONS)})")
        options[key] = value.strip('"')
    return options


def parse_trusted_keys(text: str, source: str) -> Keyring:
    """Parse a trusted-keys file (format in the module docstring, or one PEM public key)."""
    if text.lstrip().startswith("-----BEGIN PUBLIC KEY-----"):
        public = parse_pem_public(text.encode("ascii", "replace"))
        kid = key_id(public)
        return Keyring({kid: TrustedKey(kid, kid[:15], public)})
    keys: dict[str, TrustedKey] = {}
    revoked: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{number}"
        fields = line.split()
        if fields[0] == "@revoked":
            if len(fields) >= 3:
                revoked.add(key_id(parse_openssh_public(fields[1], fields[2])))
            elif len(fields) == 2 and fields[1].startswith("SHA256:"):
                revoked.add(fields[1])
            else:
                raise _bad_key(f"{where}: @revoked takes a key id (SHA256:…) or a key line")
            continue
        options: dict[str, str] = {}
        if "=" in fields[0]:
            options = _parse_options(fields[0], where)
            fields = fields[1:]
        if len(fields) < 2:
            raise _bad_key(f"{where}: expected 'ssh-ed25519 AAAA… [name]'")
        try:
            public = parse_openssh_public(fields[0], fields[1])
        except PlanCacheError as exc:
            raise _bad_key(f"{where}: {exc.detail}") from None
        kid = key_id(public)
        name = options.get("name") or " ".join(fields[2:]) or kid[:15]
        try:
            after = parse_time(options["valid-after"], "valid-after") if "valid-after" in options else None
            before = parse_time(options["valid-before"], "valid-before") if "valid-before" in options else None
        except PlanCacheError as exc:
            raise _bad_key(f"{where}: {exc.detail}") from None
        keys[kid] = TrustedKey(kid, name, public, after, before)
        if len(keys) > MAX_KEYS:
            raise _bad_key(f"{source}: more than {MAX_KEYS} keys")
    return Keyring({k: v for k, v in keys.items() if k not in revoked}, frozenset(revoked))
