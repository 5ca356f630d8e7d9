"""The ``env://VAR`` kind of key reference: the private key's text in an environment
variable, so that a CI secret never touches the disk; read as a key file's text is
(:func:`.keyfile.private_key_signer`, the same formats and passphrase)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..trust.display import safe_text
from ..trust.errors import ConfigError
from ..trust.keyring.keys import Ed25519Signer
from .keyfile import Prompt, private_key_signer

ENV_SCHEME = "env://"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_signer(ref: str, env: Mapping[str, str], prompt: Prompt | None) -> Ed25519Signer:
    """``env://VAR``'s key, read as a key file's text is.

    Raises:
        ConfigError: VAR is no variable name or is not set, or its text is refused as a key
            file's would be (reason ``config-error``).
    """
    name = ref[len(ENV_SCHEME) :]
    if not _ENV_NAME.fullmatch(name):
        raise ConfigError(
            f"'{ENV_SCHEME}{safe_text(name, 60)}' does not name an environment variable"
        )
    text = env.get(name)
    if not text:
        raise ConfigError(f"{ENV_SCHEME}{name}: the environment variable {name} is not set")
    return private_key_signer(
        text.encode("utf-8", "replace"), f"environment variable {name}", env, prompt
    )
