"""After a profiled boot: pick up the plan vLLM saved, sign it, push it in the background.

vLLM's own save writes the plan first, so the bytes are vLLM's by construction; plancache
checks they carry this worker's measured numbers, puts them under the fingerprint the next
boot looks for (the apply-time one: compilation settings resolved during the boot can move
vLLM's save-time fingerprint), signs them and pushes them. Never raises; never waits for
the store: a failed push costs the next machine a profiling run, nothing more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..pipeline.resolver import utcnow
from ..storage.local.files import read_capped, write_atomic
from ..trust.errors import ConfigError, PlanCacheError, Reason, Rejected
from ..trust.plans.plan import MAX_PLAN_BYTES, Plan, parse_plan, plan_name, render_plan
from ..trust.signing import sign_plan
from .adapter import Fingerprint, enabled, fingerprint_of, free_memory, plan_dir, provenance
from .boot import Boot, boot_for
from .prefetch import off_compute_cores

LOG = logging.getLogger("vllm.plancache")


def save(
    worker: Any,
    kv_cache_memory_bytes: int,
    fingerprint: Fingerprint,
    vllm_save: Callable[[Any, int], None],
) -> None:
    """Replaces vLLM's ``maybe_save_startup_plan``."""
    vllm_save(worker, kv_cache_memory_bytes)
    if not enabled():
        return
    boot = boot_for(worker)
    save_fp = fingerprint_of(worker, fingerprint)
    fp = boot.apply_fingerprint or save_fp
    directory = plan_dir()
    try:
        written = read_capped(directory.path / plan_name(save_fp), MAX_PLAN_BYTES)
        if written is None:
            raise Rejected(Reason.MALFORMED, "vLLM wrote no plan (see its warning)")
        plan = parse_plan(written, plan_name(save_fp))
        if plan.kv_cache_memory_bytes != int(
            kv_cache_memory_bytes
        ) or plan.free_memory_baseline != free_memory(worker):
            raise Rejected(
                Reason.DIGEST_MISMATCH, "the plan file does not hold this boot's numbers"
            )
        plan_bytes = written
        if fp != save_fp:
            plan_bytes = render_plan(
                Plan(fp, plan.kv_cache_memory_bytes, plan.free_memory_baseline, plan.extra)
            )
            write_atomic(directory.path / plan_name(fp), plan_bytes)
        sig_bytes = None
        if boot.signer is not None:
            inputs = boot.apply_inputs if fp == boot.apply_fingerprint else None
            measured = {"profile_ms": boot.profile_ms} if boot.profile_ms is not None else None
            facts, now = provenance(worker), utcnow()
            try:
                sig_bytes = sign_plan(
                    plan_name(fp),
                    plan_bytes,
                    boot.signer,
                    now,
                    provenance=facts,
                    inputs=inputs,
                    measurements=measured,
                    config_parts=boot.apply_parts if inputs else None,
                )
            except (
                ConfigError
            ) as exc:  # the explanation's extras must never cost the plan its signature
                LOG.debug("plancache: plan %s signed without inputs: %s", fp, exc.detail)
                sig_bytes = sign_plan(plan_name(fp), plan_bytes, boot.signer, now, provenance=facts)
            directory.write_sig(fp, sig_bytes)
    except PlanCacheError as exc:
        LOG.warning(
            "plancache: plan for %s not signed or shared: %s: %s", fp, exc.reason.value, exc.detail
        )
        return
    moved = "" if fp == save_fp else f" (vLLM's save-time fingerprint was {save_fp})"
    # The boot's one INFO line is the decision; what save and push did is DEBUG, their
    # failures WARNING (vLLM itself logs its own save at INFO).
    pushing = sig_bytes is not None and boot.store_writes
    LOG.debug(
        "plancache: saved plan fingerprint=%s signed=%s%s%s",
        fp,
        "yes" if sig_bytes else "no",
        " push=started" if pushing else "",
        moved,
    )
    if pushing:
        boot.push_thread = threading.Thread(
            target=_push,
            args=(boot, fp, plan_bytes, sig_bytes),
            name=f"plancache-push-{fp}",
            daemon=True,
        )
        boot.push_thread.start()


def _push(boot: Boot, fp: str, plan_bytes: bytes, sig_bytes: bytes) -> None:
    off_compute_cores()
    started = time.monotonic()
    deadline = started + boot.config.timeout
    try:
        boot.open_store(deadline).put(fp, plan_bytes, sig_bytes, deadline=deadline)
        boot.push_result = "pushed"
        LOG.debug(
            "plancache: pushed plan fingerprint=%s to %s in %.0f ms",
            fp,
            boot.config.url,
            (time.monotonic() - started) * 1000,
        )
    except Exception as exc:
        detail = exc.detail if isinstance(exc, PlanCacheError) else f"{type(exc).__name__}: {exc}"
        boot.push_result = f"failed: {detail}"
        LOG.warning("plancache: push of plan %s to %s failed: %s", fp, boot.config.url, detail)
