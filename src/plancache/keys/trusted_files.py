"""Reading trusted-keys files and directories: capped reads, refused whole when they hold a
private key or no text; the parsing itself is the trust core's (:func:`plancache.trust.keys.parse_trusted_keys`)."""

from __future__ import annotations

from pathlib import Path

from ..trust.display import safe_text
from ..trust.errors import ConfigError
from ..trust.keyformat import describe_key_material, is_private_material
from ..trust.keys import Keyring, parse_trusted_keys
from .keyfile import read_key_file


def _text(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text file") from None


def _public_text(data: bytes, path: Path) -> str:
    """A trusted-keys file's text, refused whole when it holds a private key or no text."""
    if is_private_material(data):
        raise ConfigError(
            f"trusted-keys file {safe_text(path)} holds {describe_key_material(data)}: trusted keys are public keys "
            f"(plancache pubkey {safe_text(path)} prints its public line; treat the private key as exposed)"
        )
    if describe_key_material(data) == "binary data, not key text":
        raise ConfigError(f"trusted-keys file {safe_text(path)} holds binary data, not key text")
    return _text(data, path)


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
            part = parse_trusted_keys(_public_text(read_key_file(file, "trusted key"), file), str(file))
            for kid in part.keys:
                if kid in listed_in:
                    raise ConfigError(f"{safe_text(file)}: key {kid} is already listed in {safe_text(listed_in[kid])}")
                listed_in[kid] = file
            keyring = keyring.merged(part)
        what = f"trusted-keys directory {safe_text(path)}"
    else:
        keyring = parse_trusted_keys(_public_text(read_key_file(path, "trusted-keys file"), path), str(path))
        what = f"trusted-keys file {safe_text(path)}"
    if not keyring.keys and not (allow_revocations_only and keyring.revoked):
        wanted = "no usable key (nor revocations)" if allow_revocations_only else "no usable key"
        raise ConfigError(f"{what} lists {wanted}")
    return keyring
