"""Deadlines: running a store's coroutines from synchronous callers, bounded in time.

A store can be slow, down or hostile, and a booting vLLM worker must not wait on it for
minutes. Every remote operation therefore gets one overall :class:`~plancache.clock.Deadline`
and runs as a coroutine on fsspec's event loop, wrapped in ``asyncio.wait_for`` with the time
the deadline leaves; the calling thread waits on the future for that time plus
:data:`JOIN_GRACE`, so even a stalled loop cannot hold it (:func:`run_by`). (``fsspec.asyn.sync``
does the same with a one-second polling step, too coarse for a 3 s budget.)

Inside the deadline, :func:`with_retries` retries transient failures with full-jitter
exponential backoff that honours a store's ``Retry-After`` (never past the deadline),
never a refused connection (nobody is listening: failing in milliseconds is the point) and
never a mistake that would fail the same way again. The pauses are the deadline's clock's, so
a fake clock runs them at once (tests/test_deadlines.py). Failures are classified by type
(exception classes, ``errno``, SDK status codes), never by reading their text.
"""

from __future__ import annotations

import concurrent.futures
import errno
import random
import re
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from ..clock import Deadline
from ..settings import DEFAULT_TIMEOUT
from ..trust.errors import PlanCacheError, StoreError, StoreTimeout

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")

JOIN_GRACE = 0.5
"""Extra wait on the calling thread beyond the deadline, should the event loop be stalled."""

MAX_ATTEMPTS = 3
"""Tries of one object read or write, all inside the operation's deadline."""

BACKOFF_BASE = 0.05


def _timeouts() -> tuple[type[BaseException], ...]:
    """The timeout classes: distinct on Python 3.10, one class from 3.11; all of them. asyncio's
    only once asyncio is imported (nothing raises it before): importing it here cost a boot-time
    ``pull`` on botocore, which never runs an event loop, 10-20 ms.

    Asked of ``asyncio.exceptions``, where the class is made, and only if it is made yet: while
    another thread imports asyncio for the first time, ``sys.modules`` holds the package before
    its ``__init__`` has named ``TimeoutError`` (after ``base_events``), and a store failure
    classified then raised AttributeError instead of saying what happened
    (tests/test_deadlines.py)."""
    made = getattr(sys.modules.get("asyncio.exceptions"), "TimeoutError", None)
    return (TimeoutError, concurrent.futures.TimeoutError) + ((made,) if made is not None else ())


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it was raised from or during, each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_refused(exc: BaseException) -> bool:
    """A refused connection anywhere in the chain (aiohttp keeps the OS error in ``os_error``)."""
    for current in causes(exc):
        for candidate in (current, getattr(current, "os_error", None)):
            if isinstance(candidate, ConnectionRefusedError):
                return True
            if isinstance(candidate, OSError) and candidate.errno == errno.ECONNREFUSED:
                return True
    return False


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an SDK error carries (botocore ``ClientError``, aiohttp, gcsfs,
    azure-core), if any."""
    for current in causes(exc):
        response = getattr(current, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(status, int):
                return status
        for attr in ("status", "code", "status_code"):
            value = getattr(current, attr, None)
            if isinstance(value, int) and 100 <= value <= 599:
                return value
    return None


def own_error(exc: BaseException) -> PlanCacheError | None:
    """plancache's own typed error in the chain: the SDKs wrap what a capped response raised."""
    for current in causes(exc):
        if isinstance(current, PlanCacheError):
            return current
    return None


def is_timeout(exc: BaseException) -> bool:
    """A timeout anywhere in the chain, whatever its class on this Python (botocore's
    ``ReadTimeoutError`` and ``ConnectTimeoutError`` wrap aiohttp's asyncio timeouts)."""
    timeouts = _timeouts()
    return any(isinstance(current, timeouts) for current in causes(exc))


