"""One rank of a real multi-process vLLM world on CPU, driven by a test over a connection.

Run as ``python tests/vllm_rank.py ADDRESS AUTHKEY RANK TP PP PORT MODEL_DIR`` by
tests/test_vllm_ranks.py. The rank joins a gloo world through vLLM's own
``init_distributed_environment`` + ``ensure_model_parallel_initialized`` inside
``set_current_vllm_config`` (../shared/notes/test-servers.md), loads the plugin the way a
worker does, reports its fingerprint, then serves commands:

* ``{"op": "boot", "env": {...}, "free": N, "save": bool, "prefetch": bool}``: a fresh Worker
  stand-in (tests/vllm_cpu.py) with this rank, the given environment, the real
  ``Worker.determine_available_memory()``; optionally vLLM's save hook after it. Answers the
  result, the plugin's INFO line, the elapsed time and whether the profiling collective passed.
* ``{"op": "vote", "mine": bool, "budget": S}``: plancache's vote alone (``vote.agree``), its
  result.
* ``{"op": "die"}``: the process ends at once (a rank lost before the vote).
* ``{"op": "exit"}``: an orderly exit; ``{"op": "quit"}``: the log flushed, then ends at once
  (teardown).

The profiling path stands in for the GPU work with a real world-group ``all_reduce`` (the
collectives ``profile_cudagraph_memory`` runs on a GPU): in a world whose ranks disagree,
the profiling ranks' collective would wait for ranks that already returned, as on a GPU.

The test forks every rank from a zygote (tests/compile_zygote.py) that imported :data:`PRELOAD`
and ran nothing, instead of six interpreters importing vLLM each; ``RANKS_FRESH=1`` starts fresh
interpreters instead. Either way ``main`` below runs from its first line in the rank's process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import traceback
from collections.abc import Iterator
from datetime import timedelta
from multiprocessing.connection import Client
from types import SimpleNamespace
from typing import Any

import vllm_cpu

PROFILED_NON_KV = 3 * vllm_cpu.GIB

PRELOAD = (
    # vLLM's and torch's own modules that main() imports (python -X importtime): never plancache's
    # (the plugin is loaded by each rank, as a worker loads it), nothing initialised
    "torch",
    "torch.distributed",
    "vllm.plugins",
    "vllm.platforms",
    "vllm.config",
    "vllm.engine.arg_utils",
    "vllm.distributed.parallel_state",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.startup_plan",
    "tokenizers",
)
"""What the ranks' zygote imports before it forks them (a module missing here costs time only)."""


