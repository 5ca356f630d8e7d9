"""After a profiled boot: pick up the plan vLLM saved, sign it, push it in the background.

A profiling boot never destroys a signed plan (issue 49): when this boot verified a signed plan
for its fingerprint and profiled all the same (below the baseline once, a plan held back, an
unfinished boot), vLLM's fresh, unsigned plan is *dropped* (vLLM's save is not called; its
numbers stay in the boot record), so the next boot that passes the gate applies the signed one
again, store or no store. So it is, too, when a boot with trusted keys that cannot sign finds a
signed plan it did not verify (its trusted keys unusable for a moment, a key revoked and
restored): vLLM's plan beside the old signature would be refused as altered by every later boot.

A plan measured by a boot that compiled cold is not signed unless
``PLANCACHE_SIGN_COLD=1`` (one WARNING line says so), and vLLM's cold plan is removed, so that
the next (warm) boot profiles and records it again; impossible numbers are refused with their
own reasons (:func:`plancache.trust.evidence.refuse_impossible`).

vLLM's own save writes the plan first, so the bytes are vLLM's by construction; plancache
checks they carry this worker's measured numbers, puts them under the fingerprint the next
boot looks for (the apply-time one: compilation settings resolved during the boot can move
vLLM's save-time fingerprint), signs them and pushes them. Never raises; never waits for
the store: a failed push costs the next machine a profiling run, nothing more.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from ..clock import Deadline
from ..pipeline.resolver import utcnow
from ..storage.local.files import read_capped, write_atomic
from ..storage.local.localdir import LocalPlanDir
from ..trust.errors import ConfigError, PlanCacheError, Reason, Rejected
from ..trust.plans.evidence import evidence_note, refuse_cold, refuse_impossible
from ..trust.plans.plan import (
    MAX_PLAN_BYTES,
    Plan,
    parse_plan,
    plan_name,
    render_plan,
    sig_name,
)
from ..trust.signing import sign_plan
from . import record
from .adapter import (
    Fingerprint,
    Worker,
    enabled,
    fingerprint_of,
    free_memory,
    provenance,
    worker_conditions,
)
from .plan_health import node_memory as plan_guard
from .plan_health import notes as boot_notes
from .prefetch import off_compute_cores
from .worker_boot import Boot, boot_for

LOG = logging.getLogger("vllm.plancache")


def save(
    worker: Worker,
    kv_cache_memory_bytes: int,
    fingerprint: Fingerprint,
    vllm_save: Callable[[Worker, int], None],
) -> None:
    """Replaces vLLM's ``maybe_save_startup_plan``. A plan that cannot be taken up, signed or
    shared is one WARNING line: the boot goes on."""
    if not enabled():
        vllm_save(worker, kv_cache_memory_bytes)
        return
    boot = boot_for(worker)
    save_fp = fingerprint_of(worker, fingerprint)
    fp = boot.apply_fingerprint or save_fp
    directory = boot.plans
    try:  # after an unfinished boot: this fresh profile against the plan (hold back, or not)
        plan_guard.compare_after_profile(worker, boot, directory.path, int(kv_cache_memory_bytes))
    except Exception:
        LOG.debug("plancache: plan not compared with this boot's profile", exc_info=True)
    verified = boot.signed_plan_found and fp == boot.apply_fingerprint
    unverified = boot.config.trusted_keys is not None and boot.signer is None
    if verified or (unverified and _signed_here(directory, fp, save_fp)):
        LOG.info(
            "plancache: signed plan %s kept%s; this boot's profile (kv_cache_memory_bytes=%d) "
            "is not saved over it",
            fp,
            "" if verified else " (not verified by this boot)",
            int(kv_cache_memory_bytes),
        )
        record.note_plan_facts(
            worker, {"fresh_plan": "dropped", "profiled_kv": int(kv_cache_memory_bytes)}
        )
        return
    vllm_save(worker, kv_cache_memory_bytes)
    try:
        plan_bytes = _taken_up(worker, kv_cache_memory_bytes, directory, save_fp, fp)
        if boot.evidence:  # for `plancache sign` (plancache-ci-bake) when this boot signs nothing
            directory.write_evidence(fp, evidence_note(boot.evidence, plan_bytes))
        sig_bytes = _signed(worker, boot, directory, fp, plan_bytes)
    except PlanCacheError as exc:
        if exc.reason is Reason.COLD_COMPILE:  # never applied later: the next boot profiles warm
            for name in {plan_name(fp), plan_name(save_fp)}:
                boot_notes.clear(directory.path / name)
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


def _signed_here(directory: LocalPlanDir, *fps: str) -> bool:
    """Whether a signature lies beside the plan of any of ``fps``: a signed plan this boot did
    not verify (its trusted keys unusable for a moment, its key revoked or outside its window).
    A boot that asks for signed plans and cannot sign must not let vLLM save its unsigned plan
    over it: the old signature would stay beside other bytes, every later boot would refuse the
    plan as altered (``digest-mismatch``), and a node without a store would lose it for good
    (red team 8a). A boot with no trusted keys (a bake's profiling boot, whose plans
    ``plancache sign --replace`` signs afterwards) still saves as vLLM does."""
    return any(os.path.lexists(directory.path / sig_name(fp)) for fp in fps)


def _taken_up(
    worker: Worker, kv_cache_memory_bytes: int, directory: LocalPlanDir, save_fp: str, fp: str
) -> bytes:
    """The plan vLLM just wrote under ``save_fp``, checked to hold this boot's numbers; under
    ``fp`` (the apply-time key, which the next boot looks for), rewritten there if they differ.

    Raises:
        Rejected: vLLM wrote no plan (``malformed``), or not this boot's numbers
            (``digest-mismatch``); a plan that does not parse, as :func:`parse_plan` says.
    """
    written = read_capped(directory.path / plan_name(save_fp), MAX_PLAN_BYTES)
    if written is None:
        raise Rejected(Reason.MALFORMED, "vLLM wrote no plan (see its warning)")
    refuse_impossible(written, worker_conditions(worker).get("device_total_memory"))
    plan = parse_plan(written, plan_name(save_fp))
    if plan.kv_cache_memory_bytes != int(
        kv_cache_memory_bytes
    ) or plan.free_memory_baseline != free_memory(worker):
        raise Rejected(Reason.DIGEST_MISMATCH, "the plan file does not hold this boot's numbers")
    if fp == save_fp:
        return written
    plan_bytes = render_plan(
        Plan(fp, plan.kv_cache_memory_bytes, plan.free_memory_baseline, plan.extra)
    )
    write_atomic(directory.path / plan_name(fp), plan_bytes)
    return plan_bytes


def _signed(
    worker: Worker, boot: Boot, directory: LocalPlanDir, fp: str, plan_bytes: bytes
) -> bytes | None:
    """The plan's signature, written beside it, when the boot has a signing key (else None);
    with the apply-time inputs, configuration parts and profiling time when they are known."""
    if boot.signer is None:
        return None
    refuse_cold(boot.evidence, boot.config.sign_cold)
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
            evidence=boot.evidence,
        )
    except ConfigError as exc:
        # the explanation's extras must never cost the plan its signature
        LOG.debug("plancache: plan %s signed without inputs: %s", fp, exc.detail)
        sig_bytes = sign_plan(
            plan_name(fp), plan_bytes, boot.signer, now, provenance=facts, evidence=boot.evidence
        )
    directory.write_sig(fp, sig_bytes)
    return sig_bytes


def _push(boot: Boot, fp: str, plan_bytes: bytes, sig_bytes: bytes) -> None:
    off_compute_cores()
    deadline = Deadline.after(boot.config.timeout)
    try:
        boot.open_store(deadline, writes=True).put(fp, plan_bytes, sig_bytes, deadline=deadline)
        boot.push_result = "pushed"
        LOG.debug(
            "plancache: pushed plan fingerprint=%s to %s in %.0f ms",
            fp,
            boot.config.url,
            deadline.elapsed() * 1000,
        )
    except Exception as exc:
        detail = exc.detail if isinstance(exc, PlanCacheError) else f"{type(exc).__name__}: {exc}"
        boot.push_result = f"failed: {detail}"
        LOG.warning("plancache: push of plan %s to %s failed: %s", fp, boot.config.url, detail)