def is_transient(exc: BaseException) -> bool:
    """Worth another try within the deadline: server errors, dropped or silent connections."""
    own = own_error(exc)
    if own is not None:
        return isinstance(own, StoreError) and own.transient
    if isinstance(exc, (FileNotFoundError, PermissionError, FileExistsError, NotImplementedError)):
        return False
    if isinstance(exc, (ValueError, TypeError, KeyError)):
        return False  # bad arguments or options: another try would fail the same way
    status = http_status(exc)
    if status is not None and 400 <= status < 500 and status not in (408, 429):
        return False  # the request itself is refused: access denied, no such bucket, ...
    return not is_refused(exc)


THROTTLED_ATTEMPTS = 4
"""Tries of one request the store throttled (429, 503): more room than for other failures,
because a throttled store asks to be retried later, not never; the deadline still bounds it."""

BACKOFF_CAP = 1.0
"""The largest full-jitter pause (seconds): longer ones would only cross a 3 s budget."""

THROTTLED_BASE = 0.25
"""Backoff base after a throttled answer: a store over its rate recovers in seconds, not in
the 50 ms a dropped connection needs, so the tries spread over the budget (pauses drawn from
0-0.5 s, 0-1 s, 0-1 s) instead of spending all of them in its first 0.3 s."""

THROTTLED = (429, 503)
"""What S3 (``503 SlowDown``), GCS (``429``/``503``) and Azure (``503 ServerBusy``) answer
above their limits."""

LEGACY_RETRIES = False
"""True restores the retries before the boot-storm work (3 tries, 50-200 ms apart, no
Retry-After): only ``scripts/bench_storm.py`` sets it, to print today's behaviour beside the new."""


_DELTA_SECONDS = re.compile(r"[0-9]+")
"""RFC 9110's delta-seconds: ASCII digits only. ``str.isdigit`` also takes '²' and '١٢' (and
``float`` raises on the first), so a hostile or broken header would fail the retry itself."""

RETRY_AFTER_CAP = 1e6
"""The most a ``Retry-After`` is taken to ask (a longer one is the same: past any deadline, so
:func:`_give_up` ends the retries at once instead of sleeping)."""


def retry_after(exc: BaseException) -> float | None:
    """Seconds a store's ``Retry-After`` header asks for, anywhere in the chain (botocore's
    ``ResponseMetadata.HTTPHeaders``, aiohttp's and azure-core's ``headers``); None without one.
    Only the delta-seconds form is read (:data:`_DELTA_SECONDS`); anything else, a date
    included (it would need the store's clock), is as absent: the usual backoff applies."""
    for current in causes(exc):
        response = getattr(current, "response", None)
        candidates: list[Any] = []
        if isinstance(response, dict):
            meta = response.get("ResponseMetadata")
            candidates.append(meta.get("HTTPHeaders") if isinstance(meta, dict) else None)
        candidates += [getattr(response, "headers", None), getattr(current, "headers", None)]
        for headers in candidates:
            if not callable(getattr(headers, "get", None)):
                continue
            value = headers.get("retry-after") or headers.get("Retry-After")
            text = value.strip(" \t") if isinstance(value, str) else ""
            if _DELTA_SECONDS.fullmatch(text):  # never str.isdigit: it takes '²'
                return min(float(text), RETRY_AFTER_CAP) if len(text) <= 16 else RETRY_AFTER_CAP
    return None


def _pause(number: int, exc: BaseException | None = None) -> float:
    """How long to wait before try ``number + 2``: full-jitter exponential backoff (a pause drawn
    uniformly from zero to ``BACKOFF_BASE * 2**(number+1)``, capped), so a fleet throttled at
    the same instant spreads its retries instead of returning in step; a ``Retry-After`` the
    store sent is a floor (never retried sooner than it asked)."""
    if LEGACY_RETRIES:
        return BACKOFF_BASE * (2**number) * (0.5 + random.random())
    base = THROTTLED_BASE if exc is not None and http_status(exc) in THROTTLED else BACKOFF_BASE
    pause = random.uniform(0, min(BACKOFF_CAP, base * 2 ** (number + 1)))
    asked = retry_after(exc) if exc is not None else None
    return pause if asked is None else max(pause, asked)


def _attempts(exc: BaseException) -> int:
    if not LEGACY_RETRIES and http_status(exc) in THROTTLED:
        return THROTTLED_ATTEMPTS
    return MAX_ATTEMPTS


