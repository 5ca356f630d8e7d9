"""Ed25519 key encodings: OpenSSH fingerprints and lines, PEM, private keys, and naming what
a blob of key material is.

Key ids are OpenSSH's ``SHA256:…`` fingerprints, so ``ssh-keygen -lf key.pub`` prints the
same id that ``plancache verify`` shows: operators can check a key with a tool they trust.
The same id names a key wherever it lives (a file, an environment variable, an HSM, a cloud
KMS): it is computed from the public key alone.

Pure: bytes in, keys or :class:`ConfigError` out. Reading files lives in
:mod:`plancache.keys`.

cryptography's ``serialization`` package (its SSH module brings bcrypt and every cipher) is
imported only by what needs it (PEM, DER, private keys): a trusted-keys file of
``ssh-ed25519`` lines, read at every boot, is parsed by :func:`parse_openssh_public` through
``Ed25519PublicKey.from_public_bytes`` alone.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import hashlib
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.serialization import KeySerializationEncryption

from ..display import safe_text
from ..errors import ConfigError

SSH_KEY_TYPE = "ssh-ed25519"
KEYID_PREFIX = "SHA256:"
PEM_PUBLIC_BEGIN = "-----BEGIN PUBLIC KEY-----"
PEM_PUBLIC_END = "-----END PUBLIC KEY-----"
OPENSSH_PRIVATE_BEGIN = b"-----BEGIN OPENSSH PRIVATE KEY-----"

SSH_KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "ssh-rsa",
        "ssh-dss",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ssh-ed25519@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
    }
)
"""Key types OpenSSH writes in ``.pub``, ``authorized_keys`` and ``allowed_signers`` lines: a
line holding one of these is a public key line, even where only ssh-ed25519 is accepted."""

Passphrase = Callable[[], "bytes | None"]
"""Asked only when a private key is encrypted: an unencrypted key ignores a passphrase that is
set, and a terminal prompt appears only for a key that needs one."""


ED25519_KEY_BYTES = 32
_SSH_ED25519_HEAD = (
    struct.pack(">I", len(SSH_KEY_TYPE))
    + SSH_KEY_TYPE.encode()
    + struct.pack(">I", ED25519_KEY_BYTES)
)
"""An ssh-ed25519 key's SSH wire blob (RFC 8709) up to its 32 key bytes: the key type as an
SSH string, then the key's length."""


