"""The worker's boot path as data: fingerprint -> PlanResult -> Decision -> one line.

::

    Worker.load_model           prefetch(worker)  no local plan file: resolve(fp) in a thread
    Worker.determine_available_memory
      apply(worker)             fp       = vLLM's compute_plan_fingerprint     (same key as vLLM)
                                result   = Resolver.resolve(fp)  (prefetched if possible:
                                           local -> verify, else store -> verify -> persist)
                                decision = gate.decide(plan, free memory, this worker's facts)
                                agreed   = vote.settle(decision)  (world > 1: all ranks or none)
                                cache_config.kv_cache_memory_bytes = kv   if agreed
                                one INFO line: decision, reason, source, fingerprint, elapsed ms
    Worker.compile_or_warm_up_model
      save(worker, kv)          see :mod:`plancache.vllm_plugin.save`

This module decides nothing about trust: the :class:`~plancache.trust.policy.TrustPolicy`
built once per boot does, through the shared :class:`~plancache.pipeline.resolver.Resolver`,
then the gate. Everything that goes wrong becomes a Decision with a reason; nothing escapes
into vLLM, which then profiles as usual.

Per-boot state (configuration, policy, the apply-time fingerprint, the prefetch) lives on
the worker object (:mod:`.worker_boot`), so there is no module-level state to go stale between
boots or tests.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from ..clock import Deadline, Stopwatch
from ..pipeline.keyless_report import signers_of
from ..pipeline.plan_sets.node_plans import replica_of, resolve_node
from ..storage.deadline import DEFAULT_TIMEOUT
from ..trust.display import safe_text
from ..trust.errors import ConfigError, PlanCacheError, Reason, StoreTimeout
from ..trust.inputs import fingerprint_of_inputs
from ..trust.plans.gate import Decision, Verdict, decide
from ..trust.plans.plan import plan_name
from ..trust.result import PlanResult
from . import deferred, record, vote
from .adapter import (
    Fingerprint,
    Worker,
    config_parts,
    enabled,
    fingerprint_inputs,
    fingerprint_of,
    free_memory,
    uses_startup_plans,
    vllm_release,
    worker_conditions,
    world_of,
)
from .plan_health import measured
from .plan_health import node_memory as plan_guard
from .prefetch import Prefetch
from .worker_boot import STATE_ATTR, Boot, boot_for

LOG = logging.getLogger("vllm.plancache")
WITHOUT_PLANS_ATTR = "_plancache_without_plans"


def _resolve(
    boot: Boot,
    fp: str,
    deadline: Deadline,
    *,
    world: Callable[[], list[str] | None] | None = None,
) -> PlanResult:
    """Local first, then the store, verified; runs in the prefetch thread or inline. With the
    world's fingerprints, one rank per node reads the world's plan set
    (:mod:`..pipeline.plan_sets.node_plans`). ``world`` is asked only after a local miss: a warm
    node never computes the other ranks' keys."""
    try:
        resolver = boot.resolver(deadline)
        if world is not None and resolver.reads_store:
            local = resolver.local(fp)
            if local.verified is not None:
                return local
            members = world()
            if members:
                import socket

                replica = replica_of(socket.gethostname(), boot.config.set_replicas)
                return resolve_node(resolver, fp, members, deadline, replica=replica)
        return resolver.resolve(fp, deadline)
    except PlanCacheError as exc:
        return PlanResult(fp, "local", error=exc)


def prefetch(worker: Worker, fingerprint: Fingerprint) -> None:
    """Start resolving this worker's plan in the background (called as load_model starts).
    A worker whose class never uses plans (vLLM's CPU worker) gets one decision line instead."""
    if not enabled():
        return
    if not uses_startup_plans(worker):
        _without_plans(worker)
        return
    if worker.cache_config.kv_cache_memory_bytes is not None:
        return
    boot = boot_for(worker)
    if not boot.store_reads or boot.prefetch is not None:
        return
    fp = fingerprint_of(worker, fingerprint)
    if os.path.lexists(boot.plans.path / plan_name(fp)):
        return  # local first: the common warm case never touches the network
    deadline = Deadline.after(boot.config.timeout)
    # on this thread: the configuration is vLLM's to change
    members = world_of(worker, fingerprint, fp)
    boot.prefetch = Prefetch(
        fp, deadline, lambda: _resolve(boot, fp, deadline, world=lambda: members)
    ).start()


