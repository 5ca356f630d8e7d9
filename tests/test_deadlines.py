"""Budgets, retries, backoff and ``Retry-After`` on a fake clock (tests/fake_clock.py).

Every case here runs in milliseconds and asserts exact figures: the pauses taken, the tries made,
the time a wait was given. The backoff's random draw is pinned to the top of its range
(the ``draws`` fixture), so a pause is the most the formula allows. What only real time can show
(a socket that never answers, a server that trickles) is in the ``realtime`` tier
(docs/test-suite.md#tiers).
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from fake_clock import FakeClock
from plancache.clock import REAL_CLOCK, Deadline
from plancache.storage import deadline
from plancache.trust.errors import PlanCacheError, Reason, StoreError, StoreTimeout


class _StoreSaid(Exception):
    """A store's answer as botocore raises it: the status and headers in ``response``."""

    def __init__(self, status: int, retry_after: str | None = None) -> None:
        super().__init__(f"HTTP {status}")
        headers = {} if retry_after is None else {"retry-after": retry_after}
        self.response = {"ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers}}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(autouse=True)
def draws(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float]]:
    """Each full-jitter draw returns its upper bound, and the bounds drawn from are kept."""
    drawn: list[tuple[float, float]] = []

    def top(low: float, high: float) -> float:
        drawn.append((low, high))
        return high

    monkeypatch.setattr(deadline.random, "uniform", top)
    monkeypatch.setattr(deadline.random, "random", lambda: 1.0)
    return drawn


def _failing(
    clock: FakeClock, errors: list[BaseException], took: float = 0.0
) -> tuple[list[float], Callable[[], str]]:
    """An attempt that raises ``errors`` in turn (then answers ``ok``), each try taking ``took``
    seconds of the clock; and the clock's readings at each try's start."""
    starts: list[float] = []

    def attempt() -> str:
        starts.append(clock.monotonic())
        clock.advance(took)
        if len(starts) <= len(errors):
            raise errors[len(starts) - 1]
        return "ok"

    return starts, attempt


def _run(kind: str, attempt: Callable[[], Any], until: Deadline) -> Any:
    """``retrying`` (a blocking caller) or ``with_retries`` (a coroutine), the same attempt."""
    if kind == "sync":
        return deadline.retrying(attempt, until)

    async def coroutine() -> Any:
        return attempt()

    return asyncio.run(deadline.with_retries(coroutine, until))


both = pytest.mark.parametrize("kind", ["sync", "async"])


# -- the value ---------------------------------------------------------------------------------


def test_a_deadline_is_a_budget_on_its_clock(clock: FakeClock) -> None:
    due = Deadline.after(3.0, clock)
    assert (due.start, due.at, due.remaining(), due.elapsed()) == (clock.now, clock.now + 3, 3, 0)
    clock.advance(2.5)
    assert due.remaining() == 0.5 and due.elapsed() == 2.5 and not due.expired()
    clock.advance(0.5)
    assert due.remaining() == 0 and due.expired()  # the last instant is already over
    assert Deadline.after(0.0, clock).expired() and Deadline.after(-1.0, clock).expired()


def test_a_part_that_must_end_sooner_derives_its_own(clock: FakeClock) -> None:
    due = Deadline.after(10.0, clock)
    clock.advance(4.0)
    sooner = due.within(2.0)
    assert sooner.at == clock.now + 2 and sooner.clock is clock and sooner.budget == 2.0
    assert due.within(6.0) is due and due.within(60.0) is due  # never later than the whole
    assert due.extended(0.5).at == due.at + 0.5 and due.extended(0.5).start == due.start


def test_the_real_clock_is_the_default() -> None:
    assert Deadline.after(1.0).clock is REAL_CLOCK
    assert 0.5 < Deadline.after(1.0).remaining() <= 1.0


# -- retries: how many, how far apart, never past the deadline ---------------------------------


