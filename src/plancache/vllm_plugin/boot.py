"""The worker's boot path as data: fingerprint -> bytes -> VerifiedPlan -> Decision -> one line.

::

    Worker.load_model            prefetch(worker)   fp, then in a thread: store.fetch -> verify -> local write
    Worker.determine_available_memory
      apply(worker)              fp = vLLM's compute_plan_fingerprint          (same key as vLLM)
                                 local dir first: verify_plan (trusted keys) | admit_unsigned (no keys)
                                 else store (prefetched, or fetched now within PLANCACHE_TIMEOUT)
                                 gate.decide(plan, free memory, this worker's conditions)
                                 cache_config.kv_cache_memory_bytes = kv   if applied
                                 one INFO line: decision, reason, source, fingerprint, elapsed ms
    Worker.compile_or_warm_up_model
      save(worker, kv)           vLLM's own save writes its file; plancache picks the bytes up,
                                 checks they hold this worker's numbers, stores them under the
                                 apply-time fingerprint, signs, pushes in the background

The plugin decides nothing about trust: :mod:`plancache.trust` does (verify, then gate). This
module wires it, owns the policy for what to do with each outcome, and logs. Everything that
goes wrong becomes a :class:`~plancache.trust.gate.Decision` with a reason; nothing escapes
into vLLM, which then profiles as usual.

Per-boot state (configuration, keys, the apply-time fingerprint, the prefetch) lives on the
worker object, so there is no module-level state to go stale between boots or tests. The
configuration is read from the environment at the first hook of a boot (``load_model``, or
``determine_available_memory`` if the prefetch hook did not run).
"""

from __future__ import annotations

import logging
import numbers
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from ..storage.files import read_capped, write_atomic
from ..storage.keyfiles import load_keyring, load_signer
from ..storage.localdir import LocalPlanDir
from ..trust.errors import PlanCacheError, Reason
from ..trust.gate import Decision, Verdict, decide
from ..trust.keys import Keyring, Signer
from ..trust.plan import MAX_PLAN_BYTES, Plan, parse_plan, plan_name, render_plan
from ..trust.signing import sign_plan
from ..trust.verify import VerifiedPlan, admit_unsigned, verify_plan
from . import hooks, vote
from .config import DEFAULT_TIMEOUT, PluginConfig, parse_config
from .prefetch import Prefetch

LOG = logging.getLogger("vllm.plancache")
STATE_ATTR = "_plancache_boot"

Fingerprint = Callable[[Any, int, int], str]


# --------------------------------------------------------------------------- per-boot state


@dataclass
class FetchOutcome:
    """What a store lookup produced: a verified plan, or the reason there is none."""

    verified: VerifiedPlan | None = None
    error: PlanCacheError | None = None
    missing: bool = False
    """The store answered: no plan under this fingerprint (a decision, not an error)."""
    note: str = ""
    elapsed_ms: float = 0.0


@dataclass
class Boot:
    config: PluginConfig
    keyring: Keyring | None = None
    trust_error: str | None = None
    """Trusted keys were configured but cannot be used: no plan may apply (never a downgrade
    to unsigned admission)."""
    signer: Signer | None = None
    store_reads: bool = False
    store_writes: bool = False
    apply_fingerprint: str | None = None
    prefetch: Prefetch[FetchOutcome] | None = None
    push_thread: threading.Thread | None = None
    push_result: str | None = None


