"""The guard's decisions, told: one INFO line each, and the boot's record.

Each decision the guard takes on a cache directory is one line
``plancache: compile-cache decision=load|compile|quarantined reason=… cache=… elapsed_ms=…``
(what operators grep and alert on, listed in docs/compile-cache.md) and one entry in this
boot's record (:mod:`plancache.vllm_plugin.record`: with the verified manifest's factors and
build time, for ``plancache explain``). Diagnostics only: nothing here changes a decision, and
a failure here is a DEBUG line, never an error in vLLM's load.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ...clock import Stopwatch
from ...trust.display import safe_text
from .. import plugin_state

if TYPE_CHECKING:
    from ...pipeline.compile_cache.local_caches import CacheOutcome

LOG = logging.getLogger("vllm.plancache")


def log(
    action: str, reason: str, cache: str, started: Stopwatch, *, detail: str = "", extra: str = ""
) -> None:
    LOG.info(
        'plancache: compile-cache decision=%s reason=%s cache=%s elapsed_ms=%.0f%s detail="%s"',
        action,
        reason,
        safe_text(cache, 200),
        started.elapsed_ms(),
        extra,
        safe_text(detail, 300),
    )


def rank_of(directory: Path) -> int:
    """The rank this process serves (``RANK``/``LOCAL_RANK`` as launchers set them), else 0: the
    record's name only; a worker's plan side names the record by its own rank first."""
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def record(
    directory: Path,
    action: str,
    reason: str,
    cache: str,
    started: Stopwatch,
    detail: str,
    outcome: CacheOutcome | None,
) -> None:
    """The decision into this boot's record (with the verified manifest's factors, build time
    and signers)."""
    try:
        from .. import record

        measured = getattr(outcome, "measurements", None) or {}
        record.note_compile(
            rank_of(directory),
            {
                "cache": cache,
                "decision": action,
                "reason": reason,
                "detail": safe_text(detail, 300),
                # who signed the verified manifest (a keyless signer by identity and issuer)
                "signed_by": list(getattr(outcome, "signed_by", ()) or ()),
            },
            started.elapsed_ms(),
            getattr(outcome, "key_factors", None),
            compile_ms=measured.get("compile_ms"),
        )
        finish_with_warm_up()
    except Exception:
        LOG.debug("plancache: boot record not updated", exc_info=True)


def finish_with_warm_up() -> None:
    """Without the plan side (no ``VLLM_ENABLE_STARTUP_PLAN``) nothing hooks the worker class:
    wrap its ``compile_or_warm_up_model`` now (the worker module is imported by the time vLLM
    reads a compile cache), so the boot record is made final and logged when the boot is over."""
    from .. import hooks

    state = plugin_state.current()
    with state.lock:
        for module_name, class_name in plugin_state.WORKER_MODULES.items():
            cls = getattr(sys.modules.get(module_name), class_name, None)
            stack = [cls] if isinstance(cls, type) else []
            while stack:  # the worker class and the subclasses imported by now (vLLM's CPUWorker)
                current = stack.pop()
                stack.extend(current.__subclasses__())
                if "compile_or_warm_up_model" in vars(current):
                    hooks.hook_warm_up(current, state.installed.warm_up_patches)


def note_factors(local_cache_dir: str | None) -> None:
    """What vLLM wrote to ``cache_key_factors.json`` for the graph it just compiled: signed with
    an AOT cache (which holds none itself), compared with a verified cache that went unused."""
    try:
        from ...pipeline.compile_cache.manifest_building import (
            FACTORS_FILE,
            MAX_FACTORS_BYTES,
            factors_of,
        )
        from ...storage.local.files import read_capped
        from .. import record

        if local_cache_dir:
            record.note_factors(
                factors_of(read_capped(Path(local_cache_dir) / FACTORS_FILE, MAX_FACTORS_BYTES))
            )
    except Exception:
        LOG.debug("plancache: cache-key factors not read", exc_info=True)
