"""``plancache pubkey KEYREF``, and how the CLI asks a person for a key's passphrase.

``pubkey`` is how a key that lives in an HSM or a KMS gets into a trusted-keys file: its
public half is read through the same key reference that signs, so the line printed is the
key that will sign, whatever the backend says about it elsewhere. The ``sigstore`` reference
has no key: its line is the ``sigstore issuer=… identity=…`` that trusts exactly what Fulcio
certifies for this job (one certificate requested, nothing logged), which is how
``plancache-ci-bake`` checks its own keyless signatures as it checks a key's.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from dataclasses import replace

from ..keys.keyfile import Prompt
from ..pipeline.trust_config import signer_for
from ..settings import SIGNING_KEY_ENV
from ..trust.errors import ConfigError
from ..trust.keyring.identities import KEYID_PREFIX, BundleSigner
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
    if isinstance(signer, BundleSigner):
        line, keyid = _identity_line(signer, name)
    else:
        line, keyid = openssh_line(signer.public, name), signer.keyid
    if args.json:
        report(args, True, public_key_line=line, keyid=keyid)
        return 0
    print(line)
    print(f"key id {keyid}", file=sys.stderr)
    return 0


def _identity_line(signer: BundleSigner, name: str) -> tuple[str, str]:
    """The trusted-keys line of a keyless signer: the issuer and SAN of its certificate (not
    the token's claim: for GitHub Actions Fulcio certifies the workflow's URL), and its source
    repository when the certificate states one. A name is the
    line's ``name=`` option there, so one word: no space, comma or quote.

    Raises:
        ConfigError: the name would not read back as one option, or no certificate could be
            had (Fulcio refused the token or could not be reached).
    """
    if any(c.isspace() or c in ',"' for c in name):
        raise ConfigError("--name of a sigstore line is one word: no spaces, commas or quotes")
    ids = signer.own_keyring().identities
    if ids is None or not ids.trusted:  # pragma: no cover - a certificate always names one
        raise ConfigError("the signing certificate names no identity")
    first = ids.trusted[0]
    # the caller's repository, when the certificate states it: for a reusable workflow the SAN
    # is the called workflow, and only this refuses a fork that calls it (issue 48 item 3); the
    # ref, workflow and trigger stay the operator's choice (docs/keys.md)
    pinned = replace(first, source=tuple(p for p in first.source if p[0] == "source-repository"))
    return (f"name={name} " if name else "") + pinned.line, KEYID_PREFIX + first.identity
