"""A store fetch running in a background thread while vLLM loads the weights.

The worker's critical path then only waits for what is left of the budget: with weights
taking seconds, the store client's import (s3fs alone ≈ 0.5 s), the round trip, the
verification and the local write are all done by the time ``determine_available_memory``
asks for the plan.

Every such thread first leaves the cores vLLM's CPU worker pinned its compute to
(:func:`off_compute_cores`). That worker starts with OpenMP's affinity in its environment
(``GOMP_CPU_AFFINITY``, ``KMP_AFFINITY``'s ``proclist`` or ``OMP_PLACES``, set by
``vllm.utils.ompmultiprocessing``); the OpenMP runtime pins its first thread there as torch
loads, and every thread started from it inherits that, while vLLM keeps the node's other CPUs
for its engine process, idle while the worker warms up. The header's fetch (26 MB down, 149 MiB
inflated, hashed and written: about 1 s of CPU) on vLLM's one core beside the model's warm-up
added 1.2-1.8 s to ``init engine`` (measured, BENCHMARKS.md). Only an OpenMP pin is undone,
never one the operator set (``taskset``, ``numactl``, a cgroup): the thread moves to the CPUs
its process was started with (its parent's) minus vLLM's compute cores and those its sibling
processes (the node's other CPU ranks) are pinned to, and only when its own CPUs are exactly
those OpenMP names. Where vLLM pinned nothing (a GPU worker) or no CPU is left, nothing changes.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Generic, TypeVar

from ..clock import Stopwatch

if TYPE_CHECKING:
    from ..clock import Deadline

T = TypeVar("T")

OMP_AFFINITY_ENV = ("GOMP_CPU_AFFINITY", "KMP_AFFINITY", "OMP_PLACES")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
MAX_CPU = 1 << 16
"""CPU ids beyond any machine's (Linux allows 8192): a range past it is a typo, not a pin."""


def _affinity(pid: int) -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(pid))
    except (AttributeError, OSError):  # not Linux, or no such process
        return frozenset()


def omp_cpus(environ: Mapping[str, str]) -> frozenset[int]:
    """The CPUs that vLLM told OpenMP to bind its compute threads to (empty: none)."""
    for name in OMP_AFFINITY_ENV:
        value = environ.get(name, "")
        if name == "KMP_AFFINITY":
            value = value.partition("proclist=")[2].partition("]")[0]
        cpus = {
            c
            for lo, hi in _RANGE.findall(value)
            for c in range(int(lo), min(int(hi or lo), MAX_CPU) + 1)
        }
        if cpus:
            return frozenset(cpus)
    return frozenset()


def spare_cpus(
    own: frozenset[int],
    started_with: frozenset[int],
    compute: frozenset[int],
    *,
    siblings: Callable[[], frozenset[int]] = frozenset,
) -> frozenset[int]:
    """Where a background thread should run: ``started_with`` minus ``compute`` and the CPUs
    ``siblings()`` (the other ranks of the node) are pinned to, if ``own`` is vLLM's OpenMP pin
    (exactly ``compute``); else empty (stay). ``siblings`` is asked only then: a GPU worker's
    threads read nothing from /proc."""
    if not compute or own != compute:
        return frozenset()
    return started_with - compute - siblings()


def _sibling_pins(parent: int, started_with: frozenset[int]) -> frozenset[int]:
    """The CPUs the parent's other children are pinned to (narrower than the parent's own): the
    compute cores of this node's other CPU ranks, which a background thread must not take either."""
    pinned: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{parent}/task")
    except OSError:
        return frozenset()
    for task in tasks:
        try:
            with open(f"/proc/{parent}/task/{task}/children") as children:
                pids = [int(pid) for pid in children.read().split()]
        except (OSError, ValueError):
            continue
        for pid in pids:
            cpus = _affinity(pid) if pid != os.getpid() else frozenset()
            if cpus and cpus < started_with:
                pinned |= cpus
    return frozenset(pinned)


def off_compute_cores() -> None:
    """Move the calling background thread (and the threads it starts, which inherit it) to the
    spare CPUs (the module says which and why); call it first thing in the thread. Never
    raises: where it cannot move the thread (CPUs outside this cgroup's set), the thread stays."""
    try:
        parent = os.getppid()
        started_with = _affinity(parent)
        spare = spare_cpus(
            _affinity(0),
            started_with,
            omp_cpus(os.environ),
            siblings=lambda: _sibling_pins(parent, started_with),
        )
        if spare:
            os.sched_setaffinity(0, spare)
    except Exception:
        pass


class Prefetch(Generic[T]):
    """Runs ``task`` once in a daemon thread; :meth:`result` waits until ``deadline``; the
    task's start and end are read on the deadline's clock."""

    def __init__(self, key: str, deadline: Deadline, task: Callable[[], T]) -> None:
        self.key = key
        self.deadline = deadline
        self._watch = Stopwatch.started(deadline.clock)
        self.started = self._watch.start
        self.finished: float | None = None
        self._task = task
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"plancache-prefetch-{key}", daemon=True
        )

    def start(self) -> Prefetch[T]:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            off_compute_cores()
            self._value = self._task()
        except BaseException as exc:
            self._error = exc
        finally:
            self.finished = self.deadline.clock.monotonic()
            self._done.set()

    def took_ms(self) -> float:
        """Milliseconds the task ran: to its end, or so far while it still runs."""
        if self.finished is None:
            return self._watch.elapsed_ms()
        return self._watch.ms_until(self.finished)

    def result(self) -> tuple[bool, T | None]:
        """(finished?, value), waiting at most until the task's deadline.

        Raises:
            BaseException: what the task raised, re-raised as it was (the caller's to handle).
        """
        if not self._done.wait(max(0.0, self.deadline.remaining())):
            return False, None
        if self._error is not None:
            raise self._error
        return True, self._value
