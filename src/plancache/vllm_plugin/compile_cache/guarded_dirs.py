"""The guard's decision on each signed cache directory, once a boot: what vLLM gets instead.

:func:`private_for` is asked by every wrapper of :mod:`.guard` (vLLM's two reads, the entries
into torch, the backend's publish) with the signed directory vLLM named; the first ask in a
boot runs :func:`plancache.pipeline.compile_cache.load.guard` (verify, pull if missing, copy
into the boot's private directory) and logs the decision, and every later ask gets the same
answer. Apart from the wrappers because it is the one part that holds the boot's decisions
(:class:`..plugin_state.Guard`) and talks to the pipeline: the wrappers only translate vLLM's
arguments into a directory and back.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ...clock import Deadline, Stopwatch
from ...trust.display import safe_text
from ...trust.errors import StoreError
from .. import plugin_state
from . import boot_headers, decisions, torch_caches
from .guard_settings import LOCK_WAIT_EXTRA, Settings, settings
from .publish import root_and_subject

if TYPE_CHECKING:
    from ...pipeline.compile_cache.local_caches import CacheOutcome
    from ...storage.store import Store

Guarded = tuple["Path | None", "CacheOutcome | None"]
"""The private directory vLLM uses instead (None: nothing can be written, vLLM reads no
cache), and the guard's outcome (None: nothing was checked)."""


def private_for(directory: Path, *, disabled: bool = False) -> Guarded:
    """The private directory vLLM must use instead of ``directory`` (guarded once a boot; the
    decision logged then), and the guard's outcome (None when nothing was checked). The
    directory is None when nothing at all can be written: vLLM must then read no cache."""
    key = os.path.abspath(directory)
    guard = plugin_state.current().guard
    with guard.lock:
        if key not in guard.guarded:
            guard.decided_at[key] = Stopwatch.started()
            try:
                guard.guarded[key] = _check(directory, disabled, len(guard.guarded))
            except Exception as exc:
                into = _empty_private(f"c{len(guard.guarded)}")
                decisions.log(
                    "compile",
                    "internal-error",
                    str(directory),
                    Stopwatch.started(),
                    detail="nothing loaded: "
                    + safe_text(
                        getattr(exc, "detail", None) or f"{type(exc).__name__}: {exc}", 200
                    ),
                )
                guard.guarded[key] = (into, None)
        return guard.guarded[key]


def was_guarded(directory: Path) -> bool:
    """Whether this boot has decided on ``directory`` already."""
    return os.path.abspath(directory) in plugin_state.current().guard.guarded


def since(directory: Path) -> float | None:
    """Milliseconds since the guard decided on ``directory`` (a compile's time runs from there
    to its publish); None if it never did."""
    started = plugin_state.current().guard.decided_at.get(os.path.abspath(directory))
    return None if started is None else started.elapsed_ms()


def _empty_private(name: str) -> Path | None:
    """A fresh empty directory for vLLM: in this process's boot directory, else its cold scratch."""
    into: Path | None
    try:
        into = torch_caches.private_dir(name)
    except StoreError:
        scratch = torch_caches.scratch_dir()
        into = scratch / name if scratch is not None else None
    try:
        if into is not None:
            into.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return None
    return into


def _check(directory: Path, disabled: bool, index: int) -> Guarded:
    from ...pipeline.compile_cache.load import guard
    from ...pipeline.resolver import utcnow

    started = Stopwatch.started()
    name = f"c{index}"
    try:
        into = torch_caches.private_dir(name)
    except StoreError as exc:  # nowhere to hand over a verified copy: vLLM compiles cold
        from ...pipeline.compile_cache.local_caches import CacheOutcome

        _, subject = root_and_subject(directory)
        cold = CacheOutcome(
            subject or str(directory),
            "compile",
            exc.reason.value,
            f"vLLM compiles cold; {exc.detail}",
        )
        decisions.log("compile", cold.reason, cold.subject, started, detail=cold.detail)
        decisions.record(
            directory, "compile", cold.reason, cold.subject, started, cold.detail, cold
        )
        return _empty_private(name), cold
    config = settings()
    root, subject = root_and_subject(directory)
    why = (
        "vllm-cache-disabled"
        if disabled
        else "unmanaged-directory"
        if subject is None
        else "no-trusted-keys"
        if config is None or (config.keyring is None and config.problem == "no trusted keys")
        else ""
    )
    if why or subject is None or config is None:
        into.mkdir(mode=0o700)
        decisions.log(
            "compile",
            why,
            subject or str(directory),
            started,
            detail="vLLM gets an empty private directory",
        )
        decisions.record(
            directory,
            "compile",
            why,
            subject or str(directory),
            started,
            "vLLM gets an empty private directory",
            None,
        )
        return into, None
    pulled: list[bool] = []
    fetch = _fetcher(config, subject, pulled) if config.url and config.keyring is not None else None
    outcome = None
    try:
        outcome = guard(
            root,
            subject,
            config.keyring,
            utcnow(),
            into,
            problem=config.problem,
            fetch=fetch,
            wait=config.timeout + LOCK_WAIT_EXTRA,
        )
    finally:
        if pulled:  # the header fetch started beside the pull: link it, or cancel it
            boot_headers.decided(
                subject,
                outcome is not None and outcome.action == "load",
                reason=getattr(outcome, "reason", "internal-error"),
                archive_sha256=getattr(outcome, "archive_sha256", None) or None,
            )
    extra = (
        f' quarantined_to="{safe_text(outcome.quarantined_to, 300)}"'
        if outcome.quarantined_to
        else ""
    )
    decisions.log(
        outcome.action,
        outcome.reason or "verified",
        subject,
        started,
        detail=outcome.detail,
        extra=extra,
    )
    decisions.record(
        directory,
        outcome.action,
        outcome.reason or "verified",
        subject,
        started,
        outcome.detail,
        outcome,
    )
    return into, outcome


def _fetcher(
    config: Settings, subject: str, pulled: list[bool]
) -> Callable[[], tuple[Store, Deadline]]:
    """Opens the store for the guard's pull and starts the header fetch on it at once, beside
    the pull (held: it links nothing before the guard's decision, :func:`boot_headers.decided`)."""

    def fetch() -> tuple[Store, Deadline]:
        from ...storage.store import open_store

        store = open_store(config.url or "", config.storage_options, timeout=config.timeout)
        deadline = Deadline.after(config.timeout, store.clock)
        pulled.append(True)
        boot_headers.start_fetch(config, subject, store, held=True)  # never raises
        return store, deadline

    return fetch
