"""Flags of the commands that make keys and signatures: ``keygen``, ``pubkey``, ``sign``.

One family because each works with a key reference or writes what a key signs, in place; their
code is in :mod:`..plans.signing_commands` (and :mod:`..keys_cmd` for ``pubkey``), imported only
when one of them runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...settings import SIGNING_KEY_ENV
from ..flag_objects import add_cosign_options, add_identity_token
from .shared_flags import KEYREF_HELP, add_command, json_flag, new_signature_flags

if TYPE_CHECKING:
    from .shared_flags import Sub


def add_signing_commands(sub: Sub) -> None:
    p = add_command(
        sub,
        "keygen",
        "plans.signing_commands:cmd_keygen",
        "create an Ed25519 signing key (PATH) and its public key (PATH.pub)",
        "Write a new Ed25519 private key to PATH (PEM PKCS#8, mode 0600; encrypted when "
        "PLANCACHE_KEY_PASSPHRASE is set) and its OpenSSH public line to PATH.pub, which is itself "
        "a valid trusted-keys file.",
    )
    p.add_argument("path", metavar="PATH")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.add_argument("--comment", help="name recorded in PATH.pub (default: the file name)")
    p.add_argument(
        "--format",
        choices=("pem", "openssh"),
        default="pem",
        help="private key format: PEM PKCS#8 (default) or OpenSSH's, which ssh-keygen reads",
    )
    json_flag(p)

    p = add_command(
        sub,
        "pubkey",
        "keys_cmd:cmd_pubkey",
        "print the OpenSSH public key line of a key reference",
        "Print the ssh-ed25519 line of KEYREF's public key, ready for a trusted-keys file (or an "
        f"allowed_signers file after a principal). KEYREF is any --key form ({KEYREF_HELP}). The "
        "key id goes to stderr. For 'sigstore' (keyless): the 'sigstore issuer=... identity=...' "
        "line of the identity Fulcio certifies for this job's token (one certificate requested, "
        "nothing logged).",
    )
    p.add_argument(
        "keyref", metavar="KEYREF", nargs="?", help=f"{KEYREF_HELP} (default: ${SIGNING_KEY_ENV})"
    )
    p.add_argument("--name", help="name written after the key (the key's name in verify reports)")
    add_identity_token(p)
    json_flag(p)

    p = add_command(
        sub,
        "sign",
        "plans.signing_commands:cmd_sign",
        "sign every plan in DIR that lacks a valid signature by the key",
        "Sign each plan in DIR that lacks a valid signature by KEY. A plan already signed by other "
        "keys is co-signed (same statement, one more signature) only if that statement verifies "
        "under --trusted-keys and says what this command would sign; otherwise it is refused (exit "
        "1) unless --replace. Warns when the gate's conditions (gpu_memory_utilization, "
        "device_name, device_total_memory) are not recorded: without them a plan made at one "
        "setting is applied at another.",
    )
    p.add_argument("--key", metavar="KEYREF", help=f"{KEYREF_HELP} (default: ${SIGNING_KEY_ENV})")
    add_identity_token(p)
    new_signature_flags(p)
    add_cosign_options(p)
    json_flag(p)
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no summary line on stderr (the table or JSON and warnings stay)",
    )
    p.add_argument(
        "dir", nargs="?", metavar="DIR", help="plan directory (default: vLLM's plan directory)"
    )
