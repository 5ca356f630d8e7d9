"""From settings to trust objects, once: the policy (trusted keys) and the signer (key
reference).

The CLI (flags, then environment) and the plugin (environment) name keys the same way; both
build their :class:`~plancache.trust.policy.TrustPolicy` here, so a trusted-keys setting
means the same thing wherever it is read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ..keys.keyfile import Prompt, load_keyring
from ..keys.schemes import load_signer
from ..settings import SIGNING_KEY_ENV, TRUSTED_KEYS_ENV
from ..trust.errors import ConfigError, PlanCacheError
from ..trust.keyring.keys import Keyring, Signer
from ..trust.policy import TrustPolicy


def load_trusted_keys(
    path: str | Path, threshold: int = 1, revocations_only: bool = False
) -> Keyring:
    """A trusted-keys file, or a directory whose ``*.pub`` files are all trusted.

    ``revocations_only`` accepts a file that lists only ``@revoked`` entries, for callers
    that only ask "is this revoked?" (``prune --revoked``).

    Raises:
        ConfigError: ``threshold`` is below 1, or the keys cannot be read or parsed (from
            :func:`~plancache.keys.keyfile.load_keyring`); ``config-error``.
    """
    if threshold < 1:
        raise ConfigError(
            f"the signature threshold must be a whole number of at least 1, got {threshold}"
        )
    keyring = load_keyring(Path(path).expanduser(), revocations_only)
    # a keyring of this threshold already is that value (frozen): not made and checked again
    return keyring if keyring.threshold == threshold else keyring.with_threshold(threshold)


def trust_policy(
    source: str | None, threshold: int = 1, revocations_only: bool = False
) -> TrustPolicy:
    """``signed`` with the keys at ``source``; ``unsigned-local`` when no keys are named.

    Keys that are named but unusable raise ConfigError: the CLI prints one line; the plugin
    (which must not raise) uses :func:`worker_policy` instead.
    """
    if not source:
        return TrustPolicy.unsigned_local()
    return TrustPolicy.signed(load_trusted_keys(source, threshold, revocations_only))


def worker_policy(source: str | None, threshold: int) -> TrustPolicy:
    """:func:`trust_policy`, but keys that cannot be used give the ``unusable`` policy: a broken
    key setup must never downgrade a worker to unsigned admission."""
    try:
        return trust_policy(source, threshold)
    except PlanCacheError as exc:
        return TrustPolicy.unusable(exc.detail)


def keys_source(option: str | None, env: Mapping[str, str] = os.environ) -> str | None:
    """``--trusted-keys``, else ``PLANCACHE_TRUSTED_KEYS``."""
    return option or env.get(TRUSTED_KEYS_ENV) or None


def signer_for(
    option: str | None, env: Mapping[str, str] = os.environ, prompt: Prompt | None = None
) -> Signer | None:
    """The signer named by ``--key``, else ``PLANCACHE_SIGNING_KEY``; None if neither.

    ``prompt`` asks for an encrypted key's passphrase: the CLI passes one on a terminal, the
    plugin never does (a worker must not wait on a person).
    """
    ref = option or env.get(SIGNING_KEY_ENV)
    return load_signer(ref, env, prompt) if ref else None