def _load_boot(env: Any = os.environ) -> Boot:
    config = parse_config(env)
    errors = list(config.errors)
    boot = Boot(config)
    if config.trusted_keys:
        try:
            keyring = load_keyring(Path(config.trusted_keys).expanduser())
            if config.threshold < 1:
                raise PlanCacheError(Reason.CONFIG, "invalid signature threshold")
            boot.keyring = keyring.with_threshold(config.threshold)
        except PlanCacheError as exc:
            boot.trust_error = exc.detail
            errors.append(f"PLANCACHE_TRUSTED_KEYS: {exc.detail}; no plan will be applied")
    if config.signing_key:
        try:
            boot.signer = load_signer(config.signing_key, env)
        except PlanCacheError as exc:
            errors.append(f"PLANCACHE_SIGNING_KEY: {exc.detail}; plans will be saved unsigned, not pushed")
    if config.url:
        boot.store_reads = boot.keyring is not None
        boot.store_writes = boot.signer is not None
        if not config.trusted_keys and boot.signer is None:
            errors.append(
                "PLANCACHE_URL is set without PLANCACHE_TRUSTED_KEYS: a plan from a store is never "
                "applied unverified, and without PLANCACHE_SIGNING_KEY nothing is pushed; store ignored"
            )
    if errors:
        LOG.error("plancache: configuration: %s; vLLM profiles as usual where needed", "; ".join(errors))
    return boot


def boot_for(worker: Any) -> Boot:
    """This worker's boot state, created (config read, keys loaded) on first use."""
    boot = getattr(worker, STATE_ATTR, None)
    if isinstance(boot, Boot):
        return boot
    boot = _load_boot()
    try:
        setattr(worker, STATE_ATTR, boot)
    except Exception:  # noqa: BLE001 - a worker that refuses attributes just reloads config
        pass
    return boot


# --------------------------------------------------------------------------- worker facts


def _enabled() -> bool:
    return bool(hooks.vllm_envs().VLLM_ENABLE_STARTUP_PLAN)  # the envs vLLM's startup_plan reads


def plan_dir() -> LocalPlanDir:
    """vLLM's plan directory, asked from vLLM itself (so both always agree)."""
    return LocalPlanDir(Path(hooks.startup_plan_module()._plan_path("0" * 16)).parent)


def fingerprint_of(worker: Any, fingerprint: Fingerprint) -> str:
    return fingerprint(worker.vllm_config, worker.rank, worker.parallel_config.world_size)


def _device_index(worker: Any) -> int:
    device = getattr(worker, "device", None)
    index = getattr(device, "index", None)
    if isinstance(index, int):
        return index
    local_rank = getattr(worker, "local_rank", 0)
    return local_rank if isinstance(local_rank, int) else 0


def _byte_count(value: Any) -> int | None:
    """An integral byte count (int, numpy or torch integer), never a bool."""
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else None


def worker_conditions(worker: Any) -> dict[str, Any]:
    """The facts vLLM's fingerprint misses, for *this* worker's device (vLLM asks device 0)."""
    current_platform = hooks.platform()  # the platform vLLM's startup_plan asks
    facts: dict[str, Any] = {}
    util = getattr(worker.cache_config, "gpu_memory_utilization", None)
    if isinstance(util, (int, float)) and not isinstance(util, bool):
        facts["gpu_memory_utilization"] = float(util)
    index = _device_index(worker)
    try:
        name = current_platform.get_device_name(index)
        if isinstance(name, str) and name:
            facts["device_name"] = name
    except Exception:  # noqa: BLE001 - a platform that cannot tell: not compared
        pass
    try:
        total = _byte_count(current_platform.get_device_total_memory(index))
        if total:
            facts["device_total_memory"] = total
    except Exception:  # noqa: BLE001
        pass
    return facts


def provenance(worker: Any) -> dict[str, Any]:
    """Facts recorded (signed) with a freshly profiled plan."""
    import torch
    import vllm

    facts = worker_conditions(worker)
    facts.update(
        model=str(worker.model_config.model),
        vllm_version=str(vllm.__version__),
        torch_version=str(torch.__version__),
        rank=int(worker.rank),
        world_size=int(worker.parallel_config.world_size),
    )
    return facts


def _now() -> datetime:
    return datetime.now(timezone.utc)


# --------------------------------------------------------------------------- store


