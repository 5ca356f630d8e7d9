"""The compile-cache guard's settings: trust, signing and store, read once a boot.

Their own module because every part of the guard reads them (the decision on each cache, the
build node's publish, the precompiled headers' early compression) and none of those parts
should import another for them. Read from the environment at the first use in a boot and kept
in the boot's state (:mod:`..plugin_state`): a worker forked from the process that loaded the
plugin reads them again itself. The signing key is loaded only when a new cache is first
signed, never at boot.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ...settings import parse_duration
from ...trust.display import safe_text
from .. import plugin_state

if TYPE_CHECKING:
    from ...trust.keyring.keys import Keyring, Signer


LOG = logging.getLogger("vllm.plancache")
EXPIRES_ENV = "PLANCACHE_COMPILE_CACHE_EXPIRES_IN"
LOCK_WAIT_EXTRA = 30.0
"""The node lock is waited for at most the boot's budget (``PLANCACHE_TIMEOUT``) plus this, at
the guard (a rank waits while another pulls or verifies hundreds of MiB: seconds) as in
the publish inside vLLM's save: a lock another process holds costs a bounded wait and a
compile or an unsigned cache, never a hung worker."""


@dataclass(frozen=True)
class Settings:
    """The environment, read once a boot: trust, signing, store."""

    keyring: Keyring | None
    """None with ``problem`` set when keys are named but unusable, or none are."""
    problem: str
    signing_key: str | None
    url: str | None
    storage_options: Mapping[str, Any]
    timeout: float
    expires_in: timedelta | None = None
    expiry_problem: str = ""
    """Set when ``PLANCACHE_COMPILE_CACHE_EXPIRES_IN`` does not parse: nothing is signed then."""


def settings() -> Settings | None:
    """None when no trusted keys and no signing key are configured: nothing can be verified.
    Read at the first call of a boot, its problems logged then (one ERROR line each)."""
    guard = plugin_state.current().guard
    if guard.settings is None:  # as a cache: two first calls at once may both read, never block
        guard.settings = (_read(),)
    return guard.settings[0]


def _read() -> Settings | None:
    from ...pipeline.trust_config import worker_policy
    from ..config import parse_config

    config = parse_config()
    for error in config.errors:
        LOG.error("plancache: compile-cache: %s", error)
    policy = worker_policy(config.trusted_keys, config.threshold) if config.trusted_keys else None
    if policy is None and not config.signing_key:
        return None
    expires_in, problem = _expiry(os.environ.get(EXPIRES_ENV))  # None: unset, no expiry
    if problem:
        LOG.error("plancache: compile-cache: %s; new caches stay unsigned", problem)
    return Settings(
        keyring=policy.keyring if policy is not None else None,
        problem=policy.problem if policy is not None else "no trusted keys",
        signing_key=config.signing_key,
        url=config.url,
        storage_options=config.storage_options,
        timeout=config.timeout,
        expires_in=expires_in,
        expiry_problem=problem,
    )


def _expiry(raw: str | None) -> tuple[timedelta | None, str]:
    """The signed expiry (None: unset, none), or the problem that stops signing. A variable
    that is set but empty or blank is a problem like a typo: someone meant an expiry, and a
    cache signed without one would be trusted forever."""
    if raw is None:
        return None, ""
    text = raw.strip()
    if not text:
        return None, f"{EXPIRES_ENV} is set but empty (unset it for no expiry, or give e.g. 30d)"
    try:
        return parse_duration(text), ""
    except ValueError as exc:
        return None, f"{EXPIRES_ENV}: {exc}"


def signer() -> Signer | None:
    """The signing key, loaded when a new cache is first signed, never at boot (a KMS or HSM key
    costs network calls a warm boot has no use for); None, with one ERROR line, if unusable."""
    guard = plugin_state.current().guard
    if guard.signer is None:  # no lock held while a KMS key loads: nothing else waits for it
        guard.signer = (_load_signer(),)
    return guard.signer[0]


def _load_signer() -> Signer | None:
    config = settings()
    if config is None or not config.signing_key or config.expiry_problem:
        return None
    from ...pipeline.trust_config import signer_for

    try:
        return signer_for(config.signing_key)
    except Exception as exc:
        LOG.error(
            "plancache: compile-cache: signing key unusable (%s); new caches stay unsigned",
            safe_text(exc, 200),
        )
        return None


def signs_and_pushes() -> bool:
    """Whether this boot signs what it compiles and pushes it (signing key and store set)."""
    config = settings()
    return config is not None and bool(config.signing_key and config.url)