def _without_plans(worker: object) -> None:
    """The one line for a worker that never applies or saves a plan; nothing is read, fetched
    or patched for it (no configuration, no keys, no store: there is nothing to decide)."""
    if getattr(worker, WITHOUT_PLANS_ATTR, False):
        return
    try:
        setattr(worker, WITHOUT_PLANS_ATTR, True)
    except Exception:
        pass
    cls = type(worker)
    owner = next((k for k in cls.__mro__ if "determine_available_memory" in vars(k)), cls)
    detail = (
        f"vLLM {vllm_release() or '(unknown shape)'} {cls.__name__} "
        f"({owner.__module__}.{owner.__name__}.determine_available_memory) never applies or "
        "saves a startup plan; plancache does nothing for this worker"
    )
    log_decision(
        Decision(False, Verdict.WORKER_WITHOUT_PLANS, detail),
        "none",
        None,
        Stopwatch.started(),
        worker=worker,
    )


def _lookup(boot: Boot, fp: str, world: Callable[[], list[str] | None] | None = None) -> PlanResult:
    """The prefetched result for ``fp`` (waiting at most the rest of its budget), else resolve
    now."""
    pending = boot.prefetch
    if pending is None or pending.key != fp:
        due = Deadline.after(boot.config.timeout)
        result = _resolve(boot, fp, due, world=world)
        how, took_ms = "fetch", Stopwatch(due.start, due.clock).elapsed_ms()
    else:
        finished, got = pending.result()
        took_ms = pending.took_ms()
        if not finished or got is None:
            error = StoreTimeout(
                f"store gave no answer within the {boot.config.timeout:g} s budget"
            )
            return PlanResult(fp, "store", error=error, note=f"prefetch {took_ms:.0f} ms")
        result, how = got, "prefetch"
    return result.with_note(f"{how} {took_ms:.0f} ms") if result.source == "store" else result


def decide_plan(
    worker: Worker, boot: Boot, fp: str, *, fingerprint: Fingerprint | None = None
) -> tuple[Decision, str]:
    """The decision for this worker and fingerprint, and where the plan came from."""
    world = (
        (lambda: world_of(worker, fingerprint, fp))
        if fingerprint is not None and boot.store_reads
        else None
    )
    # the world computed only if nothing was prefetched and the local plan misses
    result = _lookup(boot, fp, world)
    if result.verified is not None:
        statement = result.verified.statement
        boot.signed_by = signers_of(result.verified)
        boot.plan_sha256 = plan_guard.sha256(result.verified.plan_bytes)
        boot.signed_plan_found = bool(result.verified.signers)
        boot.signed_evidence = dict(statement.evidence) if statement is not None else {}
        boot.signed_profile_ms = (
            statement.measurements.get("profile_ms") if statement is not None else None
        )
        free = free_memory(worker)
        if free is None:
            decision = Decision(False, Reason.INTERNAL, "free memory is unknown", None, fp)
        else:
            decision = decide(result.verified, free, worker_conditions(worker))
        return decision.noted(result.note), result.source
    if result.error is not None:
        if result.source == "store" and isinstance(result.error, ConfigError):
            LOG.error(
                "plancache: store %s: %s; vLLM profiles as usual",
                boot.config.url,
                result.error.detail,
            )
        return Decision.rejected(result.error, fp).noted(result.note), result.source
    where = "in the store" if result.source == "store" else "in the local directory"
    unread = " (store not read)" if boot.config.url is not None and not boot.store_reads else ""
    return Decision(False, Verdict.NO_PLAN, f"no plan {where}{unread}", None, fp).noted(
        result.note
    ), "none"


