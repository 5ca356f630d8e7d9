"""Budgets as the code paths spend them, on a fake clock (tests/fake_clock.py): a store's opening
and first operation sharing one deadline, a wait on a daemon thread, the compile cache's lock
and the plan-set node lock polling to their end, a set audit starting no read it cannot finish,
a prefetch waited for no longer than its deadline.

No store server here: local directories and threads only. Each case asserts the pauses taken,
the reads made or the time a wait was given, never the wall time (docs/test-suite.md#tiers).
"""

from __future__ import annotations

import fcntl
import math
import os
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from fake_clock import FakeClock
from plancache.clock import Deadline, Stopwatch
from plancache.pipeline.plan_sets import node_plans, set_audit
from plancache.storage.deadline import JOIN_GRACE
from plancache.storage.local import directory_lock
from plancache.storage.store import open_store
from plancache.storage.threads import Pending
from plancache.trust.errors import StoreTimeout
from plancache.vllm_plugin.prefetch import Prefetch

POLL = 0.05
"""directory_lock's poll (its ``min(0.05, left)``)."""


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


LATE_S = 5.0
"""When, in real time, :func:`blocked` answers."""


@pytest.fixture
def blocked() -> Iterator[threading.Event]:
    """What a call that answers only :data:`LATE_S` seconds from now waits on. A wait cut short
    by a spent deadline ends at once, long before; one given the whole budget sees the answer,
    and the test fails instead of only taking longer."""
    event = threading.Event()
    timer = threading.Timer(LATE_S, event.set)
    timer.start()
    yield event
    timer.cancel()
    event.set()


# -- a store: the opening's deadline, then fresh budgets on the same clock --------------------


def test_the_first_operation_shares_the_opening_deadline(tmp_path: Path, clock: FakeClock) -> None:
    opened = Deadline.after(3.0, clock)
    store = open_store(tmp_path.as_uri(), None, 3.0, deadline=opened)
    assert store.clock is clock
    clock.advance(2.0)
    assert store.deadline(None) is opened  # the open and the first operation: one budget
    fresh = store.deadline(None)  # the next gets a budget of its own, on the same clock
    assert fresh is not opened and fresh.clock is clock and fresh.start == clock.now
    assert fresh.budget == 3.0
    given = Deadline.after(0.5, clock)
    assert store.deadline(given) is given  # a caller's deadline always wins


def test_an_opening_deadline_already_spent_is_not_handed_on(
    tmp_path: Path, clock: FakeClock
) -> None:
    store = open_store(tmp_path.as_uri(), None, 3.0, deadline=Deadline.after(3.0, clock))
    clock.advance(3.0)
    fresh = store.deadline(None)
    assert fresh.start == clock.now and fresh.remaining() == 3.0


# -- a blocking call in a daemon thread, waited for what is left --------------------------------


def test_a_call_that_has_not_answered_by_a_spent_deadline_is_not_waited_for(
    clock: FakeClock, blocked: threading.Event
) -> None:
    """Spent on the fake clock, so the real wait is none: the call is given up at once."""
    pending = Pending(blocked.wait, "test-blocked")
    due = Deadline.after(30.0, clock)
    clock.advance(30.0)
    with pytest.raises(StoreTimeout) as err:
        pending.result(due, "cannot open s3://b", 30.0)
    assert err.value.detail == "cannot open s3://b: no answer within the 30 s budget"


def test_a_call_that_answered_is_taken_even_past_its_deadline(clock: FakeClock) -> None:
    done = Pending(lambda: "filesystem", "test-done")
    due = Deadline.after(1.0, clock)
    assert done.result(due, "cannot open s3://b", 1.0) == "filesystem"  # waited for
    clock.advance(5.0)
    assert done.result(due, "cannot open s3://b", 1.0) == "filesystem"


def test_a_prefetch_is_waited_for_until_its_deadline_only(
    clock: FakeClock, blocked: threading.Event
) -> None:
    due = Deadline.after(30.0, clock)
    late = Prefetch("fp", due, blocked.wait).start()
    clock.advance(30.0)
    assert late.result() == (False, None) and late.started == due.start
    done = Prefetch("fp", Deadline.after(3.0, clock), lambda: "result").start()
    assert done.result() == (True, "result") and done.finished == clock.now


def test_a_measurement_reads_the_clock_it_was_started_on(
    clock: FakeClock, blocked: threading.Event
) -> None:
    """elapsed_ms in the decision line and the boot record, and a prefetch's "prefetch N ms",
    are measured on the injectable clock (one helper, :class:`plancache.clock.Stopwatch`): so
    the figures a test on fake time reads are exactly the time it made pass."""
    watch = Stopwatch.started(clock)
    clock.advance(0.25)
    assert watch.elapsed_ms() == 250.0 and watch.ms_until(clock.now + 1.0) == 1250.0
    running = Prefetch("fp", Deadline.after(30.0, clock), blocked.wait).start()
    clock.advance(1.5)
    assert running.took_ms() == 1500.0  # still running: so far
    done = Prefetch("fp", Deadline.after(3.0, clock), lambda: "result").start()
    assert done.result() == (True, "result")
    clock.advance(2.0)
    assert done.took_ms() == 0.0  # ended at once on the fake clock: to its end, not to now


