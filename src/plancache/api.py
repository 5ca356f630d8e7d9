"""The two calls an offline script needs most, over the library: verify a location, pull plans.

::

    import plancache

    keys = plancache.load_trusted_keys("/etc/plancache/trusted-keys")
    for report in plancache.verify_location("s3://acme-plans/llama", keys):
        print(report.fingerprint, report.status, report.reason, report.signer_ids)
    results = plancache.pull("s3://acme-plans/llama", "/opt/vllm-cache/startup_plan", keys)

Both accept a :class:`~plancache.trust.keys.Keyring` (from :func:`load_trusted_keys`) or a
:class:`~plancache.trust.policy.TrustPolicy`; both raise only
:class:`~plancache.trust.errors.PlanCacheError` kinds for whole-call failures (a store that
cannot be listed, a bad URL) and report each plan's own outcome in its result.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from .pipeline.audit import PlanReport, audit_location
from .pipeline.locations import BULK_TIMEOUT, local_dir
from .pipeline.resolver import Resolver, utcnow
from .storage.store import open_store
from .trust.keys import Keyring
from .trust.policy import TrustPolicy
from .trust.result import PlanResult


def _policy(trust: Keyring | TrustPolicy) -> TrustPolicy:
    return trust if isinstance(trust, TrustPolicy) else TrustPolicy.signed(trust)


def verify_location(
    location: str | Path | None,
    trust: Keyring | TrustPolicy,
    storage_options: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    jobs: int | None = None,
) -> list[PlanReport]:
    """One report per plan in a directory (default: vLLM's plan directory) or store URL."""
    _, reports = audit_location(location, _policy(trust), utcnow(), storage_options, timeout, jobs)
    return reports


def pull(
    url: str,
    directory: str | Path | None,
    trust: Keyring | TrustPolicy,
    fingerprints: Sequence[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    timeout: float | None = None,
) -> list[PlanResult]:
    """Fetch, verify and write (atomically, only verified bytes) the store's plans into
    ``directory`` (default: vLLM's plan directory); all of them or the given fingerprints."""
    budget = timeout if timeout is not None else BULK_TIMEOUT
    resolver = Resolver(local_dir(directory, must_exist=False), _policy(trust), open_store(url, storage_options, budget))
    return list(resolver.pull(fingerprints, time.monotonic() + budget))
