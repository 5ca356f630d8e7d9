"""``file://`` as a :class:`~..backend.Backend`: a directory read and written without fsspec.

A plan directory is hostile like any store: a FIFO planted at a plan's name would block an
``open`` for ever, a link could point anywhere. So an object is read by
:func:`.files.read_capped` (non-blocking, no final symlink, a regular file only, at most
``cap + 1`` bytes), written by :func:`.files.write_atomic` (a temporary file renamed over the
name: a FIFO there is replaced, never opened), and listed by :func:`..listing.local_entries`
(regular files only, at most the listing cap); a folder (a compile-cache folder, a level of the
deeper-prefix walk) by :func:`folder_entries`, at most
:data:`~..listing.MAX_FOLDER_ENTRIES` entries. What is left (a delete, a look at the directory
itself) goes through fsspec's ``LocalFileSystem`` in daemon threads.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...trust.errors import Reason, Rejected
from ..fsspec_backends import FsspecBackend
from ..listing import MAX_FOLDER_ENTRIES, MAX_NAMES, Page, local_entries
from ..threads import in_thread
from .files import read_capped, write_atomic


class LocalBackend(FsspecBackend):
    """A local directory tree (``fs``: fsspec's ``LocalFileSystem``, for what is left)."""

    async def read(self, path: str, cap: int) -> bytes | None:
        return await in_thread(read_capped, Path(path), cap)

    async def list_page(self, under: str, token: str | None) -> Page:
        return Page(await in_thread(local_entries, under, MAX_NAMES + 1), None)

    async def list_dir(self, path: str) -> list[tuple[str, bool]]:
        return await in_thread(folder_entries, path, MAX_FOLDER_ENTRIES)

    async def write(self, path: str, data: bytes) -> None:
        await in_thread(write_atomic, Path(path), data)


def folder_entries(path: str, limit: int) -> list[tuple[str, bool]]:
    """(path, is a directory) of each entry directly in ``path``, scanned one at a time, nothing
    opened: fsspec's ``ls`` stats every entry into one list first (300,000 planted names:
    320 MiB), and a store directory may be writable by others.

    Raises:
        FileNotFoundError: ``path`` is absent or not a directory.
        Rejected: more than ``limit`` entries (reason ``too-large``).
    """
    base = path.rstrip("/") or "/"
    found: list[tuple[str, bool]] = []
    try:
        with os.scandir(base) as scan:
            for entry in scan:
                if len(found) >= limit:
                    raise Rejected(Reason.TOO_LARGE, f"{base} holds more than {limit} entries")
                found.append((os.path.join(base, entry.name), entry.is_dir()))
    except NotADirectoryError:
        raise FileNotFoundError(path) from None
    return found
