"""plancache's background threads leave the cores vLLM's CPU worker pinned its compute to.

vLLM's CPU worker starts with OpenMP's affinity in its environment (``GOMP_CPU_AFFINITY``,
by ``vllm.utils.ompmultiprocessing``) and libgomp pins its first thread there as torch loads;
every thread started from it inherits the pin. The real-thread tests below rebuild that
process shape (a child whose main thread is pinned, as libgomp does, with the variable set)
and start plancache's own :class:`Prefetch` thread in it; an operator's pin (``taskset``: the
whole process, no OpenMP variable) is never undone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plancache.vllm_plugin.prefetch import MAX_CPU, omp_cpus, spare_cpus

SRC = Path(__file__).resolve().parents[1] / "src"

CHILD = """
import json, os, sys, threading, time
os.sched_setaffinity(0, {pin})  # what libgomp (or taskset) did before any plugin ran
from plancache.clock import Deadline
from plancache.vllm_plugin.prefetch import Prefetch

def task():
    seen = {{}}
    helper = threading.Thread(target=lambda: seen.update(helper=sorted(os.sched_getaffinity(0))))
    # a thread the fetch starts (the header's inflate pool) inherits it
    helper.start(); helper.join()
    return {{"fetch": sorted(os.sched_getaffinity(0)), **seen}}

done, value = Prefetch("k", Deadline.after(30), task).start().result()
print(json.dumps({{**value, "main": sorted(os.sched_getaffinity(0))}}))
"""


LAUNCHER = """
import json, os, subprocess, sys
siblings = []
# the node's other ranks (pinned) or vLLM's helpers (not), started by the same parent
for pin in {siblings}:
    code = ("import os, time; " + (f"os.sched_setaffinity(0, {{pin}}); " if pin else "")
            + "print('ready', flush=True); time.sleep(60)")
    siblings.append(
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    )
    assert siblings[-1].stdout.readline().strip() == "ready"
try:
    env = {{**os.environ, **json.loads(sys.argv[2])}}
    sys.exit(subprocess.call([sys.executable, "-c", sys.argv[1]], env=env))
finally:
    for sibling in siblings:
        sibling.kill()
"""
"""The child's parent, with no OpenMP variable of its own (as vLLM's engine process)."""

# vLLM's CPU platform code, imported in this process by other tests, preloads libgomp for its
# children (LD_PRELOAD): with an OpenMP variable, that would pin the launcher too.
OPENMP = ("GOMP_CPU_AFFINITY", "KMP_AFFINITY", "OMP_PLACES", "LD_PRELOAD")


def _child(
    pin: set[int], siblings: tuple[set[int] | None, ...] = (), **env: str
) -> dict[str, list[int]]:
    """CHILD's affinities, with ``env`` added to its environment only, run by a parent of its
    own whose other children are ``siblings`` (each pinned to its CPUs, or not pinned: None)."""
    clean = {k: v for k, v in os.environ.items() if k not in OPENMP}
    launcher = LAUNCHER.format(siblings=[sorted(c) if c else None for c in siblings])
    out = subprocess.run(
        [sys.executable, "-c", launcher, CHILD.format(pin=sorted(pin)), json.dumps(env)],
        capture_output=True,
        text=True,
        env={**clean, "PYTHONPATH": str(SRC)},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _cpus() -> list[int]:
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no thread affinity on this platform")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU: nothing to move to")
    return cpus


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"GOMP_CPU_AFFINITY": "0"}, {0}),
        ({"GOMP_CPU_AFFINITY": "0 1 2"}, {0, 1, 2}),
        ({"GOMP_CPU_AFFINITY": "0-2 5"}, {0, 1, 2, 5}),
        ({"KMP_AFFINITY": "granularity=fine,explicit,proclist=[2,3]"}, {2, 3}),
        ({"KMP_AFFINITY": "granularity=fine,compact"}, set()),
        ({"OMP_PLACES": "{0,1}"}, {0, 1}),
        ({"OMP_PLACES": "cores"}, set()),
        ({}, set()),
    ],
)
def test_omp_cpus_reads_what_vllm_sets(env: dict[str, str], expected: set[int]) -> None:
    assert omp_cpus(env) == expected


def test_a_range_typo_is_bounded() -> None:
    # no 10**14-element set
    assert max(omp_cpus({"GOMP_CPU_AFFINITY": "0-99999999999999"})) == MAX_CPU
    assert omp_cpus({"GOMP_CPU_AFFINITY": "99999999999999"}) == set()


def test_spare_cpus_only_undoes_an_openmp_pin() -> None:
    everything, compute = frozenset({0, 1, 2, 3}), frozenset({0, 1})
    assert spare_cpus(compute, everything, compute) == {2, 3}  # vLLM's pin: move to the rest
    # not exactly OpenMP's: someone else's pin
    assert spare_cpus(frozenset({0}), everything, compute) == set()
    assert spare_cpus(everything, everything, compute) == set()  # not pinned (a GPU worker)
    # no OpenMP variable: the operator's
    assert spare_cpus(compute, everything, frozenset()) == set()
    # started on vLLM's cores only: nowhere to go
    assert spare_cpus(compute, compute, compute) == set()
    # rank 1 is pinned to 2
    assert spare_cpus(compute, everything, compute, siblings=lambda: frozenset({2})) == {3}


def test_an_unpinned_thread_asks_nothing_about_its_siblings() -> None:
    """A GPU worker's thread (or an operator's pin) reads no /proc: the siblings are asked for
    only once the thread's CPUs are vLLM's OpenMP pin."""

    def never() -> frozenset[int]:
        raise AssertionError("siblings asked for an unpinned thread")

    everything, compute = frozenset({0, 1, 2, 3}), frozenset({0, 1})
    assert spare_cpus(everything, everything, compute, siblings=never) == set()
    assert spare_cpus(frozenset({0}), everything, compute, siblings=never) == set()
    assert spare_cpus(compute, everything, frozenset(), siblings=never) == set()


def test_a_fetch_started_from_vllms_pinned_thread_runs_on_the_other_cpus() -> None:
    cpus = _cpus()
    # an unpinned sibling takes no CPU
    seen = _child({cpus[0]}, (None,), GOMP_CPU_AFFINITY=str(cpus[0]))
    assert seen["main"] == [cpus[0]]  # vLLM's thread keeps its core
    assert seen["fetch"] == cpus[1:]
    assert seen["helper"] == cpus[1:]


@pytest.mark.parametrize("env", [{}, {"GOMP_CPU_AFFINITY": "1-3"}], ids=["taskset", "other-cpus"])
def test_an_operators_pin_is_kept(env: dict[str, str]) -> None:
    cpus = _cpus()
    seen = _child({cpus[0]}, **env)
    assert seen["fetch"] == seen["helper"] == seen["main"] == [cpus[0]]


def test_the_other_ranks_cores_are_not_taken_either() -> None:
    """Two CPU ranks of one node are siblings (one parent), each pinned to its own cores: a
    fetch in one rank moves off its own cores and off the other rank's, or stays if none is left."""
    cpus = _cpus()
    seen = _child({cpus[0]}, ({cpus[-1]}, None), GOMP_CPU_AFFINITY=str(cpus[0]))
    expected = cpus[1:-1] or [cpus[0]]  # two CPUs: both are some rank's, the fetch stays
    assert seen["fetch"] == seen["helper"] == expected
