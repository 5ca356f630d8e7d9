"""Any fsspec filesystem as a :class:`~.backend.Backend`, and ``memory://``.

:class:`FsspecBackend` is every store reached through an fsspec filesystem: an async one's
coroutines run on its own loop (``fs.loop``), a blocking one's calls in daemon threads
(:mod:`.threads`) driven from fsspec's IO loop. The schemes whose SDK needs more than fsspec's
whole-object calls subclass it (:mod:`.s3.s3_backend`, :mod:`.gcs.gcs_backend`,
:mod:`.azure.azure_backend`); ``file://`` is read without fsspec (:mod:`.local.local_backend`).

Reads here are ``cat_file`` of ``cap + 1`` bytes with the SDK's whole-body reads capped
(:func:`.caps.http.body_cap`); a listing is one ``ls`` of the store's prefix (a backend that is
not :attr:`~.backend.Backend.paged` lists its prefix in one page). fsspec ships no types, so a
filesystem is ``Any`` here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .listing import MAX_NAMES, Page, fsspec_entries
from .threads import in_thread
from .versioned import Versioned

if TYPE_CHECKING:  # asyncio: never imported by a boot's blocking read
    import asyncio

    from .s3.direct import S3Direct

CONCURRENCY = 64
"""Requests in flight per operation on an async backend; also the connection pool size
plancache asks its SDKs for."""

SYNC_CONCURRENCY = 8
"""Threads in flight per operation on a backend without an async implementation."""


class FsspecBackend:
    """One fsspec filesystem, made by ``opener`` (now, or at :meth:`open`); ``scheme`` names
    it in messages."""

    preconditions = False
    paged = False
    subject: str | None = None

    def __init__(
        self,
        scheme: str,
        *,
        opener: Callable[[], Any] | None = None,
        fs: Any = None,
        asynchronous: bool | None = None,
    ) -> None:
        self._scheme = scheme
        self._opener = opener
        self._fs = fs
        self._asynchronous = asynchronous

    @property
    def scheme(self) -> str:
        return self._scheme

    @property
    def fs(self) -> Any:
        """The fsspec filesystem (made by :meth:`open`).

        Raises:
            RuntimeError: the backend is not open yet (the store opens it before any call).
        """
        if self._fs is None:
            raise RuntimeError(f"the {self._scheme} backend is not open")
        return self._fs

    @property
    def direct(self) -> S3Direct | None:
        """No reads before :meth:`open` (but on S3: :mod:`.s3.s3_backend`)."""
        return None

    @property
    def opened(self) -> bool:
        return self._fs is not None

    def open(self) -> None:
        if self._fs is None:
            assert self._opener is not None
            self._fs = self._opener()

    @property
    def asynchronous(self) -> bool:
        """Whether the filesystem has an async implementation (its calls are awaited on its
        loop, not run in threads); known before the filesystem is made where the scheme says
        it."""
        if self._asynchronous is None:
            return bool(getattr(self.fs, "async_impl", False))
        return self._asynchronous

    @property
    def concurrency(self) -> int:
        return CONCURRENCY if self.asynchronous else SYNC_CONCURRENCY

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self.asynchronous:
            loop: asyncio.AbstractEventLoop = self.fs.loop
            return loop
        from fsspec.asyn import get_loop

        return get_loop()

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``fs._name(...)`` on an async filesystem, ``fs.name(...)`` in a daemon thread
        otherwise."""
        if self.asynchronous:
            return await getattr(self.fs, f"_{name}")(*args, **kwargs)
        return await in_thread(getattr(self.fs, name), *args, **kwargs)

    def served_from(self) -> list[tuple[str, str]]:
        return []

    # -- the protocol ----------------------------------------------------------------------------

    async def read(self, path: str, cap: int) -> bytes | None:
        from .caps.http import body_cap

        try:
            with body_cap(cap + 1):
                return bytes(await self.call("cat_file", path, start=0, end=cap + 1))
        except FileNotFoundError:
            return None

    async def list_page(self, under: str, token: str | None) -> Page:
        listed = await self.call("ls", under, detail=True)
        prefix = f"{under}/" if under not in ("", "/") else f"{under.rstrip('/')}/"
        return Page(fsspec_entries(self.fs, prefix, listed, MAX_NAMES + 1), None)

    async def list_dir(self, path: str) -> list[tuple[str, bool]]:
        listed = await self.call("ls", path, detail=True)
        entries = []
        for entry in listed if isinstance(listed, list) else []:
            if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
                full = self.fs._strip_protocol(entry["name"]).rstrip("/")
                entries.append((full, entry.get("type") == "directory"))
        return entries

    async def info(self, path: str) -> Mapping[str, Any]:
        found: Mapping[str, Any] = await self.call("info", path)
        return found

    async def read_versioned(self, path: str, cap: int) -> Versioned:
        """Not offered (:attr:`preconditions` is False).

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError(f"{self._scheme}:// states no versions")

    async def delete_if_unchanged(self, path: str, token: str) -> None:
        """Not offered (:attr:`preconditions` is False).

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError(f"{self._scheme}:// offers no conditional delete")

    async def write(self, path: str, data: bytes) -> None:
        parent = path.rpartition("/")[0]
        if parent and not self.asynchronous:
            await self.call("makedirs", parent, exist_ok=True)  # a directory tree needs it made
        await self.call("pipe_file", path, data)

    async def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            await self.call("rm_file", path)


class MemoryBackend(FsspecBackend):
    """``memory://``: fsspec's in-process filesystem (tests, one process's scratch store),
    blocking, so its calls run in daemon threads like any blocking filesystem's."""
