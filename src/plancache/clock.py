"""Time as plancache reads it: a :class:`Clock`, and a :class:`Deadline` on it.

Every budget (a store operation's ``--timeout``, a boot's ``PLANCACHE_TIMEOUT``, a lock's wait,
a vote's round) is a :class:`Deadline`: the moment it started on a clock, and how long it is.
The code that spends it reads the time and pauses through that clock, never through
``time.monotonic()`` or ``time.sleep`` directly. The product has one clock, :data:`REAL_CLOCK`;
tests hand in a fake one that advances when something sleeps, so a budget's arithmetic, the
retries, their backoff and a store's ``Retry-After`` run without waiting for them and the same
way on any machine (docs/adr/0010-deadlines-on-an-injectable-clock.md).

What a clock cannot stand in for is the operating system's own waiting: a socket's timeout,
``asyncio.wait_for`` on the event loop, a thread's join. Those are given the time a deadline
says is left (:meth:`Deadline.remaining`), and measured in real time by the ``realtime`` tests.

Here, not in :mod:`plancache.storage.deadline`, because every ring above the trust core takes
a deadline (storage, the pipeline, the plugin's boot and vote), and importing it costs nothing:
no event loop is imported until something pauses on one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol


class Clock(Protocol):
    """Where a deadline reads the time and how it pauses. Monotonic seconds: only differences
    between two readings of one clock mean anything."""

    def monotonic(self) -> float: ...

    def wall(self) -> float:
        """Seconds since the epoch: for a time written where another process (or another boot)
        reads it back, which a monotonic reading cannot be compared across."""
        ...

    def sleep(self, seconds: float) -> None:
        """Pause this thread (a blocking caller's backoff, a lock's poll)."""
        ...

    async def sleep_async(self, seconds: float) -> None:
        """Pause this coroutine (backoff on the event loop)."""
        ...


class RealClock:
    """The machine's: ``time.monotonic``, ``time.sleep`` and ``asyncio.sleep``."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def sleep_async(self, seconds: float) -> None:
        import asyncio  # only a caller already on an event loop gets here

        await asyncio.sleep(seconds)


REAL_CLOCK: Clock = RealClock()
"""The one clock outside tests."""


@dataclass(frozen=True)
class Deadline:
    """A budget of ``budget`` seconds that started at ``start`` on ``clock``.

    A value: handing it down hands on the time that is left, never a fresh budget; a part that
    must end sooner derives its own (:meth:`within`). Usually made by :meth:`after`; a caller
    that read the clock before importing what it times (the CLI: the SDK's import counts) makes
    it from that reading.
    """

    start: float
    budget: float
    clock: Clock = REAL_CLOCK

    @classmethod
    def after(cls, budget: float, clock: Clock = REAL_CLOCK) -> Deadline:
        """``budget`` seconds from now on ``clock`` (a budget of zero or less is already over)."""
        return cls(clock.monotonic(), budget, clock)

    @property
    def at(self) -> float:
        """The clock's reading at which the budget ends."""
        return self.start + self.budget

    def remaining(self) -> float:
        """Seconds left (zero or less once over)."""
        return self.at - self.clock.monotonic()

    def expired(self) -> bool:
        return self.remaining() <= 0

    def elapsed(self) -> float:
        """Seconds since the budget started."""
        return self.clock.monotonic() - self.start

    def within(self, seconds: float) -> Deadline:
        """This deadline, or ``seconds`` from now on the same clock if that comes first."""
        now = self.clock.monotonic()
        return self if self.at <= now + seconds else Deadline(now, seconds, self.clock)

    def extended(self, seconds: float) -> Deadline:
        """The same budget ``seconds`` longer (a grace past it: a join, a lock's margin)."""
        return Deadline(self.start, self.budget + seconds, self.clock)


class Stopwatch:
    """Time spent since ``start`` on ``clock``: the one way plancache measures what it reports
    (a decision line's or a boot record's ``elapsed_ms``, a fetch's "prefetch 12 ms"). It
    measures and never decides: a budget is a :class:`Deadline`. On the injectable clock like a
    deadline, so a test on fake time reads the figures it made (ADR 0010). A plain class, not a
    dataclass: every process that imports the clock (a boot-time pull) would pay for making
    one."""

    __slots__ = ("clock", "start")

    def __init__(self, start: float, clock: Clock = REAL_CLOCK) -> None:
        self.start = start
        self.clock = clock

    @classmethod
    def started(cls, clock: Clock = REAL_CLOCK) -> Stopwatch:
        """A stopwatch running from now on ``clock``."""
        return cls(clock.monotonic(), clock)

    def elapsed_ms(self) -> float:
        """Milliseconds since :attr:`start`."""
        return self.ms_until(self.clock.monotonic())

    def ms_until(self, reading: float) -> float:
        """Milliseconds from :attr:`start` to ``reading``, a later reading of the same clock
        (when a task ended)."""
        return (reading - self.start) * 1000
