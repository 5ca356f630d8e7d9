"""A boot storm on loopback: simulated nodes and ranks against throttled S3 and Azure servers.

Each store is real (moto's S3 server, Azurite) behind ``scripts/storm_proxy.py``, which holds
the stores' published limits with token buckets (S3 per prefix, Azure per blob) and answers
``503 SlowDown`` / ``503 ServerBusy`` above them. Nodes arrive on a schedule (uniformly within
``--spread`` seconds), their ranks within 0.1 s of the node; every rank runs plancache's own
resolution with its own store client and a ``--budget`` deadline:

* ``today``: :meth:`Resolver.resolve` per rank (plan + sidecar, 2 GETs), the retries before
  this work (``deadline.LEGACY_RETRIES``: 3 tries, 50-200 ms);
* ``new``: :func:`~plancache.pipeline.plan_sets.node_plans.resolve_node` (one rank per node reads
  the world's plan set, the others wait on the node lock), full-jitter backoff with Retry-After.

``--store registry``: Debian's docker-registry (distribution 2.8) on loopback, unthrottled (a
registry publishes no per-object limit), stormed directly and through a second one in proxy mode
(a pull-through mirror, cold in the first round, warm after): requests counted from each one's
log, per node as the nodes sent them, and what reached the origin.

Scaling: ``--nodes N`` stands for 10,000 nodes by multiplying every limit by N / 10,000
(S3 5,500/s per prefix, Azure 500/s per blob), so offered load / limit is the real one.
Ranks are threads, spread over ``--processes`` processes (default 4): two shared cores cannot
hold hundreds of processes, and one process would put every simulated rank behind one
interpreter lock and one fsspec event loop, which real ranks never share. Every rank has its own
store client and its node its own plan directory and node lock (``flock`` between threads holds
as between processes: each rank opens the lock file itself). Each rank's client is made before
the storm starts, as a worker's prefetch makes it while the weights load. Prints, per store and
mode: ranks applied within the budget, p50/p99 time to a decision, requests per node, total requests
(and against the minimum), throttled answers.

    python scripts/bench_storm.py --nodes 20 --rounds 3 --spread 10
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

REAL_NODES = 10_000
S3_PREFIX_RATE = 5_500.0
AZURE_BLOB_RATE = 500.0
BURST_SECONDS = 1.0
"""Tokens a bucket holds: one second of its rate (the stores publish no burst; see
BENCHMARKS.md)."""


@dataclass
class Outcome:
    node: int
    rank: int
    applied: bool
    seconds: float
    reason: str
    note: str = ""


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)
    requests: int = 0
    throttled: int = 0
    nodes: int = 0
    minimum: int = 0

    def line(self, label: str) -> str:
        applied = sum(o.applied for o in self.outcomes) / max(1, len(self.outcomes))
        times = sorted(o.seconds for o in self.outcomes) or [0.0]
        p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
        return (
            f"{label:<14} applied {100 * applied:6.2f} %  p50 {statistics.median(times):5.2f} s  "
            f"p99 {p99:5.2f} s  req/node {self.requests / max(1, self.nodes):5.2f}  "
            f"total {self.requests:5d} ({self.requests / max(1, self.minimum):4.2f}x "
            f"min {self.minimum})  throttled {self.throttled}"
        )


# -- the proxy ----------------------------------------------------------------------------------


class Proxy:
    """``scripts/storm_proxy.py`` in a subprocess of its own (its threads off this process's
    GIL)."""

    def __init__(self, kind: str, upstream_port: int, retry_after: int | None) -> None:
        from late_ports import late_port
        from store_servers import wait_for_port

        self.port = late_port()  # the proxy's own interpreter binds it (tests/late_ports.py)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        argv = [
            sys.executable,
            str(ROOT / "scripts" / "storm_proxy.py"),
            "--kind",
            kind,
            "--upstream",
            f"127.0.0.1:{upstream_port}",
            "--port",
            str(self.port),
        ]
        if retry_after is not None:
            argv += ["--retry-after", str(retry_after)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, self.proc)

    def reset(self, rate: float, burst: float) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.endpoint}/__storm/reset?rate={rate}&burst={burst}", method="POST", data=b""
        )
        return json.loads(urllib.request.urlopen(request, timeout=10).read())

    def stats(self) -> dict[str, Any]:
        return json.loads(
            urllib.request.urlopen(f"{self.endpoint}/__storm/stats", timeout=10).read()
        )

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# -- setup: a baked world in the store ------------------------------------------------------------


def bake(
    work: Path, url: str, options: dict[str, Any], ranks: int, replicas: int
) -> tuple[list[str], Any]:
    """Sign ``ranks`` plans (one world) and push them with ``plancache push --key`` (per-plan
    objects and the plan set); returns the world's fingerprints and the trust policy."""
    from plancache.cli.main import main
    from plancache.keys.keyfile import generate_keypair
    from plancache.pipeline.trust_config import worker_policy
    from plancache.trust.plans.plan import Plan, plan_name, render_plan
    from plancache.trust.signing import sign_plan

    signer = generate_keypair(work / "ci", force=True, comment="ci")
    plans = work / "baked"
    plans.mkdir(exist_ok=True)
    now = datetime.now(timezone.utc)
    world = [f"{0x5707_0000 + random.randrange(1 << 24) * 64 + r:016x}" for r in range(ranks)]
    for rank, fp in enumerate(world):
        data = render_plan(Plan(fp, 20 << 30, 70 << 30))
        (plans / plan_name(fp)).write_bytes(data)
        sig = sign_plan(
            plan_name(fp),
            data,
            signer,
            now,
            provenance={"rank": rank, "world_size": ranks, "model": "storm"},
        )
        (plans / (plan_name(fp) + ".sig")).write_bytes(sig)
    argv = [
        "push",
        str(plans),
        url,
        "--key",
        str(work / "ci"),
        "--set-replicas",
        str(replicas),
        "--quiet",
    ]
    os.environ["PLANCACHE_STORAGE_OPTIONS"] = json.dumps(options)
    try:
        code = main(argv)
    finally:
        del os.environ["PLANCACHE_STORAGE_OPTIONS"]
    if code != 0:
        raise SystemExit(f"push failed ({code})")
    return world, worker_policy(str(work / "ci.pub"), 1)


