#!/usr/bin/env python3
"""What the rank vote adds to a boot at world size 2, on real gloo through vLLM's own init.

    .venv/bin/python scripts/bench_vote.py [--votes 200]

Starts two processes that join a gloo world through vLLM's ``init_distributed_environment`` +
``ensure_model_parallel_initialized`` (TP=2, as tests/vllm_rank.py does), then each times, in
one run and interleaved: ``vote.agree(True, budget)`` (both rounds) and one bare ``all_gather``
of a float over the same group (the least any vote costs). Rank 0 prints medians and the
difference. Target (issue "Fleet-safe vLLM plugin"): the vote adds <= 5 ms at world size 2.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))


def rank_main(rank: int, port: int, model: str, votes: int) -> None:
    import vllm_cpu

    os.environ.update(vllm_cpu.cpu_environ(Path(model).parent / f"cache{rank}"))
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import (
        ensure_model_parallel_initialized,
        get_world_group,
        init_distributed_environment,
    )

    from plancache.vllm_plugin import vote

    vllm_cpu.pin_device()
    cfg = vllm_cpu.engine_config(Path(model))
    cfg.parallel_config.tensor_parallel_size = 2
    cfg.parallel_config.world_size = 2
    with set_current_vllm_config(cfg):
        init_distributed_environment(
            world_size=2,
            rank=rank,
            local_rank=rank,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            backend="gloo",
        )
        ensure_model_parallel_initialized(2, 1)
    world = get_world_group()
    bare, voted = [], []
    for i in range(votes + 20):
        start = time.perf_counter()
        vote._gather(world, 1.0, 5.0)
        mid = time.perf_counter()
        result = vote.agree(True, 5.0)
        end = time.perf_counter()
        assert result.all_yes, result
        if i >= 20:  # warm-up
            bare.append(mid - start)
            voted.append(end - mid)
    if rank == 0:
        b, v = statistics.median(bare) * 1000, statistics.median(voted) * 1000
        print(
            f"vote at world size 2 (gloo, vLLM's world group): {v:.2f} ms median over {votes}; "
            f"one bare all_gather {b:.2f} ms; the vote adds {v:.2f} ms to a boot (target <= 5 ms)"
        )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--votes", type=int, default=200)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.port, args.model, args.votes)
        return 0
    import vllm_cpu
    from late_ports import late_port

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny"
        vllm_cpu.write_tiny_model(model)
        port = late_port()  # rank 0's TCPStore binds it after importing vLLM (tests/late_ports.py)
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--votes",
                    str(args.votes),
                    "--rank",
                    str(r),
                    "--port",
                    str(port),
                    "--model",
                    str(model),
                ]
            )
            for r in (0, 1)
        ]
        return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main())