@both
def test_a_transient_failure_is_retried_with_full_jitter_backoff(
    kind: str, clock: FakeClock, draws: list[tuple[float, float]]
) -> None:
    errors: list[BaseException] = [_StoreSaid(500), ConnectionResetError()]
    starts, attempt = _failing(clock, errors)
    assert _run(kind, attempt, Deadline.after(3.0, clock)) == "ok"
    assert len(starts) == 3 and clock.slept == [0.1, 0.2]  # 50 ms base, doubling, drawn from 0
    assert draws == [(0, 0.1), (0, 0.2)]


@both
def test_tries_end_at_the_attempts_whatever_time_is_left(kind: str, clock: FakeClock) -> None:
    starts, attempt = _failing(clock, [_StoreSaid(500)] * 10)
    with pytest.raises(_StoreSaid):
        _run(kind, attempt, Deadline.after(600.0, clock))
    assert len(starts) == deadline.MAX_ATTEMPTS and len(clock.slept) == deadline.MAX_ATTEMPTS - 1


@both
def test_a_throttled_store_gets_more_tries_spread_over_the_budget(
    kind: str, clock: FakeClock, draws: list[tuple[float, float]]
) -> None:
    for status in deadline.THROTTLED:
        clock.slept.clear()
        draws.clear()
        starts, attempt = _failing(clock, [_StoreSaid(status)] * 10)
        with pytest.raises(_StoreSaid):
            _run(kind, attempt, Deadline.after(600.0, clock))
        assert len(starts) == deadline.THROTTLED_ATTEMPTS
        assert clock.slept == [0.5, 1.0, 1.0]  # 0.25 s base, doubling, capped at BACKOFF_CAP
        assert draws == [(0, 0.5), (0, 1.0), (0, 1.0), (0, 1.0)]  # the last: given up


@both
def test_retry_after_is_a_floor_on_the_pause(kind: str, clock: FakeClock) -> None:
    starts, attempt = _failing(clock, [_StoreSaid(503, "2")] * 2 + [_StoreSaid(503, "0")])
    assert _run(kind, attempt, Deadline.after(10.0, clock)) == "ok"
    assert clock.slept == [2.0, 2.0, 1.0]  # never sooner than asked; "0" leaves the backoff's own
    assert [round(b - a, 6) for a, b in itertools.pairwise(starts)] == clock.slept


@both
def test_a_retry_after_past_the_deadline_gives_up_at_once(kind: str, clock: FakeClock) -> None:
    starts, attempt = _failing(clock, [_StoreSaid(503, "5")])
    with pytest.raises(_StoreSaid):
        _run(kind, attempt, Deadline.after(2.0, clock))
    assert len(starts) == 1 and clock.slept == []


@both
def test_a_huge_retry_after_gives_up_at_once(kind: str, clock: FakeClock) -> None:
    starts, attempt = _failing(clock, [_StoreSaid(503, "9" * 400)])
    with pytest.raises(_StoreSaid):
        _run(kind, attempt, Deadline.after(30.0, clock))
    assert len(starts) == 1 and clock.slept == []


@both
@pytest.mark.parametrize("value", ["²", "١٢", "Wed, 21 Oct 2026 07:28:00 GMT"])
def test_a_retry_after_that_is_not_delta_seconds_leaves_the_usual_backoff(
    kind: str, clock: FakeClock, value: str
) -> None:
    starts, attempt = _failing(clock, [_StoreSaid(503, value)])
    assert _run(kind, attempt, Deadline.after(5.0, clock)) == "ok"
    assert len(starts) == 2 and clock.slept == [0.5]  # '١٢' would have asked for 12 s


@both
@pytest.mark.parametrize(
    ("left", "tries"), [(0.1, 1), (0.100001, 2)], ids=["pause-ends-at-the-deadline", "just-inside"]
)
def test_no_pause_is_taken_that_would_end_at_or_past_the_deadline(
    kind: str, left: float, tries: int
) -> None:
    clock = FakeClock(start=0.0)  # 0.1 s left is then exactly 0.1, as the pause is
    starts, attempt = _failing(clock, [_StoreSaid(500)])
    outcome: Any = None
    try:
        outcome = _run(kind, attempt, Deadline.after(left, clock))
    except _StoreSaid:
        pass
    assert len(starts) == tries and outcome == ("ok" if tries == 2 else None)


