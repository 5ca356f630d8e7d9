"""Between the gate and the vote, and at the end of start-up: the node's own memory of a plan.

A verified plan that passed the gate is still only applied if this node has not seen it fail
(:mod:`.notes`): held back (``plan-exceeds-profile``) or left unfinished by an earlier boot
(``unfinished-boot``). Otherwise the note is written *before* the vote, so that a rank that
cannot write it says no and every rank profiles together (:mod:`.vote`); a vote that then does
not apply removes it. At the end of start-up the note is removed (:func:`finished`), the free
memory left is checked against :data:`MIN_FREE_FRACTION` (:func:`margin_after_apply`), and a
boot that profiled after an unfinished one compares its fresh profile with the plan
(:func:`compare_after_profile`). Never raises into vLLM: a failure is a DEBUG line, except a note
that cannot be written, which keeps the plan from applying.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...trust.display import safe_text
from ...trust.errors import PlanCacheError, Reason
from ...trust.plans.gate import EXCEEDS_PROFILE_MARGIN, Decision, Verdict, exceeds_profile
from .. import record
from ..worker_boot import Boot
from . import notes as boot_notes

LOG = logging.getLogger("vllm.plancache")

MIN_FREE_FRACTION = 0.02
"""The free device memory a worker that applied a plan should still have at the end of its
start-up, as a fraction of the device's total: below it the plan is *tight* (flagged in the log,
the boot record and the textfile), so an operator finds it before peak load does."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def before_vote(boot: Boot, directory: Path, decision: Decision, *, sync: bool = True) -> Decision:
    """This rank's decision once the node's notes have had their say: a plan this node holds
    back or left unfinished is profiled; else the note is written (in the plan directory, else
    its state directory; a note that cannot be written anywhere: profiled, ``local-error``),
    durably unless ``sync`` is false (then :func:`deferred_durability` makes it so)."""
    fp, digest, kv = decision.fingerprint, boot.plan_sha256, decision.kv_cache_memory_bytes
    if not decision.applied or fp is None or digest is None or kv is None:
        return decision
    memory = boot_notes.recall(directory, fp, digest)
    kept = memory.held
    if kept is not None:
        profiled = kept.get("profiled_kv_cache_memory_bytes")
        boot.held_alert = _alert(fp, digest, kv, profiled if isinstance(profiled, int) else None)
        return Decision(
            False,
            Verdict.PLAN_EXCEEDS_PROFILE,
            f"held back on this node: the plan's {kv} B exceeded this node's profile "
            f"({safe_text(profiled, 30)} B) by over {EXCEEDS_PROFILE_MARGIN:.0%}; "
            "`plancache release` clears it",
            None,
            fp,
        )
    if memory.unfinished is not None:
        boot.unfinished = (fp, digest, kv)
        return Decision(
            False,
            Verdict.UNFINISHED_BOOT,
            "an earlier boot applied this plan and never finished its start-up; profiling to "
            "compare",
            None,
            fp,
        )
    try:
        boot.note_path, boot.note_fd = boot_notes.note_applying(
            directory, fp, digest, kv, sync=sync
        )
    except PlanCacheError as exc:
        return Decision(False, Reason.LOCAL_ERROR, f"boot note not written: {exc.detail}", None, fp)
    return decision


def _alert(fp: str, digest: str, plan_kv: int, profiled_kv: int | None) -> dict[str, Any]:
    return {
        "alert": "plan-exceeds-profile",
        "fingerprint": fp,
        "plan_sha256": digest,
        "plan_kv_cache_memory_bytes": plan_kv,
        "profiled_kv_cache_memory_bytes": profiled_kv,
    }


def decision_facts(boot: Boot, decision: Decision) -> dict[str, Any]:
    """For the boot record, with the decision (one write on the boot's critical path, not two):
    how an applied plan was measured (its signed evidence, or "none"), or the alert of a plan
    this node holds back (both numbers); else nothing."""
    if decision.applied:
        return {"evidence": boot.signed_evidence or "none"}
    if decision.reason is Verdict.PLAN_EXCEEDS_PROFILE and boot.held_alert is not None:
        return {"held_back": boot.held_alert}
    return {}