def fetch_verified(boot: Boot, directory: LocalPlanDir, fp: str, deadline: float) -> FetchOutcome:
    """Store -> verify -> local atomic write. Runs in the prefetch thread or inline; never raises."""
    started = time.monotonic()
    outcome = FetchOutcome()
    try:
        if boot.keyring is None:  # guarded by the callers; a second lock on the same door
            raise PlanCacheError(Reason.CONFIG, "no trusted keys: the store is not read")
        from ..storage.store import open_store

        store = open_store(boot.config.url or "", boot.config.storage_options, timeout=boot.config.timeout)
        plan_bytes, sig_bytes = store.fetch(fp, deadline=deadline)
        if plan_bytes is None:
            outcome.missing = True
            outcome.elapsed_ms = (time.monotonic() - started) * 1000
            return outcome
        verified = verify_plan(plan_name(fp), plan_bytes, sig_bytes, boot.keyring, _now())
        outcome.verified = verified
        try:
            directory.write(fp, verified.plan_bytes, verified.sig_bytes)
        except PlanCacheError as exc:  # the cache is an optimisation: apply anyway
            outcome.note = f"not cached locally: {exc.detail}"
    except PlanCacheError as exc:
        outcome.error = exc
    except Exception as exc:  # noqa: BLE001 - s3fs/botocore/gcsfs raise anything
        outcome.error = PlanCacheError(Reason.STORE_ERROR, f"{type(exc).__name__}: {exc}")
    outcome.elapsed_ms = (time.monotonic() - started) * 1000
    return outcome


def prefetch(worker: Any, fingerprint: Fingerprint) -> None:
    """Start the store fetch for this worker's plan in the background (called as load_model starts)."""
    if not _enabled() or worker.cache_config.kv_cache_memory_bytes is not None:
        return
    boot = boot_for(worker)
    if not boot.store_reads or boot.prefetch is not None:
        return
    fp = fingerprint_of(worker, fingerprint)
    directory = plan_dir()
    if os.path.lexists(directory.path / plan_name(fp)):
        return  # local first: the common warm case never touches the network
    deadline = time.monotonic() + boot.config.timeout
    boot.prefetch = Prefetch(fp, deadline, lambda: fetch_verified(boot, directory, fp, deadline)).start()


def _store_outcome(boot: Boot, directory: LocalPlanDir, fp: str) -> tuple[FetchOutcome, bool]:
    """The prefetched outcome for ``fp`` (waiting at most the rest of its budget), else a fetch now.

    Returns (outcome, prefetched?)."""
    pending = boot.prefetch
    if pending is not None and pending.key == fp:
        finished, outcome = pending.result()
        if not finished or outcome is None:
            budget = boot.config.timeout
            waited = (time.monotonic() - pending.started) * 1000
            error = PlanCacheError(Reason.TIMEOUT, f"store gave no answer within the {budget:g} s budget")
            return FetchOutcome(error=error, elapsed_ms=waited), True
        return outcome, True
    return fetch_verified(boot, directory, fp, time.monotonic() + boot.config.timeout), False


# --------------------------------------------------------------------------- apply


def _verify_local(boot: Boot, name: str, plan_bytes: bytes, sig_bytes: bytes | None) -> VerifiedPlan:
    if boot.trust_error is not None:
        raise PlanCacheError(Reason.CONFIG, f"trusted keys unusable ({boot.trust_error})")
    if boot.keyring is not None:
        return verify_plan(name, plan_bytes, sig_bytes, boot.keyring, _now())
    # No trusted keys configured: vLLM's own policy (trust the cache directory), parsed strictly.
    return admit_unsigned(name, plan_bytes)


def _gate(worker: Any, verified: VerifiedPlan) -> Decision:
    free = _byte_count(worker.init_snapshot.free_memory)
    if free is None:
        return Decision(False, Reason.INTERNAL, "free memory is unknown", None, verified.fingerprint)
    return decide(verified, free, worker_conditions(worker))


def _with_detail(decision: Decision, prefix: str) -> Decision:
    if not prefix:
        return decision
    detail = f"{prefix}; {decision.detail}" if decision.detail else prefix
    return Decision(decision.applied, decision.reason, detail, decision.kv_cache_memory_bytes, decision.fingerprint)


