"""Blocking calls off the event loop, in threads that can never hold the process open.

A store call that blocks (a filesystem without an async implementation, credential
discovery against a metadata server, a DNS lookup) must end at the operation's deadline.
Python cannot stop a thread, so the caller stops *waiting* at the deadline; what matters then
is that the abandoned thread cannot hold anything else. ``asyncio.to_thread`` and the event
loop's default executor use ``ThreadPoolExecutor`` workers, which the interpreter joins at
exit: one worker blocked on the open of a FIFO kept ``plancache pull`` (and would keep a vLLM
worker) from ever exiting. Every thread started here is a daemon thread, joined by nobody.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..clock import Deadline
from ..trust.errors import StoreTimeout

if TYPE_CHECKING:  # imported where a coroutine runs: a blocking boot read never loads it
    import asyncio

T = TypeVar("T")


def _spawn(target: Callable[[], None], name: str) -> None:
    threading.Thread(target=target, name=name, daemon=True).start()


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``await fn(*args, **kwargs)`` run in a daemon thread; cancelling abandons the thread."""
    import asyncio  # loaded already: this runs on its event loop

    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if future.done():
            return  # cancelled meanwhile (the deadline): the result is dropped
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def run() -> None:
        try:
            outcome: tuple[bool, Any] = (True, fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting coroutine, never lost
            outcome = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:
            pass  # the loop is closed: nobody waits any more

    _spawn(run, f"plancache-{getattr(fn, '__name__', 'call')}")
    return await future


class Pending(Generic[T]):
    """A blocking call started once in a daemon thread, waited for by callers with deadlines.

    Used for work whose result is worth keeping after one caller gave up on it (opening a GCS
    filesystem discovers credentials): the next caller waits on the same call instead of
    starting a second one.
    """

    _value: T
    """Set by the call when it returns (read only after it did, by :meth:`result`)."""

    def __init__(self, fn: Callable[[], T], name: str) -> None:
        self._done = threading.Event()
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = fn()
            except BaseException as exc:
                self._error = exc
            finally:
                self._done.set()

        _spawn(run, name)

    def result(self, deadline: Deadline, what: str, budget: float) -> T:
        """The call's value (or its exception, re-raised).

        Raises:
            StoreTimeout: no value by ``deadline``, named by ``what`` and ``budget`` (reason
                ``timeout``); the call goes on in its thread, for the next caller to wait on.
            BaseException: whatever the call raised, as it is.
        """
        if not self._done.wait(max(0.0, deadline.remaining())):
            raise StoreTimeout(f"{what}: no answer within the {budget:g} s budget")
        if self._error is not None:
            raise self._error
        return self._value


class DaemonExecutor(concurrent.futures.ThreadPoolExecutor):
    """The event loop's default executor (aiohttp's DNS lookups, SSL context loading, ...).

    Each call gets a fresh daemon thread rather than a pool worker that exit would join: a DNS
    lookup hanging on a dead resolver must not hold the process. Calls through it are few and
    short-lived (one per new connection), so no pool is needed.
    """

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)

        _spawn(run, "plancache-executor")
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        pass  # nothing pooled: running calls are daemon threads nobody joins


_MARK = "_plancache_daemon_executor"
"""Set on a loop whose default executor is a :class:`DaemonExecutor` (the loop is fsspec's or
the store's, kept for the process's life: a mark on it lives exactly as long)."""


def use_daemon_executor(loop: asyncio.AbstractEventLoop) -> None:
    """Make ``loop``'s default executor a :class:`DaemonExecutor` (once; idempotent)."""
    if not getattr(loop, _MARK, False):
        loop.call_soon_threadsafe(loop.set_default_executor, DaemonExecutor())
        setattr(loop, _MARK, True)
