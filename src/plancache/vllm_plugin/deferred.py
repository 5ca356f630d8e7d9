"""The writes a boot makes after its plan decision, overlapped with vLLM's profile run.

Why: a local signed hit's own work is about a millisecond, and two of its writes cost as much on
an ordinary ext4 disk: making the crash-loop note durable (an fsync of the note and one of its
directory, one journal commit each: 0.3-0.6 ms, more while other jobs write) and the boot
record's first write (a new file renamed into place, ~0.3 ms). Neither has to finish before
``maybe_apply_startup_plan`` returns, only before what depends on it:

- the note protects against a node reset *while the plan's KV cache is in use*. vLLM sizes and
  allocates that cache after ``determine_available_memory`` returns its number; inside it, with
  ``kv_cache_memory_bytes`` set, vLLM still runs a profile pass to compile the model (seconds
  on a GPU) that does not depend on the plan. So the note is made durable on a thread started
  at the decision, and :func:`wait` joins it in the hook around ``determine_available_memory``,
  before that number is returned (``after_profiling``);
- the record is rewritten whole at each event of the boot: every later write waits for this
  one first (:mod:`.record`), so a newer document is never overwritten by an older one.

Where the plugin does not wrap the worker's ``determine_available_memory`` (a worker class it
does not know), nothing would join the thread before the KV cache: the note is then made
durable before the vote, as before (:func:`can_defer`).

The thread is a plain ``_thread`` one: ``threading.Thread.start`` waits for the new thread to
run (a context switch, ~90 µs here), which is most of what the deferral saves. A forked child
never waits for its parent's writes (they are the parent's; the thread does not exist there).
"""

from __future__ import annotations

import _thread
import os
from collections.abc import Callable

from . import plugin_state


class DeferredWrites:
    """``tasks`` run in order on one background thread (on this one, at once, when no thread can
    be started), each failure kept, none raised."""

    def __init__(self, tasks: list[tuple[str, Callable[[], None]]]) -> None:
        self._tasks = tasks
        # held until every task ran: a bare lock, not a threading.Event (a Condition and a lock
        # made on the critical path for one wait)
        self._running = _thread.allocate_lock()
        self._running.acquire()
        self._pid = os.getpid()
        self.failures: list[tuple[str, BaseException]] = []
        try:
            _thread.start_new_thread(self._run, ())
        except RuntimeError:  # no thread to be had (a pod's pids limit): the writes are made now
            self._run()  # (raised out of apply, after the plan was set: a boot said to profile)

    def _run(self) -> None:
        try:
            for what, task in self._tasks:
                try:
                    task()
                except BaseException as exc:  # kept for the join, which says it once
                    self.failures.append((what, exc))
        finally:
            self._running.release()

    def wait(self) -> list[tuple[str, BaseException]]:
        """Block until every task ran; the failures (what, exception). In a forked child (the
        thread is the parent's, and does not exist there): nothing to wait for."""
        if os.getpid() == self._pid:
            with self._running:  # released once the tasks ran; released again for the next wait
                pass
        return self.failures


def can_defer(worker: object) -> bool:
    """Whether a deferred write would be joined before the worker's KV cache is sized: the
    worker's ``determine_available_memory`` is the plugin's wrapper."""
    return plugin_state.marked(getattr(type(worker), "determine_available_memory", None))


def wait(pending: DeferredWrites | None) -> list[tuple[str, BaseException]]:
    """:meth:`DeferredWrites.wait`, for a boot or a record that may have none."""
    return pending.wait() if pending is not None else []
