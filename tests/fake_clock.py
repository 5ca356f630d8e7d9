"""A clock for tests: time moves only when code sleeps on it, or when the test moves it.

plancache reads the time and pauses through the :class:`~plancache.clock.Clock` of a
:class:`~plancache.clock.Deadline` (docs/adr/0010). Handed this one, a budget's
arithmetic, the retries, their backoff and a store's ``Retry-After`` run at once and the same way
on any machine, however loaded: a test asserts the pauses taken and the tries made, never the
wall time. What stays real is the operating system's own waiting (a socket's timeout,
``asyncio.wait_for``): those waits get the time the fake clock says is left.
"""

from __future__ import annotations

import asyncio
import threading

WALL_OFFSET = 1_700_000_000.0
"""What :meth:`FakeClock.wall` adds to its monotonic reading."""


class FakeClock:
    """Starts at ``start`` (a reading unlike ``time.monotonic()``'s, so a mix-up shows) and
    advances by exactly what is slept; :attr:`slept` lists every pause asked for, in order."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start
        self.slept: list[float] = []
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self.now

    def wall(self) -> float:
        """A wall-clock reading that moves with :meth:`monotonic` (the epoch well past 2020)."""
        with self._lock:
            return WALL_OFFSET + self.now

    def advance(self, seconds: float) -> None:
        """Time passing outside a sleep: a try that took this long, a wait elsewhere."""
        with self._lock:
            self.now += seconds

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.slept.append(seconds)
            self.now += max(0.0, seconds)

    async def sleep_async(self, seconds: float) -> None:
        self.sleep(seconds)
        await asyncio.sleep(0)  # a pause still lets the loop run what is ready
