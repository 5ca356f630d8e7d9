"""Key files: trusted-keys files or directories, private key files (the ``PATH`` kind of key
reference, :mod:`.schemes`), keygen output.

Private key files are refused when group or others can read them, as ssh refuses them: a
key that others could copy no longer proves who signed. A passphrase comes from
``PLANCACHE_KEY_PASSPHRASE``, else from the caller's ``prompt`` (the CLI on a terminal), and
is asked only for an encrypted key. Every read is capped; errors name the file and say what
it holds (a public key where a private one belongs, a private key among trusted keys).
:mod:`.env` reads the same private key text from an environment variable.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..settings import PASSPHRASE_ENV
from ..storage.local.files import read_capped, write_atomic
from ..trust.display import safe_text
from ..trust.errors import ConfigError, PlanCacheError
from ..trust.keyring.keyformat import (
    Passphrase,
    describe_key_material,
    is_private_material,
    is_public_material,
    openssh_line,
    parse_private_key,
    private_key_bytes,
)
from ..trust.keyring.keys import Ed25519Signer, Keyring
from ..trust.keyring.trusted_keys_file import check_key_name, parse_trusted_keys

MAX_KEY_FILE_BYTES = 1 << 20

Prompt = Callable[[str], str]
"""Asks a person for a passphrase (``getpass.getpass``); None where nobody can answer."""


def read_key_file(path: Path, what: str) -> bytes:
    """A key file's bytes, capped (symlinks followed: keys are often linked into place).

    Raises:
        ConfigError: the file is absent, unreadable or over the cap; the detail names ``what``
            and the file (reason ``config-error``).
    """
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


def _public_text(data: bytes, path: Path) -> str:
    """A trusted-keys file's text, refused whole when it holds a private key or no text."""
    if is_private_material(data):
        raise ConfigError(
            f"trusted-keys file {safe_text(path)} holds {describe_key_material(data)}: trusted "
            f"keys are public keys (plancache pubkey {safe_text(path)} prints its public line; "
            "treat the private key as exposed)"
        )
    if describe_key_material(data) == "binary data, not key text":
        raise ConfigError(f"trusted-keys file {safe_text(path)} holds binary data, not key text")
    return _text(data, path)


@functools.lru_cache(maxsize=16)
def _parsed(data: bytes, path: Path) -> Keyring:
    """A trusted-keys file's bytes checked (:func:`_public_text`) and parsed
    (:func:`~plancache.trust.keyring.trusted_keys_file.parse_trusted_keys`), remembered for
    these exact bytes and name: a vLLM worker reads its trusted keys at every boot (the file is
    read each time, so an edit counts at once), and checking and parsing its keys again was
    ~0.3 ms of a local hit's critical path. Only what the same bytes parse to is reused, never a
    verdict; bytes that are refused or do not parse raise every time (exceptions are not
    cached). The keyring is frozen, its keys are public and immutable, and a forked worker's
    copy stays right."""
    return parse_trusted_keys(_public_text(data, path), str(path))


