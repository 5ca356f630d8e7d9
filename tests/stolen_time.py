"""Wall time net of the time the machine kept this process off its CPUs (for bound tests).

Why: a bound test asserts that plancache gives up by its deadline (a budget plus a grace). On
a 2-core machine running three pytest workers, two vLLM fixtures and servers, a process can sit
runnable for a second or more without running (CI: a 1 s budget "took" 2.88 s, the plugin's own
wait having ended on time). A timeout that fires late for that reason is the machine's, not the
code's; a wait that goes on past the deadline is the code's, and a thread that waits sleeps, it
does not queue. So these tests compare the bound with the wall time minus the run-queue wait of
the process's threads, which Linux counts per thread in ``/proc/self/task/<tid>/schedstat``
(second field, nanoseconds; ``CONFIG_SCHED_INFO``). Where the file is missing, nothing is
subtracted (plain wall time).

A thread that ends during the interval takes its counter with it, and plancache's own threads
(the plan prefetch, the store's reads) end before the boot does: counting only the threads alive
at the end missed the wait of the one that did the waiting (CI-like run, 2026-12-04: a prefetch
boot "took" 1.50 s against a 1.0 s budget with 0.06 s counted). So the clock samples every
thread's counter every :data:`SAMPLE_S` on a thread of its own (not counted) and keeps the last
figure of each; an ended thread counts up to its last sample (at most one period short).

Python's cyclic garbage collector stops every thread of the process while it runs, and its full
collections scan the whole heap: in a pytest worker that imported vLLM one took 0.77 s, set off
inside a bound test's boot by whatever allocated next (2026-12-05: a 1 s budget "took" 1.87 s with
0.09 s of run-queue wait, the plugin's own wait 1.09 s). The heap is the test runner's, not the
boot's, so the clock counts the collector's pauses too (``gc.callbacks``) and nets them out with
the run-queue wait.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from dataclasses import dataclass, field


def run_queue_waits(pid: str = "self") -> dict[str, int]:
    """Nanoseconds each thread of ``pid`` has spent runnable but not running, by thread id."""
    waits: dict[str, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return waits
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as stats:
                waits[tid] = int(stats.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return waits


SAMPLE_S = 0.02


@dataclass
class StolenClock:
    """Started at creation: :attr:`wall` and :attr:`stolen` (run-queue seconds since), read together
    by :meth:`read`."""

    pid: str = "self"
    started: float = field(default_factory=time.monotonic)
    waits: dict[str, int] = field(init=False)
    seen: dict[str, int] = field(init=False)
    """Each thread's latest counter, ended threads included (the sampler's and the reads')."""

    def __post_init__(self) -> None:
        self.waits = run_queue_waits(self.pid)
        self.seen = dict(self.waits)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.collecting = 0.0
        """Seconds the garbage collector held the process since the start (every thread stops)."""
        self._collection_began: float | None = None
        gc.callbacks.append(self._collection)
        sampler = threading.Thread(target=self._sample, name="stolen-clock", daemon=True)
        sampler.start()  # returns once the thread runs, its native id set
        self._sampler_tid = str(sampler.native_id)

    def _collection(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._collection_began = time.monotonic()
        elif self._collection_began is not None:
            self.collecting += time.monotonic() - self._collection_began
            self._collection_began = None

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._update()

    def _update(self) -> None:
        now = run_queue_waits(self.pid)
        with self._lock:
            for tid, wait in now.items():
                self.seen[tid] = max(wait, self.seen.get(tid, 0))

    @property
    def wall(self) -> float:
        return time.monotonic() - self.started

    @property
    def queued(self) -> float:
        """Run-queue seconds of the process's threads since the start (threads started since:
        since theirs; ended ones: up to their last sample), the clock's own sampler left out.
        Two threads waiting at once both count: at most that many times the wall time lost."""
        self._update()
        with self._lock:
            return (
                sum(
                    max(0, wait - self.waits.get(tid, 0))
                    for tid, wait in self.seen.items()
                    if tid != self._sampler_tid
                )
                / 1e9
            )

    @property
    def stolen(self) -> float:
        """What the machine and the test runner took: run-queue waits plus the collector's pauses
        (a collection that queued for a CPU counts twice: bounded by its own length)."""
        return self.queued + self.collecting

    def read(self) -> tuple[float, float]:
        """(wall, stolen), read together; the sampler and the collector's callback stop."""
        stolen = self.stolen
        wall = self.wall
        self._stop.set()
        if self._collection in gc.callbacks:
            gc.callbacks.remove(self._collection)
        return wall, stolen

    def describe(self) -> str:
        wall, stolen = self.read()
        return f"{wall:.2f} s wall, {stolen:.2f} s of it waiting for a CPU or the garbage collector"
