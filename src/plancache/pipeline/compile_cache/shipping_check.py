"""The last check before a compile cache or its headers leave the node: nothing private in them.

Every file of the archive about to be pushed (the exact bytes, read back from the tar), and every
precompiled header of the headers' object (inflated), is searched
(:func:`plancache.trust.compile_cache.private_data.scan`) for torch's environment and config
snapshots with a private value, for this node's private environment values anywhere, and for its
home directory, user and host names outside the cache root. One finding refuses the push
(``private-data``) before any byte is uploaded, naming the variable and the file, never the
value. Nothing is scrubbed: the hits lie in pickles and shared objects, and an edited pickle is
not provably what torch would load.

The push runs on the node that compiled (the plugin's background push, or ``compile-cache push``
there), so this process's environment is the build's; a push from elsewhere still finds torch's
snapshots, judged on their own.
"""

from __future__ import annotations

import os
import pwd
import socket
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from ...storage.compile_cache.archive_format import archive_members
from ...trust.compile_cache.private_data import (
    MAX_FINDINGS,
    Finding,
    NodeSecrets,
    node_secrets,
    refusal,
    scan,
)
from ...trust.errors import Reason, Rejected

MAX_INFLATED = 4 << 30
"""A gzip member of a cache is inflated for the search up to this many bytes (more: refused, as
what cannot be searched cannot be vouched for)."""


def this_node(allowed: Iterable[Path]) -> NodeSecrets:
    """This process's environment, home, user and host, with ``allowed`` paths (the cache root,
    as given and resolved) shipping by design."""
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a passwd entry (containers): the environment's word
        user = os.environ.get("USER") or os.environ.get("LOGNAME") or ""
    paths = {str(p) for p in allowed} | {os.path.realpath(p) for p in allowed}
    return node_secrets(
        dict(os.environ),
        home=os.environ.get("HOME", ""),
        user=user,
        host=socket.gethostname(),
        allowed=paths,
    )


def _inflated(data: bytes) -> bytes | None:
    """A gzip file's content, every member of it (``gzip.open`` reads on past the first, so
    a second member would ship unsearched), bounded in all; None when it is not gzip."""
    if data[:2] != b"\x1f\x8b":
        return None
    parts: list[bytes] = []
    rest, left = data, MAX_INFLATED
    while rest[:2] == b"\x1f\x8b":
        inflater = zlib.decompressobj(31)
        try:
            parts.append(inflater.decompress(rest, left))
        except zlib.error:
            break
        if inflater.unconsumed_tail:
            raise Rejected(
                Reason.PRIVATE_DATA, f"not pushed: a gzip file inflates past {MAX_INFLATED} bytes"
            )
        left -= len(parts[-1])
        rest = inflater.unused_data
    return b"".join(parts) if parts else None


def _files(members: Iterable[tuple[str, bytes]]) -> Iterator[tuple[str, bytes]]:
    for name, data in members:
        yield name, data
        inflated = _inflated(data)
        if inflated is not None:
            yield f"{name} (inflated)", inflated


def check_files(members: Iterable[tuple[str, bytes]], secrets: NodeSecrets) -> None:
    """Raises if any of the named files carries something private.

    Raises:
        Rejected: reason ``private-data``; the detail names each variable (or ``$HOME``, ``user
            name``, ``host name``) and its file, never a value.
    """
    findings: list[Finding] = []
    for name, data in _files(members):
        findings += scan(name, data, secrets)
        if len(findings) >= MAX_FINDINGS:
            break
    if findings:
        raise Rejected(Reason.PRIVATE_DATA, refusal(findings))


def check_archive(data: bytes, secrets: NodeSecrets) -> None:
    """:func:`check_files` over every member of a cache's archive (the bytes to be pushed).

    Raises:
        Rejected: reason ``private-data``, as :func:`check_files`.
    """
    check_files(archive_members(data), secrets)


def check_headers(
    data: bytes, names_sizes: Iterable[tuple[str, int]], secrets: NodeSecrets
) -> None:
    """:func:`check_files` over the headers of one gzip stream (as
    :func:`plancache.storage.compile_cache.header_files.compress` wrote it), split at their
    sizes.

    Raises:
        Rejected: reason ``private-data``: a header carries something private, or the stream
            does not inflate to the headers' sizes (what cannot be searched is not pushed).
    """
    entries = list(names_sizes)
    total = sum(size for _, size in entries)
    inflater = zlib.decompressobj(31)
    plain = inflater.decompress(data, total + 1)
    if len(plain) != total:
        raise Rejected(Reason.PRIVATE_DATA, "not pushed: the headers' stream cannot be searched")
    view = memoryview(plain)
    files, offset = [], 0
    for name, size in entries:
        files.append((name, bytes(view[offset : offset + size])))
        offset += size
    check_files(files, secrets)
