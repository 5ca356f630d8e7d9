"""``plancache pubkey KEYREF``, and how the CLI asks a person for a key's passphrase.

``pubkey`` is how a key that lives in an HSM or a KMS gets into a trusted-keys file: its
public half is read through the same key reference that signs, so the line printed is the
key that will sign, whatever the backend says about it elsewhere.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from ..pipeline.trust_config import signer_for
from ..settings import SIGNING_KEY_ENV
from ..storage.keyfiles import KEY_REF_FORMS, Prompt
from ..trust.display import safe_text
from ..trust.errors import ConfigError
from ..trust.keyformat import openssh_line

KEYREF_HELP = f"key reference: {KEY_REF_FORMS}"


def terminal_prompt() -> Prompt | None:
    """``getpass`` when a person is at a terminal; None in CI (no stdin), so nothing waits."""
    return getpass.getpass if sys.stdin is not None and sys.stdin.isatty() else None


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "pubkey", help="print the OpenSSH public key line of a key reference",
        description="Print the ssh-ed25519 line of KEYREF's public key, ready for a trusted-keys file "
        "(or an allowed_signers file after a principal). KEYREF is any --key form: "
        f"{KEY_REF_FORMS}. The key id goes to stderr.",
    )
    p.add_argument("keyref", metavar="KEYREF", nargs="?", help=f"{KEYREF_HELP} (default: ${SIGNING_KEY_ENV})")
    p.add_argument("--name", help="name written after the key (the key's name in verify reports)")
    p.set_defaults(func=cmd_pubkey)


def cmd_pubkey(args: argparse.Namespace) -> int:
    name = args.name or ""
    if name != safe_text(name) or name != name.strip():
        raise ConfigError("--name must be one line of printable text without leading or trailing spaces")
    signer = signer_for(args.keyref, prompt=terminal_prompt())
    if signer is None:
        raise ConfigError(f"no key: pass KEYREF or set {SIGNING_KEY_ENV}")
    print(openssh_line(signer.public, name))
    print(f"key id {signer.keyid}", file=sys.stderr)
    return 0