def decide_plan(worker: Any, boot: Boot, fp: str) -> tuple[Decision, str]:
    """The decision for this worker and fingerprint, and where the plan came from."""
    directory = plan_dir()
    name = plan_name(fp)
    local_problem = ""
    # A prefetch only starts when there was no local plan: then the store's answer is the one
    # (the prefetch writes it locally itself once verified).
    if not (boot.prefetch is not None and boot.prefetch.key == fp):
        try:
            plan_bytes, sig_bytes = directory.read(fp)
            if plan_bytes is not None:
                return _gate(worker, _verify_local(boot, name, plan_bytes, sig_bytes)), "local"
        except PlanCacheError as exc:
            if not boot.store_reads:
                return Decision.rejected(exc, fp), "local"
            local_problem = f"local plan rejected ({exc.reason}: {exc.detail})"
    if not boot.store_reads:
        why = "no plan in the local directory" + ("" if boot.config.url is None else " (store not read)")
        return Decision(False, Verdict.NO_PLAN, why, None, fp), "none"
    outcome, prefetched = _store_outcome(boot, directory, fp)
    how = "prefetch" if prefetched else "fetch"
    note = f"{how} {outcome.elapsed_ms:.0f} ms" + (f", {outcome.note}" if outcome.note else "")
    if outcome.error is not None:
        if outcome.error.reason is Reason.CONFIG:
            LOG.error("plancache: store %s: %s; vLLM profiles as usual", boot.config.url, outcome.error.detail)
        decision = Decision.rejected(outcome.error, fp)
        return _with_detail(decision, "; ".join(p for p in (local_problem, note) if p)), "store"
    if outcome.missing:
        decision = Decision(False, Verdict.NO_PLAN, "no plan for this fingerprint in the store", None, fp)
        return _with_detail(decision, "; ".join(p for p in (local_problem, note) if p)), "store"
    assert outcome.verified is not None
    return _with_detail(_gate(worker, outcome.verified), "; ".join(p for p in (local_problem, note) if p)), "store"


def log_decision(decision: Decision, source: str, fp: str | None, started: float) -> None:
    elapsed = (time.monotonic() - started) * 1000
    detail = decision.detail
    verdict = "apply" if decision.applied else ("skip" if decision.reason is Verdict.ALREADY_SET else "profile")
    LOG.info(
        "plancache: decision=%s reason=%s source=%s fingerprint=%s elapsed_ms=%.1f%s%s",
        verdict,
        decision.reason.value,
        source,
        fp or "-",
        elapsed,
        f" kv_cache_memory_bytes={decision.kv_cache_memory_bytes}" if decision.applied else "",
        f' detail="{detail}"' if detail else "",
    )


def apply(worker: Any, fingerprint: Fingerprint) -> Decision | None:
    """Replaces vLLM's ``maybe_apply_startup_plan``: decide, maybe set the KV bytes, log one line."""
    started = time.monotonic()
    if not _enabled():
        return None  # as vLLM: the switch is read at call time
    if worker.cache_config.kv_cache_memory_bytes is not None:
        decision = Decision(False, Verdict.ALREADY_SET, "kv_cache_memory_bytes was set explicitly; plan not consulted")
        log_decision(decision, "none", None, started)
        return decision
    fp: str | None = None
    source = "none"
    budget = DEFAULT_TIMEOUT
    try:
        boot = boot_for(worker)
        budget = boot.config.timeout
        fp = fingerprint_of(worker, fingerprint)
        boot.apply_fingerprint = fp
        decision, source = decide_plan(worker, boot, fp)
    except Exception as exc:  # noqa: BLE001 - whatever it was, vLLM profiles
        LOG.debug("plancache: apply failed", exc_info=True)
        decision = Decision(False, Reason.INTERNAL, f"{type(exc).__name__}: {exc}", None, fp)
    # fleet: every rank votes (once, whatever it decided); a plan applies on all ranks or none
    decision = vote.settle(decision, budget + vote.MARGIN_S - (time.monotonic() - started))
    if decision.applied and decision.kv_cache_memory_bytes is not None:
        worker.cache_config.kv_cache_memory_bytes = decision.kv_cache_memory_bytes
    log_decision(decision, source, fp, started)
    return decision