# -- locks: polled on the clock until the wait is over ------------------------------------------


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Path]:
    """A cache directory whose lock another open file holds (as another rank would) for
    :data:`LATE_S` seconds of real time: a wait polled on the fake clock ends long before; one
    polled in real time would take the lock, and the test fails instead of hanging."""
    directory = tmp_path / "cache" / "0123456789"
    directory.parent.mkdir()
    lock = directory_lock.lock_path(directory)
    with directory_lock.locked(directory.parent, directory):
        pass  # made, this user's, closed to others' writes
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    timer = threading.Timer(LATE_S, fcntl.flock, (fd, fcntl.LOCK_UN))
    timer.start()
    try:
        yield directory
    finally:
        timer.cancel()
        os.close(fd)


@pytest.mark.parametrize("wait", [0.0, 0.05, 1.0, 2.34])
def test_a_held_lock_is_polled_until_the_wait_is_over(
    held: Path, clock: FakeClock, wait: float
) -> None:
    with (
        pytest.raises(StoreTimeout) as err,
        directory_lock.locked(held.parent, held, wait=wait, clock=clock),
    ):
        pass
    assert f"held the lock {directory_lock.lock_path(held)} for over {wait:g} s" in err.value.detail
    assert len(clock.slept) == math.ceil(round(wait / POLL, 6))
    assert all(0 < pause <= POLL for pause in clock.slept)
    assert sum(clock.slept) == pytest.approx(wait)  # the last poll only to the end of the wait


def test_a_free_lock_is_taken_without_a_pause(tmp_path: Path, clock: FakeClock) -> None:
    directory = tmp_path / "cache" / "0123456789"
    directory.parent.mkdir()
    with directory_lock.locked(directory.parent, directory, wait=5.0, clock=clock) as taken:
        assert taken is True
    assert clock.slept == []


def test_a_rank_waits_for_the_fetching_rank_as_long_as_its_deadline_and_grace(
    held: Path, clock: FakeClock
) -> None:
    """The fetching rank may end up to the deadline's join grace past it: the others wait that
    long, and the lock's margin more, then give up (their budget is spent)."""
    due = Deadline.after(2.0, clock)
    clock.advance(0.5)
    with ExitStack() as stack, pytest.raises(StoreTimeout):
        node_plans._lock(stack, held, due)
    waited = 1.5 + JOIN_GRACE + node_plans.LOCK_MARGIN
    assert sum(clock.slept) == pytest.approx(waited) and clock.now == pytest.approx(due.at + 0.75)


def test_a_rank_whose_budget_and_grace_are_spent_does_not_wait(
    held: Path, clock: FakeClock
) -> None:
    due = Deadline.after(2.0, clock)
    clock.advance(2.0 + JOIN_GRACE + node_plans.LOCK_MARGIN)
    with ExitStack() as stack, pytest.raises(StoreTimeout) as err:
        node_plans._lock(stack, held, due)
    assert "no time left in the budget to wait for the node's fetching rank" in err.value.detail
    assert clock.slept == []


# -- a set audit: one deadline for every read, none started past it ----------------------------


def test_a_set_audit_starts_no_read_past_its_deadline(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six set objects, each read taking 2 s of a 5 s budget: three are read (the third starts
    at 4 s), the other three are reported ``timeout`` unread. A fresh budget per read (the bug
    this guards) would read all six."""
    names = [f"startup_planset_{i:016x}.set" for i in range(6)]
    for name in names:
        (tmp_path / name).write_bytes(b"not a set")
    reads: list[str] = []
    given: list[Deadline | None] = []
    read = set_audit.read_set

    def slow_read(store: Any, name: str, deadline: Deadline | None = None) -> bytes | None:
        reads.append(name)
        given.append(deadline)
        data = read(store, name, deadline)
        clock.advance(2.0)
        return data

    monkeypatch.setattr(set_audit, "read_set", slow_read)
    opened = Deadline.after(5.0, clock)
    store = open_store(tmp_path.as_uri(), None, 5.0, deadline=opened)
    reports = set_audit.audit_sets(store, None, datetime.now(timezone.utc))
    assert reads == names[:3] and all(d is opened for d in given)  # the opening's, every read
    assert [r.name for r in reports] == names
    late = [(r.status, r.reason, r.detail) for r in reports[3:]]
    assert late == [
        ("store-error", "timeout", f"cannot read {n}: no time left in the budget")
        for n in names[3:]
    ]
    assert all(r.reason != "timeout" for r in reports[:3])