# -- the storm -------------------------------------------------------------------------------------


def storm(
    open_rank_store: Callable[[], Any],
    policy: Any,
    world: list[str],
    nodes: int,
    spread: float,
    budget: float,
    mode: str,
    replicas: int,
    work: Path,
    stores: list[Any] | None = None,
    schedule: str = "random",
    processes: int = 1,
    remote: tuple[str, dict[str, Any], str] | None = None,
) -> list[Outcome]:
    """One storm: ``nodes`` x ``len(world)`` rank threads, each resolving its own fingerprint.

    ``processes`` > 1 spreads the nodes over that many processes (``remote``: url, options and the
    trusted-keys path, from which each process opens its ranks' own stores), so the simulated
    ranks do not share one interpreter's lock and one fsspec event loop, as real ranks never do."""
    if (
        schedule == "even"
    ):  # node i at i/N of the spread: the same offered rate, without random clumps
        offsets = [spread * i / nodes for i in range(nodes)]
    else:
        offsets = [random.uniform(0, spread) for _ in range(nodes)]
    root = Path(tempfile.mkdtemp(prefix=f"storm-{mode}-", dir=work))
    try:
        if processes <= 1 or remote is None:
            ranks = len(world)
            stores = (
                stores if stores is not None else [open_rank_store() for _ in range(nodes * ranks)]
            )
            by_rank = {(n, r): stores[n * ranks + r] for n in range(nodes) for r in range(ranks)}
            return _run_nodes(
                by_rank,
                policy,
                world,
                offsets,
                time.monotonic() + 1.0,
                budget,
                mode,
                replicas,
                root,
            )
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        barrier, results = ctx.Barrier(processes + 1), ctx.Queue()
        workers = [
            ctx.Process(
                target=_process_nodes,
                daemon=True,
                args=(
                    remote,
                    world,
                    {n: offsets[n] for n in range(k, nodes, processes)},
                    budget,
                    mode,
                    replicas,
                    str(root),
                    barrier,
                    results,
                ),
            )
            for k in range(processes)
        ]
        for w in workers:
            w.start()
        barrier.wait(600)  # every process has made its ranks' clients
        outcomes: list[Outcome] = []
        for _ in workers:
            outcomes += [Outcome(*o) for o in results.get(timeout=spread + budget + 120)]
        for w in workers:
            w.join(30)
        return outcomes
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _process_nodes(
    remote: tuple[str, dict[str, Any], str],
    world: list[str],
    offsets: dict[int, float],
    budget: float,
    mode: str,
    replicas: int,
    root: str,
    barrier: Any,
    results: Any,
) -> None:
    """One process's share of the nodes: its ranks' own stores, then the storm at the barrier."""
    from plancache.pipeline.trust_config import worker_policy
    from plancache.storage.store import open_store

    url, options, keys = remote
    by_rank = {
        (n, r): open_store(url, options, timeout=budget) for n in offsets for r in range(len(world))
    }
    for store in by_rank.values():
        _prime(store)
    policy = worker_policy(keys, 1)
    barrier.wait(600)
    done = _run_nodes(
        by_rank,
        policy,
        world,
        [offsets.get(n, 0.0) for n in range(max(offsets) + 1)],
        time.monotonic() + 1.0,
        budget,
        mode,
        replicas,
        Path(root),
        nodes=list(offsets),
    )
    results.put(
        [(o.node, o.rank, o.applied, o.seconds, o.reason, o.note) for o in done]
    )  # plain, for the parent