def _give_up(number: int, exc: Exception, pause: float, deadline: Deadline) -> bool:
    """No retry past the attempts, of a failure that would fail again, or whose pause (a
    Retry-After included) would end at or after the deadline: a try that cannot finish in time
    only adds load to a store that is already refusing."""
    return number >= _attempts(exc) - 1 or not is_transient(exc) or deadline.remaining() <= pause


async def with_retries(attempt: Callable[[], Awaitable[T]], deadline: Deadline) -> T:
    """Run ``attempt`` while transient failures leave time to retry (see :func:`_give_up`),
    pausing on the deadline's clock."""
    import asyncio  # loaded already: this runs on its event loop

    number = 0
    while True:
        try:
            return await attempt()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            pause = _pause(number, exc)
            if _give_up(number, exc, pause, deadline):
                raise
            await deadline.clock.sleep_async(pause)
            number += 1


def retrying(attempt: Callable[[], T], deadline: Deadline) -> T:
    """:func:`with_retries` for a blocking ``attempt`` (in a thread of its own, see
    :mod:`.s3.direct`), pausing on the deadline's clock."""
    number = 0
    while True:
        try:
            return attempt()
        except Exception as exc:
            pause = _pause(number, exc)
            if _give_up(number, exc, pause, deadline):
                raise
            deadline.clock.sleep(pause)
            number += 1


def one_line(exc: BaseException) -> str:
    """An exception as one short line: SDK errors can carry multi-line XML or JSON bodies."""
    if isinstance(exc, PlanCacheError):
        return exc.detail
    text = " ".join(str(exc).split()) or type(exc).__name__
    if is_refused(exc):
        text = f"connection refused ({text})"
    return text[:300]


def store_error(what: str, exc: BaseException) -> PlanCacheError:
    """Any failure of a store call as a typed error (plancache's own errors pass through).

    A timeout is TIMEOUT whatever raised it: the per-request timeouts of the SDKs and the
    deadline are the same fact, the store did not answer in time (on Python 3.10 the asyncio
    and concurrent.futures timeout classes are not the built-in ``TimeoutError``).
    """
    own = own_error(exc)
    if own is not None:
        return own
    if is_timeout(exc):
        return StoreTimeout(f"{what}: {one_line(exc)}")
    return StoreError(f"{what}: {one_line(exc)}")


def run_by(
    loop: asyncio.AbstractEventLoop,
    make: Callable[[], Awaitable[T]],
    deadline: Deadline,
    what: str,
    budget: float,
) -> T:
    """Run ``make()`` on ``loop`` from this thread for the time ``deadline`` leaves; cancel it
    and raise StoreTimeout when that is over (``budget``: the one the message names).

    Raises:
        StoreTimeout: no time was left, or ``make()`` did not end in it (reason ``timeout``).
        PlanCacheError: ``make()`` failed (:func:`store_error`).
    """
    import asyncio  # loaded already: ``loop`` is one of its loops

    remaining = deadline.remaining()
    if remaining <= 0:
        raise StoreTimeout(f"{what}: no time left in the budget")

    async def bounded() -> T:
        return await asyncio.wait_for(make(), remaining)

    future = asyncio.run_coroutine_threadsafe(bounded(), loop)
    try:
        return future.result(remaining + JOIN_GRACE)
    except _timeouts():
        future.cancel()
        raise StoreTimeout(f"{what}: no answer within the {budget:g} s budget") from None
    except Exception as exc:
        raise store_error(what, exc) from None


def checked_budget(value: Any, default: float = DEFAULT_TIMEOUT) -> float:
    """A budget in seconds: positive and finite, else a ConfigError (``inf`` would never end).

    Raises:
        ConfigError: ``value`` is not a number, or not in (0, 1e6).
    """
    from ..trust.errors import ConfigError

    budget = default if value is None else value
    try:
        budget = float(budget)
    except (TypeError, ValueError):
        raise ConfigError(f"the timeout must be a number of seconds, got {value!r}") from None
    if not (0 < budget < 1e6):
        raise ConfigError(
            f"the timeout must be a positive number of seconds below 1e6, got {value}"
        )
    return budget
