"""Wall time net of the time the machine kept this process off its CPUs (for bound tests).

Why: a bound test asserts that plancache gives up by its deadline (a budget plus a grace). On
a 2-core machine running three pytest workers, two vLLM fixtures and servers, a process can sit
runnable for a second or more without running (CI: a 1 s budget "took" 2.88 s, the plugin's own
wait having ended on time). A timeout that fires late for that reason is the machine's, not the
code's; a wait that goes on past the deadline is the code's, and a thread that waits sleeps, it
does not queue. So these tests compare the bound with the wall time minus the run-queue wait of
the process's threads, which Linux counts per thread in ``/proc/self/task/<tid>/schedstat``
(second field, nanoseconds; ``CONFIG_SCHED_INFO``). A thread that ended during the interval
counts nothing (stricter); where the file is missing, nothing is subtracted (plain wall time).
"""

from __future__ import annotations

import os
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


@dataclass
class StolenClock:
    """Started at creation: :attr:`wall`, :attr:`stolen` (run-queue seconds since) and :attr:`net`."""

    pid: str = "self"
    started: float = field(default_factory=time.monotonic)
    waits: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.waits = run_queue_waits(self.pid)

    @property
    def wall(self) -> float:
        return time.monotonic() - self.started

    @property
    def stolen(self) -> float:
        """Run-queue seconds of the threads alive now, since the start (new threads: since theirs).
        Two threads waiting at once both count: at most that many times the wall time lost."""
        now = run_queue_waits(self.pid)
        return sum(max(0, wait - self.waits.get(tid, 0)) for tid, wait in now.items()) / 1e9

    def read(self) -> tuple[float, float]:
        """(wall, stolen), read together."""
        stolen = self.stolen
        return self.wall, stolen

    def describe(self) -> str:
        wall, stolen = self.read()
        return f"{wall:.2f} s wall, {stolen:.2f} s of it waiting for a CPU"
