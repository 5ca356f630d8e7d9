"""A build node's side of the guard: publish, sign and push what vLLM compiled.

vLLM compiles into the boot's private copy (the guard gave it an empty one); with
``PLANCACHE_SIGNING_KEY`` set, :func:`publish` puts that copy into place, signs it (with an
expiry when ``PLANCACHE_COMPILE_CACHE_EXPIRES_IN`` says so, same syntax as ``--expires-in``) and,
with ``PLANCACHE_URL``, pushes it in the background; the interpreter waits for the push at exit.
Sign and push are each one INFO line naming what was signed or pushed.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from ...clock import Stopwatch
from ...trust.display import safe_text
from ...trust.errors import Reason
from .. import plugin_state
from .guard_settings import EXPIRES_ENV, LOCK_WAIT_EXTRA, Settings, settings, signer

if TYPE_CHECKING:
    from ...pipeline.compile_cache.local_caches import CacheRoot
    from ...storage.store import Store
    from ...trust.keyring.keys import Signer

LOG = logging.getLogger("vllm.plancache")


def root_and_subject(directory: Path) -> tuple[CacheRoot, str | None]:
    """vLLM's cache root above a cache directory, and the directory's subject (None: not under
    it)."""
    from ...pipeline.compile_cache.local_caches import CacheRoot

    parts = directory.parts
    base = Path(*parts[: -3 if directory.parent.name == "torch_aot_compile" else -2])
    root = CacheRoot(base)
    return root, root.subject_of(directory)


def publish(directory: Path, private: Path, compile_ms: float | None = None) -> None:
    """After vLLM saved a new cache into ``private`` (standing for ``directory``): sign it as it
    is there (with vLLM's cache-key factors and the compile's time, when known), put exactly
    those bytes in place, then push it in the background. Never raises."""
    config, key = settings(), signer()
    if config is None or key is None:
        return
    from ...pipeline.compile_cache.flows import publish_cache
    from ...pipeline.resolver import utcnow

    root, subject = root_and_subject(directory)
    if subject is None:
        return
    try:
        from .. import record

        # Both layouts: the factors the guard read from vLLM's cache_key_factors.json right after
        # VllmBackend returned (record.last_factors). That debug file lies in the shared directory,
        # never in the private copy signed here, so build_manifest cannot find it; one read also
        # keeps the signed factors equal to the boot record's (they are diagnostics, not trust).
        factors = record.last_factors()
        measured = {"compile_ms": round(compile_ms, 1)} if compile_ms is not None else None
        outcome = publish_cache(
            root,
            subject,
            private,
            key,
            utcnow(),
            expires_in=config.expires_in,
            key_factors=factors,
            measurements=measured,
            wait=config.timeout + LOCK_WAIT_EXTRA,
        )
    except Exception as exc:
        LOG.warning(
            "plancache: compile cache %s not signed: %s",
            subject,
            safe_text(getattr(exc, "detail", exc), 300),
        )
        return
    if outcome.action != "signed":
        LOG.warning(
            "plancache: compile cache %s not signed: %s", subject, safe_text(outcome.detail, 300)
        )
        return
    expiry = f" expires_in={os.environ.get(EXPIRES_ENV, '').strip()}" if config.expires_in else ""
    LOG.info(
        "plancache: compile-cache signed cache=%s files=%d bytes=%d%s",
        subject,
        outcome.files,
        outcome.size,
        expiry,
    )
    if config.url:
        _push_in_background(config, root, subject, key)


def _push_in_background(config: Settings, root: CacheRoot, subject: str, key: Signer) -> None:
    def push() -> None:
        from ...pipeline.compile_cache.flows import push_cache
        from ...pipeline.resolver import utcnow
        from ...settings import BULK_TIMEOUT
        from ...storage.oci.registry_urls import write_options
        from ...storage.store import open_store
        from ...trust.keyring.keys import signer_keyring
        from ..prefetch import off_compute_cores

        off_compute_cores()
        started = Stopwatch.started()
        try:  # an archive of tens to hundreds of MiB: the bulk deadline, not the boot's
            url = config.url or ""
            store = open_store(  # a push: nothing read through a registry's mirror
                url,
                write_options(url, config.storage_options),
                timeout=max(config.timeout, BULK_TIMEOUT),
            )
            outcome = push_cache(
                store, root, subject, signer_keyring(key), utcnow(), wait=store.timeout
            )
            LOG.info(
                'plancache: compile-cache pushed cache=%s url=%s detail="%s" elapsed_ms=%.0f',
                subject,
                safe_text(config.url, 200),
                safe_text(outcome.detail, 200),
                started.elapsed_ms(),
            )
        except Exception as exc:
            if not _refused_private(exc, subject, "cache"):
                LOG.warning(
                    "plancache: push of compile cache %s failed: %s",
                    subject,
                    safe_text(getattr(exc, "detail", exc), 300),
                )
            return
        _push_headers(store, subject, key, config, outcome.archive_sha256)

    thread = threading.Thread(target=push, name="plancache-compile-push", daemon=True)
    guard = plugin_state.current().guard
    with guard.pushes_lock:
        if not guard.pushes:
            # threading's exit hooks run in reverse order of registration, before the executors
            # the store's IO runs on refuse new work ("cannot schedule new futures after
            # shutdown"); a plain atexit hook would run too late.
            at_exit = getattr(threading, "_register_atexit", atexit.register)
            at_exit(_finish_pushes, guard.pushes)
        guard.pushes.append(thread)
    thread.start()


def _push_headers(
    store: Store, subject: str, key: Signer, config: Settings, archive_sha256: str
) -> None:
    """After the cache: the precompiled headers its compile used, so a new node need not build
    them, bound to the cache just pushed (``archive_sha256``: a node installs them beside that
    one only)."""
    from . import boot_headers

    started = Stopwatch.started()
    try:
        outcome = boot_headers.push(store, subject, key, config.expires_in, archive_sha256)
    except Exception as exc:
        if _refused_private(exc, subject, "headers"):
            return
        LOG.warning(
            "plancache: push of the precompiled headers of %s failed: %s",
            subject,
            safe_text(getattr(exc, "detail", exc), 300),
        )
        return
    LOG.info(
        'plancache: compile-cache pushed %s cache=%s elapsed_ms=%.0f detail="%s"',
        outcome.line(),
        subject,
        started.elapsed_ms(),
        safe_text(outcome.detail, 200),
    )


def _refused_private(exc: Exception, subject: str, what: str) -> bool:
    """A push refused because it carries something private (``private-data``): one WARNING line
    ``plancache: compile-cache not-pushed what=cache|headers cache=… reason=private-data
    detail="…"`` naming the variable and file (never the value), what operators grep for."""
    if getattr(exc, "reason", None) is not Reason.PRIVATE_DATA:
        return False
    LOG.warning(
        'plancache: compile-cache not-pushed what=%s cache=%s reason=private-data detail="%s"',
        what,
        subject,
        safe_text(getattr(exc, "detail", ""), 600),
    )
    return True


def _finish_pushes(pushes: list[threading.Thread]) -> None:
    """At interpreter exit, let the pushes a boot started finish (each is bounded by its store
    deadline). A daemon thread alone would die with a short-lived process, and a one-shot
    warm-up boot, whose whole point is to fill the store, would push nothing."""
    for thread in list(pushes):
        thread.join()