def _quoted(text: str) -> str:
    """One line, bounded, no quote to break out of ``detail="…"`` and no ``=`` to fake a field
    inside it: neither a log parser nor ``grep decision=apply`` can be fooled by a detail."""
    return safe_text(text, 500).replace('"', "\\x22").replace("=", "\\x3d")


def log_decision(
    decision: Decision,
    source: str,
    fp: str | None,
    started: Stopwatch,
    *,
    worker: object = None,
    boot: Boot | None = None,
    facts: Mapping[str, Any] | None = None,
    later: list[tuple[str, Callable[[], None]]] | None = None,
) -> record.BootRecord | None:
    """The boot's one INFO line; the same fields go into the boot record (:mod:`.record`), with
    ``facts`` (what the boot knows of its plan besides: :func:`.plan_health.node_memory.
    decision_facts`) in the same write (``later``: on the boot's deferred thread).
    A plan read through a registry's mirror says so (``via_mirror=HOST``: docs/stores.md): the
    mirror of the plan's own store, not one another store of the process (a compile cache's)
    was read through. Returns the boot record written (None: none, or it failed)."""
    elapsed = started.elapsed_ms()
    skipped = decision.reason in (Verdict.ALREADY_SET, Verdict.WORKER_WITHOUT_PLANS)
    verdict = "apply" if decision.applied else ("skip" if skipped else "profile")
    via = ""
    if source == "store":  # a local hit never asks (nor imports) the registry's notes
        from ..storage.oci.mirrors.mirror_reads import mirrors_read, store_key

        serving = store_key(boot.config.url) if boot is not None else None
        via = ",".join(h for h, _ in mirrors_read(serving))
    if LOG.isEnabledFor(logging.INFO):  # the detail quoted only for a line that is emitted
        LOG.info(
            "plancache: decision=%s reason=%s source=%s fingerprint=%s elapsed_ms=%.1f%s%s%s",
            verdict,
            decision.reason.value,
            source,
            fp or "-",
            elapsed,
            f" kv_cache_memory_bytes={decision.kv_cache_memory_bytes}" if decision.applied else "",
            f" via_mirror={via}" if via else "",
            f' detail="{_quoted(decision.detail)}"' if decision.detail else "",
        )
    if worker is not None:
        try:
            return record.note_plan(
                worker,
                verdict,
                decision.reason.value,
                source,
                fp,
                decision.detail,
                elapsed,
                signed_profile_ms=boot.signed_profile_ms
                if boot is not None and decision.applied
                else None,
                signed_by=boot.signed_by if boot is not None and decision.applied else None,
                facts=facts,
                later=later,
            )
        except Exception:
            LOG.debug("plancache: boot record not updated", exc_info=True)
    return None


def _inputs(worker: Worker, fp: str) -> dict[str, Any] | None:
    """The fingerprint's inputs as vLLM hashed them, or None when they do not reproduce ``fp``
    (a vLLM that hashes otherwise: nothing is signed that is not what was hashed)."""
    try:
        inputs = fingerprint_inputs(
            worker.vllm_config, worker.rank, worker.parallel_config.world_size
        )
    except Exception:
        return None
    return inputs if fingerprint_of_inputs(inputs) == fp else None


def join_deferred(boot: Boot) -> None:
    """Wait for the boot's deferred writes (:mod:`.deferred`) and say what they could not do."""
    pending, boot.deferred = boot.deferred, None
    plan_guard.deferred_failed(boot, deferred.wait(pending))


def after_profiling(worker: object, elapsed_ms: float) -> None:
    """``determine_available_memory`` returned after ``elapsed_ms``: the time saved (applied) or
    the profiling time a saved plan signs (profiled). Never raises."""
    try:
        boot = getattr(worker, STATE_ATTR, None)
        if isinstance(boot, Boot):  # the note durable before vLLM sizes the KV cache
            join_deferred(boot)
        if isinstance(boot, Boot) and enabled():
            profiled = record.note_profiling(worker, elapsed_ms)
            boot.profile_ms = round(profiled, 1) if profiled is not None else None
            if profiled is not None:  # the numbers vLLM just computed: evidence for the save
                boot.evidence = measured.evidence(worker, boot.counters_at_start)
    except Exception:
        LOG.debug("plancache: boot record not updated", exc_info=True)