def _prime(store: Any) -> None:
    """Make a rank's client now (as a worker's prefetch does while the weights load)."""
    direct = store.backend.direct if not store.backend.opened else None
    if direct is not None:
        direct.client()
    else:
        store.open_backend()  # its filesystem client made


def _run_nodes(
    by_rank: dict[tuple[int, int], Any],
    policy: Any,
    world: list[str],
    offsets: list[float],
    start: float,
    budget: float,
    mode: str,
    replicas: int,
    root: Path,
    nodes: list[int] | None = None,
) -> list[Outcome]:
    """Every rank of ``nodes`` (default: all) in a thread of its own, arriving at its node's
    offset."""
    from plancache.clock import Deadline
    from plancache.pipeline.plan_sets import node_plans
    from plancache.pipeline.resolver import Resolver
    from plancache.storage import deadline as retries
    from plancache.storage.local.localdir import LocalPlanDir

    retries.LEGACY_RETRIES = mode == "today"
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def rank_boot(node: int, rank: int) -> None:
        directory = LocalPlanDir(root / f"node{node}" / "vllm" / "startup_plan")
        resolver = Resolver(directory, policy, by_rank[(node, rank)])
        time.sleep(max(0.0, start + offsets[node] + random.uniform(0, 0.1) - time.monotonic()))
        began = time.monotonic()
        deadline = Deadline(began, budget)  # the real clock's reading, taken at arrival
        try:
            if mode == "today":
                result = resolver.resolve(world[rank], deadline)
            else:
                replica = node_plans.replica_of(f"node-{node}", replicas)
                result = node_plans.resolve_node(
                    resolver, world[rank], world, deadline, replica=replica
                )
            took = time.monotonic() - began
            applied = (
                result.verified is not None and took <= budget + 0.5
            )  # the join grace of a deadline
            reason = (
                "applied"
                if applied
                else "late"
                if result.verified is not None
                else result.error.reason.value
                if result.error
                else "no-plan"
            )
            note = result.note
        except Exception as exc:
            took, applied, reason, note = (
                time.monotonic() - began,
                False,
                type(exc).__name__,
                str(exc),
            )
        with lock:
            outcomes.append(Outcome(node, rank, applied, took, reason, note))

    chosen = range(len(offsets)) if nodes is None else nodes
    threads = [
        threading.Thread(target=rank_boot, args=(n, r), daemon=True)
        for n in chosen
        for r in range(len(world))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(offsets) + budget + 30)
    retries.LEGACY_RETRIES = False
    return outcomes


