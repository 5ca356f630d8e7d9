"""The suite's own scheduler (tests/held_workers.py): a third worker waits for the vLLM files, then
works.

Driven as xdist's controller drives it (collections in, ``schedule()``, one ``mark_test_complete``
per report), with workers that record what they are sent.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
pytest.importorskip("xdist")
from held_workers import HeldBackLoadFile

FILES = (
    "test_engine_e2e.py",
    "test_compile_cache_vllm.py",
    "test_quick.py",
    "test_bound1.py",
    "test_bound2.py",
    "test_bound3.py",
    "test_other.py",
    "test_last.py",
)
COLLECTION = [f"tests/{name}::t{i}" for name in FILES for i in range(4)]


class Worker:
    def __init__(self, number: int) -> None:
        self.gateway = SimpleNamespace(id=f"gw{number}")
        self.shutting_down = False
        self.sent: list[str] = []
        self.done: list[str] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += [COLLECTION[i] for i in indices]

    def shutdown(self) -> None:
        self.shutting_down = True


def started(
    workers: int,
    heavy: frozenset[str],
    kind: type = HeldBackLoadFile,
    deadline: frozenset[str] | None = None,
) -> tuple[Any, list[Worker]]:
    config = SimpleNamespace(
        getvalue=lambda name: [f"{workers}*popen"], option=SimpleNamespace(loadscopereorder=False)
    )
    deadline = DEADLINE if deadline is None else deadline
    sched = (
        kind(config, None, base=2, heavy=heavy, deadline=deadline)
        if kind is HeldBackLoadFile
        else kind(config, None)
    )
    nodes = [Worker(i) for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, COLLECTION)
    sched.schedule()
    return sched, nodes


def finish(sched: Any, node: Worker, nodeid: str) -> None:
    sched.mark_test_complete(node, COLLECTION.index(nodeid))
    node.done.append(nodeid)


def drain(sched: Any, nodes: list[Worker], seen: list[int] | None = None) -> list[tuple[str, str]]:
    """Run everything, one test at a time round the workers; every (worker, test) in the order sent.
    As xdist's workers do, a worker runs its last test only once it is sent more or shut down
    (pytest needs the next item); a round in which no worker can run a test ends the drain.
    ``seen`` gets, each round, the files whose tests the workers run side by side."""
    while True:
        ready = [n for n in nodes if len(n.done) < len(n.sent) - (0 if n.shutting_down else 1)]
        if not ready:
            break
        if seen is not None:
            seen.append([n.sent[len(n.done)].split("::")[0].split("/")[-1] for n in ready])
        for node in ready:
            if len(node.done) < len(node.sent) - (0 if node.shutting_down else 1):
                finish(sched, node, node.sent[len(node.done)])
    return [(n.gateway.id, t) for n in nodes for t in n.sent]


HEAVY = frozenset(FILES[:2])
DEADLINE = frozenset(FILES[3:6])


def test_the_third_worker_waits_for_every_heavy_file_then_takes_the_next_one() -> None:
    sched, (first, second, third) = started(3, HEAVY)
    assert first.sent == COLLECTION[0:4] and second.sent == COLLECTION[4:8] and third.sent == []

    for nodeid in COLLECTION[
        4:8
    ]:  # the compile file done: its worker goes on, the third still waits
        finish(sched, second, nodeid)
    assert second.sent[4:] and third.sent == [] and not third.shutting_down
    for nodeid in COLLECTION[0:3]:
        finish(sched, first, nodeid)
    assert third.sent == []
    taken = first.sent + second.sent
    finish(sched, first, COLLECTION[3])  # the engine file's last test: the third worker is let in
    assert third.sent and set(third.sent).isdisjoint(taken)

    drain(sched, [first, second, third])
    assert sorted(first.sent + second.sent + third.sent) == sorted(
        COLLECTION
    )  # each test once, none lost
    assert sched.tests_finished


def test_without_a_heavy_file_in_the_run_every_worker_starts_at_once() -> None:
    _, workers = started(3, frozenset({"test_absent.py"}))
    assert all(w.sent for w in workers)


def test_two_workers_are_xdists_loadfile() -> None:
    from xdist.scheduler import LoadFileScheduling

    assert drain(*started(2, HEAVY)) == drain(*started(2, HEAVY, LoadFileScheduling))


def test_a_held_worker_is_shut_down_when_nothing_is_left_for_it() -> None:
    sched, (first, second, third) = started(3, HEAVY, deadline=frozenset())
    for nodeid in COLLECTION[4:]:  # the second worker drains the queue while the engine file runs
        if nodeid in second.sent:
            finish(sched, second, nodeid)
    assert not sched.workqueue and third.sent == []
    drain(sched, [first, second, third])
    assert third.sent == [] and third.shutting_down and sched.tests_finished


def test_a_crashed_worker_is_replaced_by_the_held_one() -> None:
    sched, (first, second, third) = started(3, HEAVY)
    finish(sched, first, COLLECTION[0])
    crashed = sched.remove_node(first)  # as xdist does when gw0 dies in the engine file
    assert crashed == COLLECTION[1]
    assert third.sent  # two workers are working again, while the heavy files are unfinished
    drain(sched, [second, third])
    assert set(second.sent + third.sent) >= set(COLLECTION[1:4])  # the dead worker's file ran again
    assert sched.tests_finished


def test_no_more_than_two_deadline_files_run_at_once() -> None:
    sched, workers = started(3, HEAVY)
    seen: list[list[str]] = []
    drain(sched, workers, seen)
    assert (
        max(sum(name in DEADLINE for name in side) for side in seen) == 2
    )  # three queued: one waited
    assert sorted(t for w in workers for t in w.sent) == sorted(COLLECTION) and sched.tests_finished
    assert all(w.shutting_down for w in workers)


def test_a_worker_whose_next_file_would_be_a_third_deadline_file_takes_the_one_behind_it() -> None:
    """The quick files queued behind the deadline files fill the cores beside them: a worker never
    takes a third deadline file, and never waits while another file is queued."""
    sched, (first, second, third) = started(3, HEAVY)
    for node, heavy in ((first, COLLECTION[0:4]), (second, COLLECTION[4:8])):
        for nodeid in heavy:
            finish(sched, node, nodeid)
    # the quick file on the first worker, a deadline file on each of the others
    assert {files(w) for w in (first, second, third)} == {
        ("test_quick.py",),
        ("test_bound1.py",),
        ("test_bound2.py",),
    }
    quick = next(w for w in (first, second, third) if files(w) == ("test_quick.py",))
    for nodeid in COLLECTION[8:10]:
        finish(sched, quick, nodeid)  # two tests left: it is sent its next file
    assert files(quick) == ("test_quick.py", "test_other.py")
    assert list(sched.workqueue) == ["tests/test_bound3.py", "tests/test_last.py"]
    drain(sched, [first, second, third])
    assert (
        sorted(t for w in (first, second, third) for t in w.sent) == sorted(COLLECTION)
        and sched.tests_finished
    )


def files(worker: Worker) -> tuple[str, ...]:
    """The files of the tests the worker was sent and has not run, in order."""
    return tuple(
        dict.fromkeys(t.split("::")[0].split("/")[-1] for t in worker.sent[len(worker.done) :])
    )