def _ssh_blob(public: Ed25519PublicKey) -> bytes:
    return _SSH_ED25519_HEAD + public.public_bytes_raw()


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
    """The key of an OpenSSH public key line's type and base64 fields.

    The blob must be exactly an ssh-ed25519 wire blob: the key type, 32 key bytes, nothing
    after them, in strict base64 (what cryptography's ``load_ssh_public_key`` accepts of this
    type, compared byte for byte with its canonical encoding, as before: the tests hold the
    two to the same verdict on every input they try).

    Raises:
        ConfigError: not ssh-ed25519, or not a valid key of that type (reason ``config-error``).
    """
    if kind != SSH_KEY_TYPE:
        raise ConfigError(f"only ssh-ed25519 keys are supported, got '{safe_text(kind, 40)}'")
    try:
        blob = base64.b64decode(blob_b64, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError("not a valid ssh-ed25519 public key") from None
    if len(blob) != len(_SSH_ED25519_HEAD) + ED25519_KEY_BYTES or not blob.startswith(
        _SSH_ED25519_HEAD
    ):
        raise ConfigError("not a valid ssh-ed25519 public key")
    try:
        key = Ed25519PublicKey.from_public_bytes(blob[len(_SSH_ED25519_HEAD) :])
    except ValueError:
        raise ConfigError("not a valid ssh-ed25519 public key") from None
    if _ssh_blob(key) != blob:
        raise ConfigError("not a valid ssh-ed25519 public key")
    return key


def parse_pem_public(data: bytes) -> Ed25519PublicKey:
    """A PEM SubjectPublicKeyInfo (``-----BEGIN PUBLIC KEY-----``), Ed25519 only.

    Raises:
        ConfigError: not a PEM public key, or not Ed25519 (reason ``config-error``).
    """
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise ConfigError("not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError("the PEM public key is not Ed25519")
    return key


def parse_der_public(data: bytes) -> Ed25519PublicKey:
    """A DER SubjectPublicKeyInfo, as AWS KMS's ``GetPublicKey`` returns it.

    Raises:
        ConfigError: not a DER public key, or not Ed25519 (reason ``config-error``).
    """
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_der_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise ConfigError("not a DER SubjectPublicKeyInfo public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(f"the public key is {type(key).__name__.removeprefix('_')}, not Ed25519")
    return key


def _load_private(data: bytes, password: bytes | None) -> object:
    from cryptography.hazmat.primitives import serialization

    if OPENSSH_PRIVATE_BEGIN in data:
        return serialization.load_ssh_private_key(data, password)
    return serialization.load_pem_private_key(data, password)


def parse_private_key(data: bytes, passphrase: Passphrase | None = None) -> Ed25519PrivateKey:
    """Load a PEM PKCS#8 or OpenSSH Ed25519 private key, encrypted or not.

    ``passphrase`` is called only if the key turns out to be encrypted (see :data:`Passphrase`).

    Raises:
        ConfigError: an encrypted key without a passphrase, a wrong passphrase, data that holds
            no private key (the detail says what it holds), a key that is not Ed25519 (reason
            ``config-error``).
    """
    try:
        key = _load_private(data, None)
    except TypeError:  # encrypted: cryptography wants a password
        password = passphrase() if passphrase is not None else None
        if not password:
            raise ConfigError(
                "the private key is encrypted: set PLANCACHE_KEY_PASSPHRASE"
            ) from None
        try:
            key = _load_private(data, password)
        except (ValueError, UnsupportedAlgorithm, TypeError):
            raise ConfigError("cannot decrypt the private key: wrong passphrase") from None
    except (ValueError, UnsupportedAlgorithm):
        raise ConfigError(f"cannot load a private key from {describe_key_material(data)}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"the private key is {type(key).__name__.removeprefix('_')}, not Ed25519")
    return key


def private_key_bytes(
    key: Ed25519PrivateKey, passphrase: bytes | None, openssh: bool = False
) -> bytes:
    """PEM PKCS#8 (the default), or OpenSSH's format, which ``ssh-keygen -y`` reads."""
    from cryptography.hazmat.primitives import serialization

    encryption: KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase)
        if passphrase
        else serialization.NoEncryption()
    )
    layout = serialization.PrivateFormat.OpenSSH if openssh else serialization.PrivateFormat.PKCS8
    return key.private_bytes(serialization.Encoding.PEM, layout, encryption)


_PEM_LABELS = {
    "OPENSSH PRIVATE KEY": "an OpenSSH private key",
    "PRIVATE KEY": "a PEM private key (PKCS#8)",
    "ENCRYPTED PRIVATE KEY": "an encrypted PEM private key (PKCS#8)",
    "RSA PRIVATE KEY": "an RSA private key",
    "EC PRIVATE KEY": "an EC private key",
    "DSA PRIVATE KEY": "a DSA private key",
    "PUBLIC KEY": "a PEM public key",
    "RSA PUBLIC KEY": "an RSA public key",
    "CERTIFICATE": "an X.509 certificate",
    "SSH2 PUBLIC KEY": "an RFC 4716 SSH public key",
}


def describe_key_material(data: bytes) -> str:
    """What ``data`` holds, in a few words, for errors that name a file and its content:
    "a public key where a private key belongs" is fixed in seconds, "cannot load" is not."""
    # UTF-8 (names and principals may be), and a character cut at 4096 bytes is no "binary"
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(data[:4096], final=False).strip()
    if not text:
        return "nothing (it is empty)"
    if "\x00" in text or "\ufffd" in text:
        return "binary data, not key text"
    first = text.split("\n", 1)[0].strip()
    if first.startswith(("-----BEGIN ", "---- BEGIN ")):
        label = first.strip("- ").removeprefix("BEGIN ").strip()
        return _PEM_LABELS.get(label, f"a PEM block '{safe_text(label, 40)}'")
    for line in text.split("\n"):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if any(f in SSH_KEY_TYPES or f.endswith("-cert-v01@openssh.com") for f in fields[:3]):
            return "an OpenSSH public key line (trusted keys)"
        if fields[0] == "@revoked":
            return "a trusted-keys file"
        break
    return "no key format plancache knows (PEM or OpenSSH)"


def is_public_material(data: bytes) -> bool:
    """Public keys or a trusted-keys file: what a private key reference must never name."""
    what = describe_key_material(data)
    return "public key" in what or what == "a trusted-keys file" or what == "an X.509 certificate"


def is_private_material(data: bytes) -> bool:
    return "private key" in describe_key_material(data)