def run_store(kind: str, args: argparse.Namespace, work: Path) -> list[str]:
    """Start the server and its proxy, bake, and storm it in both modes; the printed lines."""
    from plancache.storage.store import open_store
    from store_servers import AWS_ENV, MotoServer

    scale = args.nodes / REAL_NODES
    lines = []
    if kind == "s3":
        os.environ.update(AWS_ENV)
        server: Any = MotoServer()
        bucket = server.new_bucket()
        proxy = Proxy("s3", server.port, None)
        options = {**server.options, "endpoint_url": proxy.endpoint}
        url, rate = f"s3://{bucket}/fleet", S3_PREFIX_RATE * scale
    else:
        from azurite_server import Azurite, azure_connection_string, azurite_binary

        binary = azurite_binary()
        if binary is None:
            return [f"{kind}: azurite-blob not found (set AZURITE_BLOB)"]
        server = Azurite(binary)
        container = server.new_container()
        proxy = Proxy("azure", server.port, args.retry_after)
        options = {"connection_string": azure_connection_string(proxy.endpoint)}
        url, rate = f"az://{container}/fleet", AZURE_BLOB_RATE * scale
    try:
        proxy.reset(0, 1)
        (work / kind).mkdir()
        world, policy = bake(
            work / kind, url, options, args.ranks, args.replicas if kind == "azure" else 1
        )
        opener = functools.partial(open_store, url, options, timeout=args.budget)
        stores = [] if args.processes > 1 else [opener() for _ in range(args.nodes * args.ranks)]
        for store in stores:  # each rank's own client, made before the storm (as a prefetch would)
            _prime(store)
        lines.append(
            f"{kind}: {args.nodes} nodes x {args.ranks} ranks standing for {REAL_NODES} nodes; "
            f"limit {rate:.2f}/s per {'prefix' if kind == 's3' else 'blob'} (scale {scale:g}), "
            f"spread {args.spread:g} s, budget {args.budget:g} s, {args.rounds} round(s), "
            f"{args.schedule} arrivals, {args.processes} process(es)"
            + (
                f", {args.replicas} set replica(s), Retry-After {args.retry_after}"
                if kind == "azure"
                else ""
            )
        )
        for mode in ("today", "new"):
            tally = Tally()
            for _ in range(args.rounds):
                proxy.reset(rate, rate * BURST_SECONDS)
                tally.outcomes += storm(
                    opener,
                    policy,
                    world,
                    args.nodes,
                    args.spread,
                    args.budget,
                    mode,
                    args.replicas if kind == "azure" else 1,
                    work,
                    stores or None,
                    args.schedule,
                    args.processes,
                    (url, options, str(work / kind / "ci.pub")),
                )
                got = proxy.stats()
                tally.requests += got["requests"]
                tally.throttled += got["throttled"]
                tally.nodes += args.nodes
                tally.minimum += args.nodes * (2 * args.ranks if mode == "today" else 1)
                time.sleep(2)  # the buckets and the servers settle between rounds
            lines.append("  " + tally.line(mode))
            reasons: dict[str, int] = {}
            for o in tally.outcomes:
                reasons[o.reason] = reasons.get(o.reason, 0) + 1
            lines.append(f"  {'':<14} decisions {dict(sorted(reasons.items()))}")
    finally:
        proxy.stop()
        server.stop()
    return lines