def after_warm_up(worker: object) -> None:
    """``compile_or_warm_up_model`` returned: the boot is over, its record final. Never raises."""
    try:
        boot = getattr(worker, STATE_ATTR, None)
        if isinstance(boot, Boot):  # the note goes; the free memory left after applying is told
            join_deferred(boot)
            plan_guard.finished(worker, boot, *measured.free_memory_now(worker))
    except Exception:
        LOG.debug("plancache: boot note not cleared", exc_info=True)
    try:
        record.finish(worker)  # its own record, or the compile guard's of this process; else none
    except Exception:
        LOG.debug("plancache: boot record not finished", exc_info=True)


def apply(worker: Worker, fingerprint: Fingerprint) -> Decision | None:
    """Replaces vLLM's ``maybe_apply_startup_plan``: decide, maybe set the KV bytes, log one
    line."""
    started = Stopwatch.started()  # the vote's budget is the rest of the boot's, from here
    if not enabled():
        return None  # as vLLM: the switch is read at call time
    if worker.cache_config.kv_cache_memory_bytes is not None:
        decision = Decision(
            False,
            Verdict.ALREADY_SET,
            "kv_cache_memory_bytes was set explicitly; plan not consulted",
        )
        log_decision(decision, "none", None, started, worker=worker)
        return decision
    fp: str | None = None
    source = "none"
    budget = DEFAULT_TIMEOUT
    boot: Boot | None = None
    defer = deferred.can_defer(worker)
    try:
        boot = boot_for(worker)
        budget = boot.config.timeout
        fp = fingerprint_of(worker, fingerprint)
        boot.apply_fingerprint = fp
        decision, source = decide_plan(worker, boot, fp, fingerprint=fingerprint)
        # this node's own memory of the plan (held back, unfinished), and the note, before the
        # vote: a rank that cannot note it says no, and every rank profiles together. Made
        # durable here, or on the deferred thread before the KV cache is sized (:mod:`.deferred`)
        decision = plan_guard.before_vote(boot, boot.plans.path, decision, sync=not defer)
    except Exception as exc:
        LOG.debug("plancache: apply failed", exc_info=True)
        decision = Decision(False, Reason.INTERNAL, f"{type(exc).__name__}: {exc}", None, fp)
    # Every rank votes once, whatever it decided (gloo pairs collectives by order, so a rank
    # that errored must vote too): a plan applies on all ranks or on none.
    decision = vote.settle(decision, Deadline(started.start, budget + vote.MARGIN_S).remaining())
    if boot is not None:
        plan_guard.after_vote(boot, decision)
    if decision.applied and decision.kv_cache_memory_bytes is not None:
        worker.cache_config.kv_cache_memory_bytes = decision.kv_cache_memory_bytes
    # the applied plan's evidence, or the alert of a plan held back here: in the same record write
    facts = plan_guard.decision_facts(boot, decision) if boot is not None else None
    later = plan_guard.deferred_durability(boot) if boot is not None and defer else None
    written = log_decision(
        decision, source, fp, started, worker=worker, boot=boot, facts=facts, later=later
    )
    if boot is not None and later:
        boot.deferred = deferred.DeferredWrites(later)
        if written is not None:
            written.pending = boot.deferred
    if boot is not None and fp is not None and not decision.applied:
        # Only a boot that profiles saves a plan: it signs these (~8 ms with vLLM 0.33 on CPU);
        # a boot that applies never pays for them. Read now, while the config is apply-time's.
        boot.apply_inputs = _inputs(worker, fp)
        try:
            boot.apply_parts = config_parts(worker.vllm_config) if boot.apply_inputs else None
        except Exception:
            boot.apply_parts = None
    return decision