@both
def test_slow_tries_spend_the_budget_too(kind: str, clock: FakeClock) -> None:
    """Each try takes 0.9 s: after the first, 1.1 s is left for a 0.1 s pause; after the
    second, 0.1 s is left for a 0.2 s pause, so the third is never made."""
    starts, attempt = _failing(clock, [_StoreSaid(500)] * 3, took=0.9)
    with pytest.raises(_StoreSaid):
        _run(kind, attempt, Deadline.after(2.0, clock))
    assert len(starts) == 2 and clock.slept == [0.1]


@both
@pytest.mark.parametrize(
    "error",
    [
        _StoreSaid(403),
        _StoreSaid(404),
        FileNotFoundError("gone"),
        ValueError("bad option"),
        ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
        StoreError("capped", transient=False),
    ],
    ids=["403", "404", "absent", "bad-option", "refused", "own-final"],
)
def test_a_failure_that_would_fail_again_is_never_retried(
    kind: str, clock: FakeClock, error: BaseException
) -> None:
    starts, attempt = _failing(clock, [error])
    with pytest.raises(type(error)):
        _run(kind, attempt, Deadline.after(60.0, clock))
    assert len(starts) == 1 and clock.slept == []


@both
@pytest.mark.parametrize(
    "error", [_StoreSaid(408), _StoreSaid(429), StoreError("cut short", transient=True)]
)
def test_a_timeout_answer_or_own_transient_error_is_retried(
    kind: str, clock: FakeClock, error: BaseException
) -> None:
    starts, attempt = _failing(clock, [error])
    assert _run(kind, attempt, Deadline.after(60.0, clock)) == "ok" and len(starts) == 2


@both
def test_the_legacy_retries_are_three_tries_without_retry_after(
    kind: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """scripts/bench_storm.py's "today" column: what the boot-storm work replaced."""
    monkeypatch.setattr(deadline, "LEGACY_RETRIES", True)
    starts, attempt = _failing(clock, [_StoreSaid(503, "2")] * 10)
    with pytest.raises(_StoreSaid):
        _run(kind, attempt, Deadline.after(60.0, clock))
    assert len(starts) == deadline.MAX_ATTEMPTS and clock.slept == pytest.approx([0.075, 0.15])


def test_a_cancelled_coroutine_is_not_retried(clock: FakeClock) -> None:
    tries: list[int] = []

    async def cancelled() -> None:
        tries.append(1)
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(deadline.with_retries(cancelled, Deadline.after(60.0, clock)))
    assert tries == [1] and clock.slept == []


# -- run_by: a coroutine on another thread's loop, for the time that is left ------------------


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, daemon=True)
    thread.start()
    yield running
    running.call_soon_threadsafe(running.stop)
    thread.join(10)
    running.close()


def _coroutine(body: Callable[[], Awaitable[Any]]) -> tuple[list[int], Callable[[], Any]]:
    made: list[int] = []

    def make() -> Awaitable[Any]:
        made.append(1)
        return body()

    return made, make


def test_run_by_returns_the_answer_and_types_a_failure(
    loop: asyncio.AbstractEventLoop, clock: FakeClock
) -> None:
    async def answer() -> str:
        return "bytes"

    async def fail() -> None:
        raise ConnectionResetError("reset by peer")

    due = Deadline.after(3.0, clock)
    assert deadline.run_by(loop, answer, due, "cannot read x from s3://b", 3.0) == "bytes"
    with pytest.raises(PlanCacheError) as err:
        deadline.run_by(loop, fail, due, "cannot read x from s3://b", 3.0)
    assert err.value.reason is Reason.STORE_ERROR
    assert err.value.detail == "cannot read x from s3://b: reset by peer"