def load_keyring(
    path: Path, allow_revocations_only: bool = False, *, pin_root: bool = True
) -> Keyring:
    """A trusted-keys file, or a directory whose ``*.pub`` files are all trusted.

    A keyring must trust at least one key or identity, since verifying needs one: otherwise
    every plan would be rejected for a typo. ``allow_revocations_only`` is for callers that only
    ask "is this signer revoked?" (``prune --revoked``), where a list of revocations (``@revoked``
    key ids, ``@revoked sigstore`` identities, or both) is enough; revoked identities then get
    the Sigstore trust root pinned all the same (:mod:`.sigstore_root`), because a bundle is
    judged revoked only once it verifies. A key listed in two files of a directory is an error,
    as within one file: which window would hold is anyone's guess. ``pin_root=False`` leaves the
    root unpinned (``doctor`` reads the file's identities even when the root is unusable, to
    report the root on its own line).

    Raises:
        ConfigError: a file absent or unreadable, a directory without ``.pub`` files, a file
            holding a private key or binary data, a line that does not parse
            (:func:`~plancache.trust.keyring.trusted_keys_file.parse_trusted_keys`), a key
            listed in two files, a sigstore revocation in one file spelled like a trusted
            line of another that it can never match, no usable key (reason ``config-error``).
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.name.endswith(".pub"))
        if not files:
            raise ConfigError(f"trusted-keys directory {safe_text(path)} holds no .pub files")
        keyring = Keyring()
        listed_in: dict[str, Path] = {}
        for file in files:
            part = _parsed(read_key_file(file, "trusted key"), file)
            for kid in part.keys:
                if kid in listed_in:
                    raise ConfigError(
                        f"{safe_text(file)}: key {kid} is already listed in "
                        f"{safe_text(listed_in[kid])}"
                    )
                listed_in[kid] = file
            keyring = keyring.merged(part)
        what = f"trusted-keys directory {safe_text(path)}"
        if keyring.identities is not None:  # each file was checked alone: now across files
            try:
                keyring.identities.check_revocations()
            except ConfigError as exc:
                raise ConfigError(f"{what}: {exc.detail}") from None
    else:
        keyring = _parsed(read_key_file(path, "trusted-keys file"), path)
        what = f"trusted-keys file {safe_text(path)}"
    ids = keyring.identities
    revoked_ids = ids is not None and bool(ids.revoked)
    if pin_root and ids is not None and (ids.trusted or (allow_revocations_only and revoked_ids)):
        from .sigstore_root import pin_trusted_root

        # A revoked identity is judged on a bundle that verified (sigstore_bundle.open_bundle),
        # which takes the root even where no identity is trusted.
        return pin_trusted_root(keyring)
    if ids is not None and ids.trusted:
        return keyring  # unpinned, as asked
    if not keyring.keys and not (allow_revocations_only and (keyring.revoked or revoked_ids)):
        wanted = "no usable key (nor revocations)" if allow_revocations_only else "no usable key"
        raise ConfigError(f"{what} lists {wanted}")
    return keyring


def _passphrase(env: Mapping[str, str], prompt: Prompt | None, what: str) -> Passphrase:
    def ask() -> bytes | None:
        value = env.get(PASSPHRASE_ENV)
        if value:
            return value.encode()
        if prompt is None:
            return None
        return prompt(f"passphrase for {what}: ").encode() or None

    return ask


def private_key_signer(
    data: bytes, what: str, env: Mapping[str, str], prompt: Prompt | None
) -> Ed25519Signer:
    """A signer from private key text (a file's or :mod:`.env`'s).

    Raises:
        ConfigError: the text holds a public key (the detail says which half a signing key
            reference names), no private key, an encrypted key without its passphrase, or a key
            that is not Ed25519 (reason ``config-error``).
    """
    if is_public_material(data):
        raise ConfigError(
            f"{what} holds {describe_key_material(data)}, not a private key: a signing key "
            "reference names the private key (keygen's PATH, not PATH.pub)"
        )
    try:
        return Ed25519Signer(parse_private_key(data, _passphrase(env, prompt, what)))
    except PlanCacheError as exc:
        raise ConfigError(f"{what}: {exc.detail}") from None


def file_signer(path: Path, env: Mapping[str, str], prompt: Prompt | None) -> Ed25519Signer:
    """The ``PATH`` kind of key reference: refused when group or others can read it.

    Raises:
        ConfigError: the file is absent or unreadable, group or others can read it, or
            :func:`private_key_signer` refuses its text (reason ``config-error``).
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ConfigError(f"private key {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read private key {path}: {exc.strerror}") from None
    data = read_key_file(path, "private key")
    if not is_public_material(data) and stat.S_IMODE(mode) & 0o077:
        raise ConfigError(
            f"private key {path} is readable by others (mode {stat.S_IMODE(mode):04o}); "
            f"run: chmod 600 {path}",
        )
    return private_key_signer(data, str(path), env, prompt)


def generate_keypair(
    path: Path,
    force: bool,
    comment: str,
    *,
    env: Mapping[str, str] = os.environ,
    openssh: bool = False,
) -> Ed25519Signer:
    """Write a new private key (mode 0600) to ``path`` and its public line to ``path.pub``.

    PEM PKCS#8 by default; ``openssh`` writes OpenSSH's format instead, for teams whose
    tooling (``ssh-keygen -y``, ``ssh-keygen -Y sign``) expects it. Either is encrypted when
    ``PLANCACHE_KEY_PASSPHRASE`` is set.

    Raises:
        ConfigError: without ``force``, a file that exists; a comment that is not one printable
            line or is spelled like the revocation marker (reason ``config-error``).
        StoreError: a file cannot be written (reason ``store-error``; the private key is
            removed when its public line cannot be written).
    """
    path = Path(path).expanduser()
    pub = path.with_name(path.name + ".pub")
    if not force:
        for existing in (path, pub):
            if os.path.lexists(existing):
                raise ConfigError(f"{safe_text(existing)} exists; use --force to overwrite")
    passphrase = env.get(PASSPHRASE_ENV)
    private = Ed25519PrivateKey.generate()
    # Both files' bytes first: a comment that cannot be written fails before anything is.
    public_line = (
        openssh_line(private.public_key(), check_key_name(comment, "the comment")) + "\n"
    ).encode("utf-8")
    write_atomic(
        path,
        private_key_bytes(private, passphrase.encode() if passphrase else None, openssh),
        mode=0o600,
    )
    try:
        write_atomic(pub, public_line, mode=0o644)
    except BaseException:  # never a private key without its public line (a rerun would refuse)
        path.unlink(missing_ok=True)
        raise
    return Ed25519Signer(private)
