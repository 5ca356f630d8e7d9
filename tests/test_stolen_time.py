"""tests/stolen_time.py counts the run-queue wait of a thread that ended before the clock was read,
and the garbage collector's pauses.

A child process and a busy competitor are pinned to one CPU, so the child's busy thread runs about
half the time and waits in the run queue the other half; the thread ends before the clock is read,
as plancache's prefetch thread ends before a boot's bound is checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = r"""
import os, sys, threading, time
sys.path.insert(0, sys.argv[1])
from stolen_time import StolenClock
os.sched_setaffinity(0, {int(sys.argv[2])})
clock = StolenClock()
def busy():
    end = time.monotonic() + 0.8
    while time.monotonic() < end:
        pass
worker = threading.Thread(target=busy)
worker.start()
worker.join()
time.sleep(0.1)  # the thread is gone when the clock is read
wall, stolen = clock.read()
print(f"{wall:.3f} {stolen:.3f}")
"""


def _child_under_contention() -> tuple[float, float]:
    cpu = min(os.sched_getaffinity(0))
    competitor = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(Path(__file__).parent), str(cpu)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    finally:
        competitor.kill()
        competitor.wait()
    wall, stolen = (float(x) for x in out.split())
    return wall, stolen


@pytest.mark.skipif(
    not os.path.exists("/proc/self/task"), reason="needs Linux's per-thread schedstat"
)
def test_an_ended_threads_run_queue_wait_is_counted() -> None:
    wall, stolen = _child_under_contention()
    # sharing one CPU with a busy process, the 0.8 s busy thread waited for about half of it
    assert stolen >= 0.2, (wall, stolen)
    # only the busy thread queued for long (the main thread slept in join, the sampler is left out)
    assert stolen <= wall + 0.2, (wall, stolen)


def test_a_process_alone_loses_little() -> None:
    from stolen_time import StolenClock

    clock = StolenClock()
    wall, stolen = clock.read()
    assert 0 <= stolen <= wall + 0.05


GC_CHILD = r"""
import gc, sys, time
sys.path.insert(0, sys.argv[1])
from stolen_time import StolenClock
heap = [[i] for i in range(2_000_000)]  # a heap as large as a worker's that imported vLLM
clock = StolenClock()
began = time.monotonic()
gc.collect()  # one full collection, as an allocation inside a timed boot sets off
paused = time.monotonic() - began
wall, stolen = clock.read()
counted = clock.collecting
gc.collect()  # after the read: not counted
print(f"{wall:.3f} {stolen:.3f} {paused:.3f} {clock.collecting - counted:.3f}")
"""


def test_a_full_collection_inside_the_interval_is_counted() -> None:
    """A full collection stops every thread; its length is the heap's, not the code's under test."""
    out = subprocess.run(
        [sys.executable, "-c", GC_CHILD, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    wall, stolen, paused, after_read = (float(x) for x in out.split())
    assert paused >= 0.05, out  # the heap made the collection long enough to tell
    # at most wall time, plus what the collection itself queued for a CPU (counted twice: bounded by
    # its length)
    assert 0.8 * paused <= stolen <= wall + paused + 0.05, out
    # the callback ended with the read: the second collection adds nothing (the run-queue part of
    # ``stolen`` is read live from /proc and may still grow on a loaded machine; it is not the
    # point)
    assert after_read == 0.0, out
