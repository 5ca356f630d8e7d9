"""Which mirrors this process has read through, for the output to name (``via mirror HOST``).

A mirror serves what the registry served, or says it did: an operator reading a report must
know that the bytes came from ``mirror.internal`` (configured in ``/etc/containerd/certs.d``),
not from the registry the store URL names. :class:`..registry_http.RegistryClient` notes each
mirror that answered a request; the CLI forgets them when a command starts and names them in
its human and JSON output (``via_mirror``) when it ends. Process-wide on purpose: every command
and every store of it is covered in one place, and a mirror is named only if it was read. Each
note also says which store (``HOST/REPOSITORY`` of the registry) the mirror served, so that a
process that never forgets (the plugin's) names for its plan only the mirror of the plan's
store, not one a compile cache was read through.
"""

from __future__ import annotations

import threading

from ....trust.errors import PlanCacheError

_READ: dict[tuple[str, str], str] = {}
_LOCK = threading.Lock()
MAX_NOTED = 16
"""More mirrors than one command ever reads through (one per store opened)."""


def note(authority: str, configured_in: str, serving: str = "") -> None:
    """The mirror at ``authority`` (configured in ``configured_in``) answered a request for
    the store ``serving`` (the registry's ``HOST/REPOSITORY``)."""
    with _LOCK:
        if (authority, serving) in _READ or len(_READ) < MAX_NOTED:
            _READ[(authority, serving)] = configured_in


def mirrors_read(serving: str | None = None) -> list[tuple[str, str]]:
    """(mirror authority, what configured it) of every mirror read since :func:`forget`, or
    only of those read for the store ``serving``."""
    with _LOCK:
        return sorted(
            {(host, where) for (host, store), where in _READ.items() if serving in (None, store)}
        )


def forget() -> None:
    with _LOCK:
        _READ.clear()


def store_key(url: str | None) -> str:
    """What notes of reads for the store at ``url`` are kept under (``HOST/REPOSITORY``, as
    :class:`..access.registry_session.RegistrySession` notes them); ``""``, which no note has,
    for a store that is not a registry."""
    from ..registry_urls import is_registry_url, parse_store_url

    if url is None or not is_registry_url(url):
        return ""
    try:
        registry, repository = parse_store_url(url)
    except PlanCacheError:
        return ""
    return f"{registry.authority}/{repository}"
