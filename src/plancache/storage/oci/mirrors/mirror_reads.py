"""Which mirrors this process has read through, for the output to name (``via mirror HOST``).

A mirror serves what the registry served, or says it did: an operator reading a report must
know that the bytes came from ``mirror.internal`` (configured in ``/etc/containerd/certs.d``),
not from the registry the store URL names. :class:`..registry_http.RegistryClient` notes each
mirror that answered a request; the CLI forgets them when a command starts and names them in
its human and JSON output (``via_mirror``) when it ends. Process-wide on purpose: every command
and every store of it is covered in one place, and a mirror is named only if it was read.
"""

from __future__ import annotations

import threading

_READ: dict[str, str] = {}
_LOCK = threading.Lock()
MAX_NOTED = 16
"""More mirrors than one command ever reads through (one per store opened)."""


def note(authority: str, configured_in: str) -> None:
    """The mirror at ``authority`` (configured in ``configured_in``) answered a request."""
    with _LOCK:
        if authority in _READ or len(_READ) < MAX_NOTED:
            _READ[authority] = configured_in


def mirrors_read() -> list[tuple[str, str]]:
    """(mirror authority, what configured it) of every mirror read since :func:`forget`."""
    with _LOCK:
        return sorted(_READ.items())


def forget() -> None:
    with _LOCK:
        _READ.clear()
