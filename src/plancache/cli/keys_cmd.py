"""``plancache pubkey KEYREF``, and how the CLI asks a person for a key's passphrase.

``pubkey`` is how a key that lives in an HSM or a KMS gets into a trusted-keys file: its
public half is read through the same key reference that signs, so the line printed is the
key that will sign, whatever the backend says about it elsewhere.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from ..keys.keyfile import Prompt
from ..pipeline.trust_config import signer_for
from ..settings import SIGNING_KEY_ENV
from ..trust.errors import ConfigError
from ..trust.keyring.keyformat import openssh_line
from ..trust.keyring.trusted_keys_file import check_key_name
from .output import report


def terminal_prompt() -> Prompt | None:
    """``getpass`` when a person is at a terminal; None in CI (no stdin), so nothing waits."""
    return getpass.getpass if sys.stdin is not None and sys.stdin.isatty() else None


def cmd_pubkey(args: argparse.Namespace) -> int:
    """Print the OpenSSH public line of KEYREF (the key id on stderr).

    Raises:
        ConfigError: neither KEYREF nor ``$PLANCACHE_SIGNING_KEY`` names a key
            (``config-error``).
    """
    name = check_key_name(args.name or "", "--name")
    signer = signer_for(args.keyref, prompt=terminal_prompt())
    if signer is None:
        raise ConfigError(f"no key: pass KEYREF or set {SIGNING_KEY_ENV}")
    line = openssh_line(signer.public, name)
    if args.json:
        report(args, True, public_key_line=line, keyid=signer.keyid)
        return 0
    print(line)
    print(f"key id {signer.keyid}", file=sys.stderr)
    return 0
