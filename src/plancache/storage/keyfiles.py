"""Key material on disk: trusted-keys files or directories, private keys, keygen output.

Private keys are refused when group or others can read them, as ssh refuses them: a key that
others could copy no longer proves who signed. Every read is capped.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..settings import PASSPHRASE_ENV
from ..trust.display import safe_text
from ..trust.errors import ConfigError, PlanCacheError
from ..trust.keys import Ed25519Signer, Keyring, Signer, openssh_line, parse_private_key, parse_trusted_keys, private_key_pem
from .files import read_capped, write_atomic

MAX_KEY_FILE_BYTES = 1 << 20


def _read(path: Path, what: str) -> bytes:
    try:
        data = read_capped(path, MAX_KEY_FILE_BYTES, follow_symlinks=True)
    except PlanCacheError as exc:
        raise ConfigError(f"{what} {path}: {exc.detail}") from None
    if data is None:
        raise ConfigError(f"{what} {path} does not exist")
    return data


def _text(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text file") from None


def load_keyring(path: Path, allow_revocations_only: bool = False) -> Keyring:
    """A trusted-keys file, or a directory whose ``*.pub`` files are all trusted.

    A keyring must trust at least one key, since verifying needs one: otherwise every plan
    would be rejected for a typo. ``allow_revocations_only`` is for callers that only ask
    "is this key revoked?" (``prune --revoked``), where a list of revocations is enough. A
    key listed in two files of a directory is a ``ConfigError``, as within one file: which
    window would hold is anyone's guess.
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.name.endswith(".pub"))
        if not files:
            raise ConfigError(f"trusted-keys directory {safe_text(path)} holds no .pub files")
        keyring = Keyring()
        listed_in: dict[str, Path] = {}
        for file in files:
            part = parse_trusted_keys(_text(_read(file, "trusted key"), file), str(file))
            for kid in part.keys:
                if kid in listed_in:
                    raise ConfigError(f"{safe_text(file)}: key {kid} is already listed in {safe_text(listed_in[kid])}")
                listed_in[kid] = file
            keyring = keyring.merged(part)
        what = f"trusted-keys directory {safe_text(path)}"
    else:
        keyring = parse_trusted_keys(_text(_read(path, "trusted-keys file"), path), str(path))
        what = f"trusted-keys file {safe_text(path)}"
    if not keyring.keys and not (allow_revocations_only and keyring.revoked):
        wanted = "no usable key (nor revocations)" if allow_revocations_only else "no usable key"
        raise ConfigError(f"{what} lists {wanted}")
    return keyring


def load_signer(ref: str, env: Mapping[str, str] = os.environ) -> Signer:
    """Resolve a key reference to a signer. Today a reference is a private key file path;
    a ``scheme://`` reference (a cloud KMS) would be dispatched here without format changes."""
    if "://" in ref:
        raise ConfigError(f"unsupported key reference {ref!r} (give a private key file)")
    path = Path(ref).expanduser()
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ConfigError(f"private key {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read private key {path}: {exc.strerror}") from None
    if stat.S_IMODE(mode) & 0o077:
        raise ConfigError(
            f"private key {path} is readable by others (mode {stat.S_IMODE(mode):04o}); run: chmod 600 {path}",
        )
    passphrase = env.get(PASSPHRASE_ENV)
    data = _read(path, "private key")
    try:
        private = parse_private_key(data, passphrase.encode() if passphrase else None)
    except PlanCacheError as exc:
        raise ConfigError(f"{path}: {exc.detail}") from None
    return Ed25519Signer(private)


def generate_keypair(path: Path, force: bool, comment: str, env: Mapping[str, str] = os.environ) -> Ed25519Signer:
    """Write a new private key (PEM PKCS#8, mode 0600) to ``path`` and its public line to ``path.pub``."""
    path = Path(path).expanduser()
    pub = path.with_name(path.name + ".pub")
    if not force:
        for existing in (path, pub):
            if os.path.lexists(existing):
                raise ConfigError(f"{existing} exists; use --force to overwrite")
    passphrase = env.get(PASSPHRASE_ENV)
    private = Ed25519PrivateKey.generate()
    write_atomic(path, private_key_pem(private, passphrase.encode() if passphrase else None), mode=0o600)
    write_atomic(pub, (openssh_line(private.public_key(), comment) + "\n").encode("ascii"), mode=0o644)
    return Ed25519Signer(private)