# --------------------------------------------------------------------------- save


def save(worker: Any, kv_cache_memory_bytes: int, fingerprint: Fingerprint, vllm_save: Callable[[Any, int], None]) -> None:
    """Replaces vLLM's ``maybe_save_startup_plan``. Never raises; never waits for the store.

    vLLM's own save writes the plan first (so the bytes are vLLM's, by construction); plancache
    picks them up, checks they carry this worker's measured numbers, puts them under the
    fingerprint the next boot looks for (the apply-time one), signs them and pushes them.
    """
    vllm_save(worker, kv_cache_memory_bytes)
    if not _enabled():
        return
    boot = boot_for(worker)
    save_fp = fingerprint_of(worker, fingerprint)
    fp = boot.apply_fingerprint or save_fp
    directory = plan_dir()
    try:
        written = read_capped(directory.path / plan_name(save_fp), MAX_PLAN_BYTES)
        if written is None:
            LOG.warning("plancache: plan for %s not signed or shared: %s: vLLM wrote no plan (see its warning)", fp, Verdict.NO_PLAN)
            return
        plan = parse_plan(written, plan_name(save_fp))
        baseline = _byte_count(worker.init_snapshot.free_memory)
        if plan.kv_cache_memory_bytes != int(kv_cache_memory_bytes) or plan.free_memory_baseline != baseline:
            raise PlanCacheError(Reason.DIGEST_MISMATCH, "the plan file does not hold this boot's numbers")
        plan_bytes = written
        if fp != save_fp:
            plan_bytes = render_plan(Plan(fp, plan.kv_cache_memory_bytes, plan.free_memory_baseline, plan.extra))
            write_atomic(directory.path / plan_name(fp), plan_bytes)
        sig_bytes = None
        if boot.signer is not None:
            sig_bytes = sign_plan(plan_name(fp), plan_bytes, boot.signer, _now(), provenance=provenance(worker))
            directory.write_sig(fp, sig_bytes)
    except PlanCacheError as exc:
        LOG.warning("plancache: plan for %s not signed or shared: %s: %s", fp, exc.reason.value, exc.detail)
        return
    moved = "" if fp == save_fp else f" (vLLM's save-time fingerprint was {save_fp})"
    # The boot's one INFO line is the decision; what save and push did is DEBUG, their
    # failures WARNING (vLLM itself logs its own save at INFO).
    LOG.debug(
        "plancache: saved plan fingerprint=%s signed=%s%s%s",
        fp,
        "yes" if sig_bytes else "no",
        " push=started" if sig_bytes and boot.store_writes else "",
        moved,
    )
    if sig_bytes is not None and boot.store_writes:
        boot.push_thread = threading.Thread(
            target=_push, args=(boot, fp, plan_bytes, sig_bytes), name=f"plancache-push-{fp}", daemon=True
        )
        boot.push_thread.start()


def _push(boot: Boot, fp: str, plan_bytes: bytes, sig_bytes: bytes) -> None:
    started = time.monotonic()
    deadline = started + boot.config.timeout
    try:
        from ..storage.store import open_store

        store = open_store(boot.config.url or "", boot.config.storage_options, timeout=boot.config.timeout)
        store.put(fp, plan_bytes, sig_bytes, deadline=deadline)
        boot.push_result = "pushed"
        LOG.debug("plancache: pushed plan fingerprint=%s to %s in %.0f ms", fp, boot.config.url, (time.monotonic() - started) * 1000)
    except Exception as exc:  # noqa: BLE001 - a failed push costs the next machine a profile, nothing more
        detail = exc.detail if isinstance(exc, PlanCacheError) else f"{type(exc).__name__}: {exc}"
        boot.push_result = f"failed: {detail}"
        LOG.warning("plancache: push of plan %s to %s failed: %s", fp, boot.config.url, detail)
