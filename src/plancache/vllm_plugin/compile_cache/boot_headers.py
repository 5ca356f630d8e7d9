"""The precompiled headers of a boot: recorded for the build node's push, fetched for a new node.

Inductor calls ``codecache._precompile_header(header, cmd, **options)`` -> ``<dir>/<hash>.h``
before it compiles or even loads a cpp kernel, and gcc builds ``<hash>.h.gch`` there when it is
missing (149 MiB, 11-60 s). :func:`wrap` (installed by :mod:`.torch_caches` with the node's
private headers directory) makes that call:

- wait for a header fetch in flight (started as soon as the guard knew it would pull the cache,
  beside that pull, so it overlapped the pull and whatever ran after), at most until its budget
  ends; past it, the fetch is cancelled (it installs nothing any more) and torch builds the
  header as it always did;
- note, once per header, where it came from and how long torch waited for the fetch: one INFO
  line ``plancache: compile-cache header=<name> source=store|node|built waited_ms=<n>``;
- remember its name, so the build node's push ships the headers this compile used.

The fetch itself (:func:`start_fetch`) is
:func:`plancache.pipeline.compile_cache.header_shipping.pull_headers` in a daemon thread with
its own budget, separate from the cache's: a slow header never costs the node its cache. Its
outcome is one INFO line ``plancache: compile-cache headers=…``.

What a boot holds (the headers used and installed, the fetch, the early compression) is in its
state, :class:`..plugin_state.Headers`: a worker forked from the process that installed the
guard starts with none of its parent's. Where torch's headers are pinned is what the install
did (:attr:`..plugin_state.Installed.headers_at`), which the fork carries with torch's modules.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from ...clock import Stopwatch
from ...settings import HEADERS_TIMEOUT
from ...trust.display import safe_text
from .. import plugin_state
from ..prefetch import Prefetch

if TYPE_CHECKING:
    from ...pipeline.compile_cache.header_shipping import HeadersOutcome
    from ...storage.store import Store
    from ...trust.keyring.keys import Signer
    from .guard_settings import Settings

LOG = logging.getLogger("vllm.plancache")
PACK_WAIT_S = 120.0


def place(base: Path, directory: Path) -> None:
    """torch's precompiled headers are pinned in ``directory``, the node's (below ``base``)."""
    plugin_state.current().installed.headers_at = (base, directory)


def used() -> list[str]:
    """Names of the headers torch used in this process that lie in the node's headers directory."""
    headers = plugin_state.current().headers
    with headers.lock:
        return list(headers.used)


def wrap(original: Callable[..., str]) -> Callable[..., str]:
    """torch's ``_precompile_header``, waiting for a fetch first and noting each header once."""
    if plugin_state.marked(original):
        return original

    @functools.cache
    def precompile(header: str, hashable_cmd_line: str, **options: object) -> str:
        started = Stopwatch.started()
        wait()
        waited_ms = started.elapsed_ms()
        at = plugin_state.current().installed.headers_at
        folder = at[1] if at is not None else None
        if at is not None:
            _drop_unfinished(at[0], at[1])
        before = _names(folder)
        path = original(header, hashable_cmd_line, **options)
        _note(path, before, folder, waited_ms)
        return path

    plugin_state.mark(precompile)
    precompile.__wrapped__ = original
    return precompile


def _drop_unfinished(base: Path, folder: Path) -> None:
    """Before torch looks for a header: one gcc left unfinished (a build killed midway) is
    removed, so torch builds it again instead of failing every compile on it for good."""
    from ...storage.compile_cache import header_files

    try:
        fd = header_files.open_private_dir(base, folder)
    except Exception:
        return
    try:
        for name in os.listdir(fd):
            if name.endswith(".h.gch") and header_files.remove_unfinished(fd, name):
                LOG.info(
                    "plancache: compile-cache header=%s removed: gcc left it unfinished",
                    safe_text(name, 200),
                )
    except OSError:
        pass
    finally:
        os.close(fd)


def _names(folder: Path | None) -> set[str]:
    try:
        return set(os.listdir(folder)) if folder is not None else set()
    except OSError:
        return set()


def _note(path: str, before: set[str], folder: Path | None, waited_ms: float) -> None:
    base = os.path.basename(path)
    name = next(
        (base + ext for ext in (".gch", ".pch") if os.path.exists(path + ext)), base + ".gch"
    )
    if folder is None or os.path.abspath(os.path.dirname(path)) != os.path.abspath(folder):
        return
    headers = plugin_state.current().headers
    with headers.lock:
        if name in headers.used:
            return
        headers.used.append(name)
        source = "store" if name in headers.installed else "node" if name in before else "built"
    LOG.info(
        "plancache: compile-cache header=%s source=%s waited_ms=%.0f",
        safe_text(name, 200),
        source,
        waited_ms,
    )
    if source == "built":
        _pack_early()


def _pack_early() -> None:
    """On a build node (signing key and store configured), compress the headers as soon as gcc
    built one, while vLLM compiles on: at exit only the upload is left (vLLM kills a one-shot
    boot's worker 5 s after shutdown starts, before a 3.5 s compression would end)."""
    from ...clock import Deadline
    from ...pipeline.compile_cache.header_shipping import pack_headers
    from .guard_settings import signs_and_pushes

    state = plugin_state.current()
    at = state.installed.headers_at
    if at is None or not signs_and_pushes():
        return
    names = used()
    packing = Prefetch(
        "pack", Deadline.after(PACK_WAIT_S), lambda: pack_headers(at[0], at[1], names)
    )
    with state.headers.lock:
        state.headers.packing = (names, packing.start())


