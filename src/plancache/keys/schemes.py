"""Key references, in cosign's forms (``--key``, ``PLANCACHE_SIGNING_KEY``): which kind of
key a reference names, from one table, as securesystemslib's ``signer`` package chooses a
signer by URI scheme.

================================  ===========================================================
``PATH``                          PEM PKCS#8 or OpenSSH private key file (ssh-keygen's too,
                                  encrypted or not), mode 0600 (:mod:`.keyfile`)
``env://VAR``                     the same key text in an environment variable: never on disk
                                  (:mod:`.env`)
``pkcs11:token=…;object=…?…``     a key inside an HSM or token (RFC 7512), extra ``[pkcs11]``
                                  (:mod:`.pkcs11`)
``awskms:///KEY`` (``//HOST/…``)  an AWS KMS ``ECC_NIST_EDWARDS25519`` key, extra ``[awskms]``
                                  (:mod:`.awskms`)
``gcpkms://projects/…/V``         a Cloud KMS ``EC_SIGN_ED25519`` key version, extra ``[gcpkms]``
                                  (:mod:`.gcpkms`)
``sigstore``                      keyless: the CI's OIDC identity, a Fulcio certificate and a
                                  Rekor entry; signatures are Sigstore bundles, extra
                                  ``[sigstore]`` (:mod:`.sigstore_signer`)
================================  ===========================================================

Each kind's module is imported only when a reference names it, so the core install
(cryptography alone) loads none of the HSM and KMS SDKs; those reach their backend within the
``PLANCACHE_TIMEOUT`` budget (:mod:`.remote_signer`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from ..trust.display import safe_text
from ..trust.errors import ConfigError
from ..trust.keyring.keys import Signer
from .keyfile import Prompt, file_signer

KEY_REF_FORMS = "a private key file, env://VAR, pkcs11:…, awskms://…, gcpkms://…, sigstore"

Loader = Callable[[str, Mapping[str, str], "Prompt | None"], Signer]
"""(reference, environment, prompt) -> the signer it names."""


def _env(ref: str, env: Mapping[str, str], prompt: Prompt | None) -> Signer:
    from .env import env_signer

    return env_signer(ref, env, prompt)


def _pkcs11(ref: str, env: Mapping[str, str], prompt: Prompt | None) -> Signer:
    from .pkcs11 import pkcs11_signer
    from .remote_signer import budget_from

    return pkcs11_signer(ref, budget_from(env))


def _awskms(ref: str, env: Mapping[str, str], prompt: Prompt | None) -> Signer:
    from .awskms import awskms_signer
    from .remote_signer import budget_from

    return awskms_signer(ref, budget_from(env))


def _gcpkms(ref: str, env: Mapping[str, str], prompt: Prompt | None) -> Signer:
    from .gcpkms import gcpkms_signer
    from .remote_signer import budget_from

    return gcpkms_signer(ref, env, budget_from(env))


def _sigstore(ref: str, env: Mapping[str, str], prompt: Prompt | None) -> Signer:
    if ref != "sigstore":  # a key file whose path starts so (sigstore-ci.pem)
        return file_signer(Path(ref).expanduser(), env, prompt)
    from .sigstore_signer import keyless_signer

    return keyless_signer(ref, env)


SCHEMES: tuple[tuple[str, Loader], ...] = (
    ("env://", _env),
    ("pkcs11:", _pkcs11),
    ("awskms://", _awskms),
    ("gcpkms://", _gcpkms),
    ("sigstore", _sigstore),
)
"""Reference prefix -> its kind's loader; anything else without ``://`` is a key file's path."""


def load_signer(
    ref: str, env: Mapping[str, str] = os.environ, prompt: Prompt | None = None
) -> Signer:
    """Resolve a key reference (table in the module docstring) to a signer.

    Raises:
        ConfigError: a reference of no supported form, or what its kind's loader refuses (a
            missing or exposed key file, a token or KMS key that is absent, denied or not
            Ed25519, a missing extra) (reason ``config-error``).
        StoreTimeout: an HSM or KMS did not answer within ``PLANCACHE_TIMEOUT`` (reason
            ``timeout``).
    """
    for prefix, load in SCHEMES:
        if ref.startswith(prefix):
            return load(ref, env, prompt)
    if "://" in ref or ref == "-":
        raise ConfigError(f"unsupported key reference {safe_text(ref, 80)!r}: use {KEY_REF_FORMS}")
    return file_signer(Path(ref).expanduser(), env, prompt)
