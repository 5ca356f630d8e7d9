"""The two calls an offline script needs most, over the library: verify a location, pull plans.

::

    import plancache

    keys = plancache.load_trusted_keys("/etc/plancache/trusted-keys")
    for report in plancache.verify_location("s3://acme-plans/llama", keys):
        print(report.fingerprint, report.status, report.reason, report.signer_ids)
    results = plancache.pull("s3://acme-plans/llama", "/opt/vllm-cache/startup_plan", keys)

Both accept a :class:`~plancache.trust.keyring.keys.Keyring` (from :func:`load_trusted_keys`) or a
:class:`~plancache.trust.policy.TrustPolicy`, and read the environment as the CLI does, what
is passed explicitly winning: no ``trust`` means ``$PLANCACHE_TRUSTED_KEYS`` (as
``--trusted-keys``' default), ``storage_options`` are merged key by key over
``$PLANCACHE_STORAGE_OPTIONS``, and no directory is vLLM's plan directory
(``$VLLM_CACHE_ROOT``). Both raise only
:class:`~plancache.trust.errors.PlanCacheError` kinds for whole-call failures (a store that
cannot be listed, a bad URL) and report each plan's own outcome in its result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .clock import Deadline
from .pipeline.audit import PlanReport, audit_location
from .pipeline.locations import BULK_TIMEOUT, local_dir, open_url, storage_options_for
from .pipeline.resolver import Resolver, utcnow
from .settings import TRUSTED_KEYS_ENV
from .storage.deadline import checked_budget
from .trust.errors import ConfigError
from .trust.keyring.keys import Keyring
from .trust.policy import TrustPolicy
from .trust.result import PlanResult


def _policy(trust: Keyring | TrustPolicy | None) -> TrustPolicy:
    if trust is None:  # as the CLI: the trusted keys the environment names, or a one-line error
        from .pipeline.trust_config import keys_source, trust_policy

        source = keys_source(None)
        if not source:
            raise ConfigError(f"no trusted keys: pass trust= or set {TRUSTED_KEYS_ENV}")
        return trust_policy(source)
    return trust if isinstance(trust, TrustPolicy) else TrustPolicy.signed(trust)


def verify_location(
    location: str | Path | None,
    trust: Keyring | TrustPolicy | None = None,
    storage_options: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    jobs: int | None = None,
) -> list[PlanReport]:
    """One report per plan in a directory (default: vLLM's plan directory) or store URL.

    Each plan's own outcome (verified, rejected and why) is in its report; what raises is a
    failure of the whole call.

    Raises:
        ConfigError: no ``trust`` and no trusted keys in the environment, trusted keys that
            cannot be used, a storage option, timeout or location that is wrong, a directory or
            bucket that does not exist (reason ``config-error``).
        StoreError: the store cannot be opened or listed (reason ``store-error``).
        StoreTimeout: the store did not answer within the budget (reason ``timeout``).
    """
    _, reports = audit_location(
        location,
        _policy(trust),
        utcnow(),
        storage_options=storage_options_for(storage_options),
        timeout=timeout,
        jobs=jobs,
    )
    return reports


def pull(
    url: str,
    directory: str | Path | None,
    trust: Keyring | TrustPolicy | None = None,
    fingerprints: Sequence[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    timeout: float | None = None,
) -> list[PlanResult]:
    """Fetch, verify and write (atomically, only verified bytes) the store's plans into
    ``directory`` (default: vLLM's plan directory); all of them or the given fingerprints.

    Each plan's own outcome (written, rejected and why, a failed write) is in its result; what
    raises is a failure of the whole call.

    Raises:
        ConfigError: no ``trust`` and no trusted keys in the environment, trusted keys that
            cannot be used, a storage option, timeout, URL or directory that is wrong (reason
            ``config-error``).
        StoreError: the store cannot be opened or listed (reason ``store-error``).
        StoreTimeout: the store did not answer within the budget (reason ``timeout``).
    """
    deadline = Deadline.after(budget := checked_budget(timeout, BULK_TIMEOUT))
    # opening the store counts against the budget, as in the CLI
    store = open_url(url, storage_options_for(storage_options), budget, deadline=deadline)
    resolver = Resolver(local_dir(directory, must_exist=False), _policy(trust), store)
    return list(resolver.pull(fingerprints, deadline))
