"""What one worker's boot holds on the plan side: its configuration, trust policy, signer, store.

Read from the environment at the first hook of a boot (``load_model``, or
``determine_available_memory`` if the prefetch hook did not run) and kept on the worker object,
not in the process's state (:mod:`.plugin_state`): it is the worker's, a process may hold
several workers (an in-process executor, the tests), and nothing of it can go stale between
boots. Apart from the boot path (:mod:`.boot`) because both halves of a boot use it: the apply
that decides and the save that signs and pushes (:mod:`.save`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..clock import Deadline
from ..pipeline.resolver import Resolver
from ..pipeline.trust_config import signer_for, worker_policy
from ..storage.local.localdir import LocalPlanDir
from ..storage.store import Store, open_store
from ..trust.display import safe_text
from ..trust.errors import PlanCacheError
from ..trust.keyring.keys import Signer
from ..trust.policy import TrustPolicy
from ..trust.result import PlanResult
from .adapter import plan_dir
from .compile_cache.counters import counters
from .config import PluginConfig, parse_config
from .deferred import DeferredWrites
from .prefetch import Prefetch

LOG = logging.getLogger("vllm.plancache")
STATE_ATTR = "_plancache_boot"


@dataclass
class Boot:
    """One worker's boot, plan side: what was read once, and what apply leaves for save."""

    config: PluginConfig
    policy: TrustPolicy
    env: Mapping[str, str] = field(default_factory=dict)
    apply_fingerprint: str | None = None
    apply_inputs: dict[str, Any] | None = None
    """The apply-time fingerprint's inputs (only if they reproduce it): signed with a saved plan."""
    apply_parts: dict[str, Any] | None = None
    """The apply-time configuration's parts, hashed (:func:`.adapter.config_parts`), signed
    beside the inputs."""
    signed_profile_ms: float | None = None
    """The applied plan's signed profiling time (what skipping it saves), when it carries one."""
    signed_by: list[dict[str, Any]] | None = None
    """Who signed the verified plan: names, key ids, a keyless signer's identity and issuer."""
    profile_ms: float | None = None
    """This boot's profiling time, when it profiled: signed with the plan it saves."""
    prefetch: Prefetch[PlanResult] | None = None
    plan_sha256: str | None = None
    """The sha256 of the verified plan this boot found for its fingerprint (issue 49): the notes
    name it, and a profiling boot never overwrites it (:mod:`.save`)."""
    signed_evidence: dict[str, Any] = field(default_factory=dict)
    """The verified plan's signed evidence (empty: signed without, "evidence: none")."""
    signed_plan_found: bool = False
    """A plan signed by trusted keys verified for this boot's fingerprint: a profiling boot keeps
    it as it is (vLLM's fresh plan is dropped, :mod:`.save`)."""
    note_path: Path | None = None
    """The applying note this boot wrote (:mod:`.plan_health.notes`), removed when it ends."""
    note_fd: int | None = None
    """That note, held open with an exclusive ``flock`` while this boot runs: a boot of the same
    fingerprint on the node tells a running boot's note from a dead one's."""
    unfinished: tuple[str, str, int] | None = None
    """(fingerprint, plan sha256, plan KV) of a plan an earlier boot left unfinished: compared
    with this boot's fresh profile at its save."""
    held_alert: dict[str, Any] | None = None
    """The alert of a plan this node holds back (``plan-exceeds-profile``), for the record."""
    counters_at_start: dict[str, int] = field(default_factory=dict)
    """vLLM's compilation counters when the boot began (:mod:`.compile_cache.counters`)."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """How this boot measured its profile (:mod:`plancache.trust.evidence`), when it profiled."""
    deferred: DeferredWrites | None = None
    """The note's durability and the record's write, in flight after the decision
    (:mod:`.deferred`): joined before ``determine_available_memory`` returns."""
    push_thread: threading.Thread | None = None
    push_result: str | None = None
    _signer: Signer | None = None
    _signer_loaded: bool = False
    _plans: LocalPlanDir | None = None

    @property
    def plans(self) -> LocalPlanDir:
        """vLLM's plan directory (:func:`.adapter.plan_dir`), asked once a boot: vLLM reads its
        cache root from the environment, which does not change under a running worker."""
        if self._plans is None:
            self._plans = plan_dir()
        return self._plans

    @property
    def signer(self) -> Signer | None:
        """The signing key, loaded when a plan is first signed, never at boot: a KMS or HSM key
        costs network calls (up to PLANCACHE_TIMEOUT when unreachable) that a boot applying a
        plan has no use for. Unusable: logged once, plans are saved unsigned and not pushed."""
        if not self._signer_loaded:
            try:
                self._signer = signer_for(self.config.signing_key, self.env)
            except PlanCacheError as exc:
                self._signer = None
                LOG.error(
                    "plancache: configuration: PLANCACHE_SIGNING_KEY: %s; plans will be saved "
                    "unsigned, not pushed",
                    safe_text(exc.detail, 300),
                )
            self._signer_loaded = True
        return self._signer

    @property
    def store_reads(self) -> bool:
        return self.config.url is not None and self.policy.reads_store

    @property
    def store_writes(self) -> bool:
        return self.config.url is not None and self.signer is not None

    def open_store(self, deadline: Deadline | None = None, *, writes: bool = False) -> Store:
        """The store, opened (the SDK imported) by ``deadline``: the caller's, so that opening and
        the reads after it share one budget (default: a budget of its own from now). ``writes``:
        for a push, which reads nothing through a registry's mirror (``write_options``)."""
        from ..storage.oci.registry_urls import write_options

        url = self.config.url or ""
        return open_store(
            url,
            write_options(url, self.config.storage_options)
            if writes
            else self.config.storage_options,
            timeout=self.config.timeout,
            deadline=deadline,
        )

    def resolver(self, deadline: Deadline | None = None) -> Resolver:
        """The shared pipeline over vLLM's plan directory; the store is opened on a local miss,
        by ``deadline`` (the lookup's: the store's import is part of the budget, not before it)."""
        return Resolver(
            self.plans,
            self.policy,
            (lambda: self.open_store(deadline)) if self.store_reads else None,
        )


def load_boot(env: Mapping[str, str] = os.environ) -> Boot:
    """A boot's configuration and trust policy read from ``env``; every problem one ERROR line
    (vLLM profiles as usual where it matters)."""
    config = parse_config(env)
    errors = list(config.errors)
    # a bad threshold: the policy is unusable, never weaker
    policy = worker_policy(config.trusted_keys, config.threshold)
    if policy.kind == "unusable":
        errors.append(f"PLANCACHE_TRUSTED_KEYS: {policy.problem}; no plan will be applied")
    boot = Boot(config, policy, env)
    boot.counters_at_start = counters()
    if config.url and not config.trusted_keys and not config.signing_key:
        errors.append(
            "PLANCACHE_URL is set without PLANCACHE_TRUSTED_KEYS: a plan from a store is never "
            "applied unverified, and without PLANCACHE_SIGNING_KEY nothing is pushed; store ignored"
        )
    if errors:
        LOG.error(
            "plancache: configuration: %s; vLLM profiles as usual where needed", "; ".join(errors)
        )
    return boot


def boot_for(worker: object) -> Boot:
    """This worker's boot state, created (config read, keys loaded) on first use."""
    boot = getattr(worker, STATE_ATTR, None)
    if isinstance(boot, Boot):
        return boot
    boot = load_boot()
    try:
        setattr(worker, STATE_ATTR, boot)
    except Exception:
        pass
    return boot