NOTE_DURABILITY = "boot note"


def deferred_durability(boot: Boot) -> list[tuple[str, Callable[[], None]]]:
    """The task that makes this boot's note durable off its critical path (:mod:`..deferred`),
    or none when there is no note."""
    path, fd = boot.note_path, boot.note_fd
    if path is None or fd is None:
        return []
    return [(NOTE_DURABILITY, lambda: boot_notes.make_durable(path, fd))]


def deferred_failed(boot: Boot, failures: list[tuple[str, BaseException]]) -> None:
    """Say what the deferred writes could not do: a note not made durable is an ERROR (the boot
    goes on: a worker's death is still caught, a node reset during its start-up would not be);
    a record not written, a DEBUG line as at any other write."""
    for what, exc in failures:
        if what == NOTE_DURABILITY:
            LOG.error(
                "plancache: boot note %s not made durable: %s; a node reset before this boot's "
                "start-up ends would not be caught",
                safe_text(str(boot.note_path), 300),
                safe_text(getattr(exc, "strerror", None) or exc, 200),
            )
        else:
            LOG.debug("plancache: %s not written: %s", what, safe_text(exc, 200))


def after_vote(boot: Boot, decision: Decision) -> None:
    """A note written for a plan that the vote did not apply is removed (nothing is tried)."""
    if not decision.applied and boot.note_path is not None:
        boot_notes.finish(boot.note_path, boot.note_fd)
        boot.note_path, boot.note_fd = None, None


def finished(worker: object, boot: Boot, free_now: int | None, total: int | None) -> None:
    """The start-up ended: the note goes, and the margin left is recorded."""
    if boot.note_path is not None:
        boot_notes.finish(boot.note_path, boot.note_fd)
        boot.note_path, boot.note_fd = None, None
        margin_after_apply(worker, free_now, total)


def margin_after_apply(worker: object, free_now: int | None, total: int | None) -> None:
    """Record the free device memory left after applying; WARNING below the threshold."""
    if free_now is None:
        return
    tight = bool(total) and free_now < (total or 0) * MIN_FREE_FRACTION
    if tight:
        LOG.warning(
            "plancache: tight plan: %d B of device memory free after start-up, below %.0f%% of "
            "%d B; it may run out of memory at peak load",
            free_now,
            MIN_FREE_FRACTION * 100,
            total,
        )
    record.note_plan_facts(
        worker,
        {
            "margin": {
                "free_bytes": free_now,
                "device_total_memory": total,
                "min_free_fraction": MIN_FREE_FRACTION,
                "tight": tight,
            }
        },
    )


def compare_after_profile(worker: object, boot: Boot, directory: Path, profiled_kv: int) -> None:
    """After an ``unfinished-boot`` profile: hold the plan back if it exceeds this profile by
    more than the margin (alert in the log and the record), else clear the note so that the
    next boot applies it again (the earlier boot died of something else)."""
    if boot.unfinished is None:
        return
    fp, digest, plan_kv = boot.unfinished
    boot.unfinished = None
    alert: dict[str, Any] | None = None
    if exceeds_profile(plan_kv, profiled_kv):
        boot_notes.hold_back(directory, fp, digest, plan_kv, profiled_kv)
        alert = _alert(fp, digest, plan_kv, profiled_kv)
        LOG.warning(
            "plancache: plan %s held back on this node: its kv_cache_memory_bytes %d exceeds "
            "this boot's profile %d by over %.0f%%; `plancache release %s` clears it",
            fp,
            plan_kv,
            profiled_kv,
            EXCEEDS_PROFILE_MARGIN * 100,
            fp,
        )
    boot_notes.clear_applying(directory, fp)
    record.note_plan_facts(
        worker,
        {
            "compared": {"plan_kv_cache_memory_bytes": plan_kv, "profiled": profiled_kv},
            "held_back": alert,
        },
    )