def start_fetch(
    config: Settings,
    subject: str,
    store: Store,
    *,
    held: bool = False,
    archive_sha256: str | None = None,
) -> None:
    """Fetch ``subject``'s headers in the background (once a boot), from ``store``: the guard's
    own, already open (a second client would make its filesystem, and its connection, again).
    ``held``: started as soon as the guard knows it pulls, alongside the cache's own pull; it
    downloads, checks and inflates meanwhile, but links nothing until the guard :func:`decided`
    (the cache was loaded, and which: only headers bound to it are linked; anything else cancels
    it). Not held: ``archive_sha256`` names the cache already loaded."""
    from ...clock import Deadline
    from ...pipeline.compile_cache.header_shipping import Cancel, HeadersOutcome, pull_headers
    from ...pipeline.resolver import utcnow

    state = plugin_state.current()
    at, keyring = state.installed.headers_at, config.keyring
    if at is None or not config.url or keyring is None:
        return
    deadline = Deadline.after(max(config.timeout, HEADERS_TIMEOUT))
    cancel = Cancel(held=held)

    def task() -> HeadersOutcome:
        started = Stopwatch.started()
        try:
            outcome = pull_headers(
                store,
                subject,
                keyring,
                utcnow(),
                at[0],
                at[1],
                cache_archive_sha256=archive_sha256,
                deadline=deadline,
                cancel=cancel,
                owner=state.place.temp_owner,
            )
        except Exception as exc:
            outcome = HeadersOutcome(
                "failed", "store-error", safe_text(getattr(exc, "detail", exc), 200)
            )
        with state.headers.lock:
            state.headers.installed.update(outcome.installed)
        LOG.info(
            'plancache: compile-cache %s cache=%s elapsed_ms=%.0f detail="%s"',
            outcome.line(),
            safe_text(subject, 200),
            started.elapsed_ms(),
            safe_text(outcome.detail, 300),
        )
        return outcome

    with state.headers.lock:
        if state.headers.fetch is not None:
            return
        try:
            state.headers.fetch = (Prefetch(subject, deadline, task).start(), cancel)
        except Exception:
            LOG.debug("plancache: header fetch not started", exc_info=True)


def decided(
    subject: str, loaded: bool, *, reason: str = "", archive_sha256: str | None = None
) -> None:
    """The guard's decision on the cache whose pull a held fetch runs beside: loaded, the fetch
    may link what it verified if its statement binds ``archive_sha256``, the loaded cache's
    verified manifest's (None, unknown: it links nothing, ``statement-mismatch``); anything
    else (refused, missing, a store error, a timeout) and it is cancelled, installing nothing,
    and torch no longer waits for it (SECURITY.md: a store's header is installed only beside a
    cache this boot loaded from that store)."""
    from ...pipeline.compile_cache.header_shipping import HeadersOutcome

    headers = plugin_state.current().headers
    with headers.lock:
        pending = headers.fetch
        if pending is None or pending[0].key != subject:
            return
        if not loaded:
            headers.fetch = None
    if loaded:
        pending[1].release(archive_sha256)
    else:
        pending[1].set(
            HeadersOutcome(
                "cancelled",
                reason or "not-loaded",
                f"the cache was not loaded ({reason or 'no decision'}): no header installed",
            )
        )


def wait() -> None:
    """Before torch looks for a header: the fetch in flight finishes, or its budget ends. Every
    thread that asks meanwhile waits for the same fetch (inductor compiles on a thread pool; one
    that went ahead would have gcc build the header the fetch is about to install)."""
    headers = plugin_state.current().headers
    with headers.lock:
        pending = headers.fetch
    if pending is None:
        return
    fetch, cancel = pending
    try:
        finished, _ = fetch.result()
    except Exception:
        finished = True
    with headers.lock:
        first = headers.fetch is pending
        if first:
            headers.fetch = None
    if not finished:
        cancel.set()
        if first:
            LOG.info(
                "plancache: compile-cache headers=failed reason=timeout cache=%s elapsed_ms=%.0f "
                'detail="no header within the %.0f s budget: torch builds it"',
                safe_text(fetch.key, 200),
                fetch.took_ms(),
                fetch.deadline.budget,
            )


def push(
    store: Store,
    subject: str,
    signer: Signer,
    expires_in: timedelta | None,
    archive_sha256: str,
) -> HeadersOutcome:
    """The build node's push of the headers this process used (after the cache's own push),
    bound to that cache's signature (``archive_sha256``, its manifest's)."""
    from ...pipeline.compile_cache.header_shipping import HeadersOutcome, push_headers
    from ...pipeline.resolver import utcnow

    state = plugin_state.current()
    at, names, packed = state.installed.headers_at, used(), None
    if at is None:
        return HeadersOutcome("none", detail="no private headers directory")
    with state.headers.lock:
        packing = state.headers.packing
    if packing is not None and packing[0] == names:
        finished, packed = packing[1].result()
        packed = packed if finished else None
    return push_headers(
        store,
        subject,
        at[0],
        at[1],
        names,
        signer,
        utcnow(),
        cache_archive_sha256=archive_sha256,
        expires_in=expires_in,
        packed=packed,
    )