def run_registry(args: argparse.Namespace, work: Path) -> list[str]:
    """The storm against a registry directly and through a mirror; the printed lines."""
    from plancache.storage.store import open_store
    from registry_server import DockerRegistry, registry_binary

    binary = registry_binary()
    if binary is None:
        return ["registry: docker-registry not found (set DOCKER_REGISTRY_BIN)"]
    origin = DockerRegistry(binary)
    mirror = DockerRegistry(binary, remote=origin.endpoint)
    lines = [
        f"registry: {args.nodes} nodes x {args.ranks} ranks, spread {args.spread:g} s, budget "
        f"{args.budget:g} s, {args.rounds} round(s) (the mirror cold in the first), "
        f"{args.schedule} arrivals, {args.processes} process(es); docker-registry 2.8, unthrottled"
    ]
    try:
        repo = origin.new_repository("fleet")
        url = origin.url(repo)
        (work / "registry").mkdir()
        world, policy = bake(work / "registry", url, {}, args.ranks, 1)
        keys = str(work / "registry" / "ci.pub")
        for target, options in (
            ("direct", {"mirror_config": "none"}),
            ("mirror", {"mirror": mirror.host, "mirror_config": "none"}),
        ):
            for mode in ("today", "new"):
                tally, reached, rounds = Tally(), 0, []
                for _ in range(args.rounds):
                    sent_before = len(
                        (mirror if target == "mirror" else origin).settled_requests(repo)
                    )
                    origin_before = len(origin.settled_requests(repo))
                    opener = functools.partial(open_store, url, options, timeout=args.budget)
                    stores = (
                        []
                        if args.processes > 1
                        else [opener() for _ in range(args.nodes * args.ranks)]
                    )
                    for store in stores:
                        _prime(store)
                    tally.outcomes += storm(
                        opener, policy, world, args.nodes, args.spread, args.budget, mode, 1, work,
                        stores or None, args.schedule, args.processes, (url, options, keys),
                    )  # fmt: skip
                    sent = (mirror if target == "mirror" else origin).settled_requests(repo)
                    tally.requests += len(sent) - sent_before
                    rounds.append(len(origin.settled_requests(repo)) - origin_before)
                    reached += rounds[-1]
                    tally.nodes += args.nodes
                    tally.minimum += args.nodes * (args.ranks if mode == "today" else 1)
                lines.append("  " + tally.line(f"{target} {mode}"))
                lines.append(f"  {'':<14} origin requests {reached} (per round {rounds})")
    finally:
        mirror.stop()
        origin.stop()
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", choices=["s3", "azure", "both", "registry"], default="both")
    ap.add_argument("--nodes", type=int, default=20, help="simulated nodes (standing for 10,000)")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--spread", type=float, default=10.0, help="seconds over which the nodes arrive"
    )
    ap.add_argument(
        "--budget", type=float, default=3.0, help="each rank's deadline (PLANCACHE_TIMEOUT)"
    )
    ap.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="copies of the plan set on Azure (push --set-replicas)",
    )
    ap.add_argument(
        "--processes",
        type=int,
        default=4,
        help="processes the simulated nodes are spread over (1: all ranks threads of this one)",
    )
    ap.add_argument(
        "--schedule",
        choices=["random", "even"],
        default="random",
        help="node arrivals: uniformly random within the spread, or evenly spaced",
    )
    ap.add_argument(
        "--retry-after", type=int, default=None, help="Retry-After seconds in Azure's ServerBusy"
    )
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="plancache-storm-"))
    try:
        for kind in ["s3", "azure"] if args.store == "both" else [args.store]:
            run = run_registry if kind == "registry" else lambda a, w, k=kind: run_store(k, a, w)
            for line in run(args, work):
                print(line, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