def test_run_by_starts_nothing_once_the_budget_is_spent(
    loop: asyncio.AbstractEventLoop, clock: FakeClock
) -> None:
    made, make = _coroutine(lambda: asyncio.sleep(0))
    due = Deadline.after(3.0, clock)
    clock.advance(3.0)
    with pytest.raises(StoreTimeout) as err:
        deadline.run_by(loop, make, due, "cannot list s3://b", 3.0)
    assert made == [] and err.value.detail == "cannot list s3://b: no time left in the budget"


def test_run_by_gives_the_coroutine_only_the_time_left(
    loop: asyncio.AbstractEventLoop, clock: FakeClock
) -> None:
    """An hour's budget with 50 ms of it left: a coroutine that would answer in 2 s (real time,
    on the loop) is cancelled and the message names the budget. Given the whole budget instead of
    what is left, it would answer."""
    cancelled = threading.Event()

    async def slow() -> str:
        try:
            await asyncio.sleep(2.0)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "too late"

    due = Deadline.after(3600.0, clock)
    clock.advance(3600.0 - 0.05)
    with pytest.raises(StoreTimeout) as err:
        deadline.run_by(loop, slow, due, "cannot read x from s3://b", 3600.0)
    assert err.value.detail == "cannot read x from s3://b: no answer within the 3600 s budget"
    assert cancelled.wait(10)  # the store's coroutine does not go on after the caller gave up


def test_a_node_fetch_outcome_is_dated_and_judged_on_the_deadlines_clock(
    tmp_path: Any, clock: FakeClock
) -> None:
    """The outcome another rank reads (pipeline/plan_sets/node_plans) is written and judged on
    the injectable clock's wall time, not ``time.time()``: an outcome dated before this rank
    began to wait, or past the clock's now plus the skew, is no record."""
    from plancache.pipeline.plan_sets import node_plans
    from plancache.trust.errors import StoreError
    from plancache.trust.result import PlanResult

    key = tmp_path / "set.lock"
    asked = clock.wall()
    clock.advance(5)
    failed = PlanResult("f" * 64, "store", error=StoreError("denied"))
    node_plans._record(key, "set-a", {"f" * 64: failed}, clock.wall())
    recorded = node_plans._recorded(key, "set-a", asked, clock.wall(), "f" * 64)
    assert recorded is not None and recorded.error is not None
    assert node_plans._recorded(key, "set-a", clock.wall() + 1, clock.wall(), "f" * 64) is None
    clock.advance(-3600)  # the outcome is now far in this clock's future: no record
    assert node_plans._recorded(key, "set-a", asked - 7200, clock.wall(), "f" * 64) is None


HALF_IMPORTED = """
import sys, threading, importlib.abc
from plancache.storage import deadline
assert "asyncio" not in sys.modules
started, release = threading.Event(), threading.Event()

class Hold(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "asyncio.base_events":
            started.set()
            release.wait(60)
        return None

sys.meta_path.insert(0, Hold())
importing = threading.Thread(target=lambda: __import__("asyncio"))
importing.start()
assert started.wait(60)
assert "asyncio" in sys.modules and not hasattr(sys.modules["asyncio"], "TimeoutError")
failure = ConnectionResetError("reset by peer")
try:
    print(deadline.is_timeout(failure), deadline.store_error("read x", failure).reason.value)
finally:
    release.set()
    importing.join()
import asyncio
print(deadline.is_timeout(RuntimeError("x")) is False, deadline.is_timeout(asyncio.TimeoutError()))
"""


def test_a_failure_classified_while_another_thread_imports_asyncio_says_what_it_was() -> None:
    """A boot-time pull imports no asyncio, so the timeout classes name asyncio's only once it
    is loaded: while another thread imports it for the first time, the package is in
    ``sys.modules`` before its ``__init__`` names ``TimeoutError``. A store failure classified
    in that window was an AttributeError (``partially initialized module 'asyncio'``), not
    ``store-error``. A real import, held at ``asyncio.base_events`` by a meta-path finder (the
    window a real import leaves open for 10-20 ms), in a fresh interpreter (this one has
    asyncio)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(deadline.__file__).resolve().parents[2])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", HALF_IMPORTED], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "store-error", "True", "True"]