def _profiling_with_collective(timeout_s: float, outcome: dict[str, Any]) -> Any:
    """A stand-in for vLLM's ``memory_profiling`` that also runs a world collective."""

    @contextlib.contextmanager
    def memory_profiling(snapshot: Any, weights_memory: int = 0) -> Iterator[SimpleNamespace]:
        import torch
        import torch.distributed as dist
        from vllm.distributed.parallel_state import get_world_group

        t = torch.ones(1)
        try:
            work = dist.all_reduce(t, group=get_world_group().cpu_group, async_op=True)
            work.wait(timeout=timedelta(seconds=timeout_s))
            outcome["collective"] = (
                "ok" if int(t.item()) == get_world_group().world_size else f"sum {t.item()}"
            )
        except Exception as exc:
            outcome["collective"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        yield SimpleNamespace(
            total_consumed=2 * vllm_cpu.GIB,
            transient_peak_headroom=vllm_cpu.GIB,
            non_kv_cache_memory=PROFILED_NON_KV,
            after_profile=SimpleNamespace(free_memory=snapshot.free_memory - PROFILED_NON_KV),
            before_create=snapshot,
        )

    return memory_profiling


def _time_the_vote() -> dict[str, float]:
    """The plugin's vote timed from the outside (its budget and wall time, for a test's message
    when a rank held too long: the lookup's share is the rest). Test-only instrumentation."""
    from plancache.vllm_plugin import vote

    timed: dict[str, float] = {}
    agree = vote.agree

    def timed_agree(mine: bool, budget_s: float) -> Any:
        started = time.monotonic()
        try:
            return agree(mine, budget_s)
        finally:
            timed.update(vote_budget_s=budget_s, vote_s=time.monotonic() - started)

    vote.agree = timed_agree  # settle() looks it up at call time
    return timed


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.INFO:
            self.lines.append(f"{record.levelname} {record.getMessage()}")


def main() -> None:
    address, authkey, rank, tp, pp, port, model = sys.argv[1:8]
    rank_i, tp_i, pp_i = int(rank), int(tp), int(pp)
    world = tp_i * pp_i
    host, port_s = address.rsplit(":", 1)
    conn = Client((host, int(port_s)), authkey=bytes.fromhex(authkey))
    try:
        os.environ["VLLM_ENABLE_STARTUP_PLAN"] = "1"
        vllm_cpu.load_plugins_like_vllm()
        from vllm.config import set_current_vllm_config
        from vllm.distributed.parallel_state import (
            ensure_model_parallel_initialized,
            init_distributed_environment,
        )
        from vllm.v1.worker import gpu_worker, startup_plan

        vllm_cpu.pin_device()
        cfg = vllm_cpu.engine_config(model)
        cfg.parallel_config.tensor_parallel_size = tp_i
        cfg.parallel_config.pipeline_parallel_size = pp_i
        cfg.parallel_config.world_size = world
        with set_current_vllm_config(cfg):
            init_distributed_environment(
                world_size=world,
                rank=rank_i,
                local_rank=rank_i,
                distributed_init_method=f"tcp://127.0.0.1:{port}",
                backend="gloo",
            )
            ensure_model_parallel_initialized(tp_i, pp_i)
        fp = startup_plan.compute_plan_fingerprint(cfg, rank_i, world)
        hooked = gpu_worker.maybe_apply_startup_plan.__module__ == "plancache.vllm_plugin.hooks"
        conn.send({"rank": rank_i, "fingerprint": fp, "pid": os.getpid(), "hooked": hooked})
    except Exception:
        conn.send({"rank": rank_i, "error": traceback.format_exc()})
        return

    logger = logging.getLogger("vllm.plancache")
    keep = _Keep()
    logger.addHandler(keep)
    voted = _time_the_vote()
    while True:
        cmd = conn.recv()
        if cmd["op"] == "exit":
            return
        if cmd["op"] == "die":
            os._exit(3)
        # the test's teardown: the log flushed, no orderly shutdown to wait for
        if cmd["op"] == "quit":
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        if cmd["op"] == "vote":  # the vote alone, with a given budget (answers the Vote's fields)
            from plancache.vllm_plugin.vote import agree

            vote = agree(cmd["mine"], cmd["budget"])
            conn.send(
                {
                    "rank": rank_i,
                    "all_yes": vote.all_yes,
                    "noes": list(vote.noes),
                    "error": vote.error,
                    "world_size": vote.world_size,
                }
            )
            continue
        try:
            for name in [n for n in os.environ if n.startswith("PLANCACHE_")]:
                del os.environ[name]
            os.environ.update(cmd["env"])
            outcome: dict[str, Any] = {"collective": None}
            gpu_worker.memory_profiling = _profiling_with_collective(
                cmd.get("collective_s", 10.0), outcome
            )
            keep.lines.clear()
            voted.clear()
            worker = vllm_cpu.make_worker(
                gpu_worker.Worker, cfg, free=cmd.get("free", vllm_cpu.FREE)
            )
            worker.rank = worker.local_rank = rank_i
            if cmd.get("prefetch"):
                worker.load_model()
            time.sleep(cmd.get("delay", 0.0))  # a rank that reaches the vote late
            started = time.monotonic()
            kv = worker.determine_available_memory()
            outcome.update(rank=rank_i, kv=kv, elapsed=time.monotonic() - started, **voted)
            outcome["applied"] = worker.cache_config.kv_cache_memory_bytes is not None
            if cmd.get("save"):
                gpu_worker.maybe_save_startup_plan(worker, kv)
                boot = worker._plancache_boot
                if boot.push_thread is not None:
                    boot.push_thread.join(10)
                outcome["push"] = boot.push_result
            outcome["lines"] = list(keep.lines)
            conn.send(outcome)
        except Exception:
            conn.send({"rank": rank_i, "error": traceback.format_exc()})


if __name__ == "__main__":
    main()
