"""``file://`` as a :class:`~..backend.Backend`: a directory read and written without fsspec.

A plan directory is hostile like any store: a FIFO planted at a plan's name would block an
``open`` for ever, a link could point anywhere. So an object is read by
:func:`.files.read_capped` (non-blocking, no final symlink, a regular file only, at most
``cap + 1`` bytes), written by :func:`.files.write_atomic` (a temporary file renamed over the
name: a FIFO there is replaced, never opened), and listed by :func:`..listing.local_entries`
(regular files only, at most the listing cap). What is left (a delete, a directory walk, a
look at the directory itself) goes through fsspec's ``LocalFileSystem`` in daemon threads.
"""

from __future__ import annotations

from pathlib import Path

from ..fsspec_backends import FsspecBackend
from ..listing import MAX_NAMES, Page, local_entries
from ..threads import in_thread
from .files import read_capped, write_atomic


class LocalBackend(FsspecBackend):
    """A local directory tree (``fs``: fsspec's ``LocalFileSystem``, for what is left)."""

    async def read(self, path: str, cap: int) -> bytes | None:
        return await in_thread(read_capped, Path(path), cap)

    async def list_page(self, under: str, token: str | None) -> Page:
        return Page(await in_thread(local_entries, under, MAX_NAMES + 1), None)

    async def write(self, path: str, data: bytes) -> None:
        await in_thread(write_atomic, Path(path), data)
