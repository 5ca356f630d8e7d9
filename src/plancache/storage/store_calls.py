"""What every operation on a store goes through: its filesystem, its event loop, its batches.

:class:`~.store.Store` is a store's plan layout (plans and sidecars: list, fetch, put, delete).
This module is what that layout shares with every other module that moves a store's bytes
(:mod:`.capped_reads`, :mod:`.plan_set_objects`, :mod:`.checks`, :mod:`.conditional_deletes`,
:mod:`.compile_cache.archives`), and the split is drawn there: those modules reach a store
through these calls, whatever objects they move. Each call is bounded:

* the filesystem is made at most once, in a daemon thread, waited for within a budget (a GCS
  filesystem discovers credentials in its constructor);
* a coroutine runs on the filesystem's event loop until a deadline (:func:`.deadline.run_by`),
  and a synchronous filesystem's calls run in daemon threads (:mod:`.threads`);
* many keys at once go through :func:`each`: at most a store's concurrency in flight, and one
  key's failure never stops the others.

fsspec ships no types and plancache calls its filesystems' methods by name
(:meth:`StoreCalls._call`), so a filesystem is ``Any`` here; the backends' own modules type
what they call on theirs (:mod:`.s3.reads`, :mod:`.gcs.pages`, :mod:`.azure.blob`).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..clock import REAL_CLOCK, Clock, Deadline
from ..trust.errors import PlanCacheError
from .backends import CONCURRENCY, kind_of, list_page
from .deadline import run_by, store_error, with_retries
from .listing import Page
from .threads import Pending, in_thread, use_daemon_executor

if TYPE_CHECKING:
    from .s3.direct import S3Direct

T = TypeVar("T")

SYNC_CONCURRENCY = 8
"""Threads in flight for filesystems without an async implementation."""


async def each(
    keys: Sequence[str],
    action: Callable[[str], Awaitable[T]],
    what: str,
    limit: int,
    on_done: Callable[[int], None] | None,
    results: dict[str, T | PlanCacheError],
) -> None:
    """``action`` on every key, at most ``limit`` at once; each key's result or typed error.

    Actions retry on their own (:func:`~plancache.storage.deadline.with_retries`); a key's
    failure never stops the others. ``results`` fills in as keys finish, so a caller cancelled
    at its deadline still has the ones that did.
    """
    import asyncio  # here, not at import: a boot's blocking read never loads it

    gate = asyncio.Semaphore(limit)

    async def one(key: str) -> None:
        async with gate:
            try:
                results[key] = await action(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                results[key] = store_error(f"cannot {what} {key}", exc)
        if on_done:
            on_done(1)

    await asyncio.gather(*(one(k) for k in keys))


class StoreCalls:
    """One prefix of an fsspec filesystem, and the bounded calls made on it (see the module).

    The constructor's parameters are :class:`~.store.Store`'s, which documents them and keeps
    their positions (the public API's).
    """

    def __init__(
        self,
        fs: Any,
        url: str,
        root: str,
        *,
        timeout: float,
        opener: Callable[[], Any] | None,
        kind: str | None,
        direct: S3Direct | None,
    ) -> None:
        self._fs = fs
        self._direct = direct
        self._opener = opener
        self._opening: Pending[Any] | None = None
        self._lock = threading.Lock()
        self.url = url
        self.root = root
        self.timeout = timeout
        self.kind = kind or kind_of(type(fs))
        self._async = self.kind in ("s3", "gcs", "azure", "async", "oci")
        self._first_deadline: Deadline | None = None
        """The deadline :func:`~.store.open_store` waited for: an operation without a deadline of
        its own that starts before it ends by it (the open and that operation share one budget)."""
        self.clock: Clock = REAL_CLOCK
        """What an operation without a deadline of its own measures its budget by: the clock of
        the deadline the store was opened by."""

    @property
    def fs(self) -> Any:
        """The fsspec filesystem, made now, within one budget, if it is not made yet."""
        return self._filesystem(Deadline.after(self.timeout, self.clock))

    def _filesystem(self, deadline: Deadline) -> Any:
        """The filesystem, made at most once, in a daemon thread, waited for until ``deadline``."""
        if self._fs is None:
            with self._lock:
                if self._opening is None:
                    self._opening = Pending(self._open, f"plancache-open-{self.kind}")
            self._fs = self._opening.result(deadline, f"cannot open {self.url}", self.timeout)
        return self._fs

    def _open(self) -> Any:
        assert self._opener is not None
        fs = self._opener()
        credentials = getattr(fs, "credentials", None)
        if credentials is not None and hasattr(credentials, "maybe_refresh"):
            try:  # gcsfs would otherwise fetch the first token synchronously on the event loop
                credentials.maybe_refresh()
            except Exception as exc:
                raise store_error(f"cannot get credentials for {self.url}", exc) from None
        return fs

    def path(self, name: str) -> str:
        """The filesystem path of ``name`` under the store's prefix."""
        return (
            f"{self.root}/{name}"
            if self.root not in ("", "/")
            else f"{self.root.rstrip('/')}/{name}"
        )

    def _deadline(self, deadline: Deadline | None) -> Deadline:
        if deadline is not None:
            return deadline
        first = self._first_deadline
        self._first_deadline = None
        if first is not None and not first.expired():
            return first
        return Deadline.after(self.timeout, self.clock)

    def _run(self, make: Callable[[], Awaitable[T]], deadline: Deadline, what: str) -> T:
        fs = self._filesystem(deadline)
        if self._async:
            loop = fs.loop
        else:
            from fsspec.asyn import get_loop

            loop = get_loop()
        use_daemon_executor(loop)
        return run_by(loop, make, deadline, f"{what} {self.url}", self.timeout)

    def _list_page(self, token: str | None, deadline: Deadline) -> Page:
        """One page of the listing, from ``token`` (None: the first), retried inside
        ``deadline``."""
        return self._run(
            lambda: with_retries(lambda: list_page(self, token), deadline),
            deadline,
            "cannot list",
        )

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``fs._name(...)`` on async filesystems, ``fs.name(...)`` in a daemon thread otherwise."""
        if self._async:
            return await getattr(self._fs, f"_{name}")(*args, **kwargs)
        return await in_thread(getattr(self._fs, name), *args, **kwargs)

    def _each_by(
        self,
        keys: Sequence[str],
        action: Callable[[str], Awaitable[T]],
        what: str,
        deadline: Deadline,
        *,
        on_done: Callable[[int], None] | None = None,
    ) -> dict[str, T | PlanCacheError]:
        """:func:`each` from a synchronous caller; keys not done at the deadline get its
        StoreTimeout."""
        if not keys:
            return {}
        done: dict[str, T | PlanCacheError] = {}

        limit = CONCURRENCY if self._async else SYNC_CONCURRENCY

        async def everything() -> None:
            await each(keys, action, what, limit, on_done, done)

        try:
            self._run(everything, deadline, f"cannot {what}")
        except PlanCacheError as exc:
            return {key: done.get(key, exc) for key in keys}
        return done
