#!/usr/bin/env python3
"""Store benchmarks: ratios measured side by side in one run, on loopback servers.

    python scripts/bench_store.py [--plans 1000] [--reps 5] [--rtt-ms 20] [--server moto|s3rver]

Needs the test extras (moto[server], boto3, s3fs) and awscli for the ``aws s3 sync``
comparison (``pip install awscli`` if ``aws`` is not on PATH). Starts, on 127.0.0.1 only:
an S3-protocol server in a subprocess, and a delaying TCP proxy (another subprocess) that adds
``--rtt-ms`` of round trip -- half each way, and one round trip for connection setup -- since
real buckets are not on loopback. Every figure is printed through the proxy and bare.

Servers (``--server``): ``moto`` (default; moto's server mode, one Python process, about
250-300 requests/s on 2 CPUs, so it bounds the bulk figures of both tools), or ``s3rver``
(Node.js, several times faster; objects kept in a temporary directory). The script installs
nothing; s3rver, with node >= 16 and npm, from the repository root:

    npm install --prefix .bench-tools --no-audit --no-fund s3rver@3.7.1

It is looked up as ``$S3RVER``, then ``.bench-tools/node_modules/.bin/s3rver``, then on PATH.

Targets (issue "object-store mirror", Performance):
  pull of one fingerprint (plan + sidecar, verified, written)  <= 1.3 x one boto3 get_object
  push of N signed plans (plancache push)                      <= 0.5 x aws s3 sync
                                                                  (same dir, same server)
  pull of N plans with verification (plancache pull)           <= 0.5 x aws s3 sync the other way
  black-holed store                                            <= budget + 10 %
  refused connection                                           <= 50 ms
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from plancache.storage.local.localdir import LocalPlanDir
    from plancache.trust.keyring.keys import Keyring

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

AWS_ENV = {  # s3rver knows only this key pair; moto accepts any
    "AWS_ACCESS_KEY_ID": "S3RVER",
    "AWS_SECRET_ACCESS_KEY": "S3RVER",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


# -- the delaying proxy (runs in its own process) -------------------------------------------------


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Forward bytes, each chunk released ``delay`` after it arrived (order kept)."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def release() -> None:
        while True:
            due, chunk = await queue.get()
            if not chunk:
                break
            pause = due - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            writer.write(chunk)
            await writer.drain()
        writer.close()

    task = asyncio.create_task(release())
    try:
        while True:
            chunk = await reader.read(1 << 16)
            await queue.put((time.monotonic() + delay, chunk))
            if not chunk:
                break
    except OSError:
        await queue.put((0.0, b""))
    await task


async def _proxy(listen: int, upstream: int, rtt: float) -> None:
    async def handle(creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        await asyncio.sleep(rtt)  # the TCP handshake a real connection would cost
        ureader, uwriter = await asyncio.open_connection("127.0.0.1", upstream)
        await asyncio.gather(
            _pipe(creader, uwriter, rtt / 2),
            _pipe(ureader, cwriter, rtt / 2),
            return_exceptions=True,
        )

    server = await asyncio.start_server(handle, "127.0.0.1", listen, backlog=512)
    async with server:
        await server.serve_forever()


# -- helpers --------------------------------------------------------------------------------------


def late_port() -> int:
    """A port for a server started in another process, below the ephemeral range: that process
    binds it later, and a port from binding 0 in this one could be taken meanwhile
    (tests/late_ports.py)."""
    from late_ports import late_port as below_ephemeral

    return below_ephemeral()


def wait_port(port: int) -> None:
    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} never opened")


def median_time(
    fn: Callable[[], object], reps: int, setup: Callable[[], object] | None = None
) -> float:
    times = []
    for _ in range(reps):
        if setup:
            setup()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def aws_cmd() -> list[str] | None:
    exe = shutil.which("aws")
    if exe:
        return [exe]
    if importlib.util.find_spec("awscli") is not None:
        return [sys.executable, "-m", "awscli"]
    return None


def start_server(kind: str, port: int, data: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start the S3-protocol server on 127.0.0.1:``port``; returns the process and a label."""
    if kind == "moto":
        import moto

        cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        label = f"moto {moto.__version__} server"
        env = None
    else:
        exe = (
            os.environ.get("S3RVER")
            or shutil.which("s3rver", path=str(ROOT / ".bench-tools/node_modules/.bin"))
            or shutil.which("s3rver")
        )
        if not exe:
            raise SystemExit(
                "s3rver not found: npm install --prefix .bench-tools --no-audit --no-fund "
                "s3rver@3.7.1"
            )
        version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
        data.mkdir()
        cmd = [
            exe,
            "-d",
            str(data),
            "-a",
            "127.0.0.1",
            "-p",
            str(port),
            "-s",
            "--allow-mismatched-signatures",
        ]
        label = f"s3rver {version} (node)"
        # s3rver's ListObjectsV2 continuation tokens use DES, which node 17+ only offers with this
        env = {**os.environ, "NODE_OPTIONS": "--openssl-legacy-provider"}
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    ), label


def bench_endpoint(
    label: str,
    endpoint: str,
    slug: str,
    args: argparse.Namespace,
    local: LocalPlanDir,
    one: str,
    keyring: Keyring,
    tmp: Path,
    aws: list[str] | None,
) -> None:
    """One endpoint's figures (bare loopback, or through the RTT proxy): one plan, then bulk.

    A function of its own so that the closures timed below bind this endpoint's values."""
    import boto3

    from plancache.pipeline.resolver import Resolver
    from plancache.storage.local.localdir import LocalPlanDir
    from plancache.storage.store import open_store
    from plancache.trust.plans.plan import plan_name
    from plancache.trust.policy import TrustPolicy

    cli = [sys.executable, "-m", "plancache.cli.main"]
    print(f"\n== {label} ({endpoint})")
    opts = {"endpoint_url": endpoint}
    prefix = f"single-{slug}"
    store = open_store(f"s3://bench/{prefix}", opts, 30)
    store.put(one, *local.read(one))  # type: ignore[arg-type]  # both written just before
    client = boto3.client("s3", endpoint_url=endpoint)

    def get_object() -> bytes:
        return client.get_object(Bucket="bench", Key=f"{prefix}/{plan_name(one)}")["Body"].read()

    dest = LocalPlanDir(tmp / f"pull-one-{prefix}")

    resolver = Resolver(dest, TrustPolicy.signed(keyring), store)

    def pull_one() -> None:  # the pipeline pull uses: fetch, verify, atomic write
        dest.path.mkdir(parents=True, exist_ok=True)
        for name in os.listdir(dest.path):  # each rep writes afresh, as a first pull does
            os.unlink(dest.path / name)
        [result] = resolver.pull([one])
        assert result.written, result

    for _ in range(3):  # warm connection pools on both sides
        get_object()
        pull_one()
    t_get = median_time(get_object, args.reps * 4)
    t_pull = median_time(pull_one, args.reps * 4)
    print(f"pull one fingerprint (fetch plan+sig, verify, atomic write): {t_pull * 1000:7.1f} ms")
    print(f"boto3 get_object of one object (warm client):                {t_get * 1000:7.1f} ms")
    print(f"  ratio pull / get_object = {t_pull / t_get:.2f}   (target <= 1.3)")

    env = {**os.environ, **AWS_ENV}
    counter = iter(range(10**6))
    state: dict[str, str] = {}

    def fresh_prefix() -> None:
        state["prefix"] = f"bulk-{slug}-{next(counter)}"

    def push_cli() -> None:
        subprocess.run(
            [
                *cli,
                "push",
                "--storage-option",
                f"endpoint_url={endpoint}",
                str(local.path),
                f"s3://bench/{state['prefix']}",
            ],
            check=True,
            env=env,
            capture_output=True,
        )

    def aws_push() -> None:
        assert aws
        subprocess.run(
            [
                *aws,
                "s3",
                "sync",
                "--only-show-errors",
                "--endpoint-url",
                endpoint,
                str(local.path),
                f"s3://bench/{state['prefix']}",
            ],
            check=True,
            env=env,
            capture_output=True,
        )

    t_push = median_time(push_cli, args.bulk_reps, fresh_prefix)
    print(f"plancache push of {args.plans} plans ({2 * args.plans} objects):   {t_push:7.2f} s")
    seeded = state["prefix"]
    if aws:
        t_aws_push = median_time(aws_push, args.bulk_reps, fresh_prefix)
        print(f"aws s3 sync DIR -> bucket:                          {t_aws_push:7.2f} s")
        print(f"  ratio push / aws s3 sync = {t_push / t_aws_push:.2f}   (target <= 0.5)")

    def fresh_dir() -> None:
        state["dir"] = str(tmp / f"pulled-{slug}-{next(counter)}")

    def pull_cli() -> None:
        subprocess.run(
            [
                *cli,
                "pull",
                "--trusted-keys",
                str(tmp / "key.pub"),
                "--storage-option",
                f"endpoint_url={endpoint}",
                f"s3://bench/{seeded}",
                state["dir"],
            ],
            check=True,
            env=env,
            capture_output=True,
        )
        assert len(os.listdir(state["dir"])) == 2 * args.plans

    def aws_pull() -> None:
        assert aws
        subprocess.run(
            [
                *aws,
                "s3",
                "sync",
                "--only-show-errors",
                "--endpoint-url",
                endpoint,
                f"s3://bench/{seeded}",
                state["dir"],
            ],
            check=True,
            env=env,
            capture_output=True,
        )
        assert len(os.listdir(state["dir"])) == 2 * args.plans, len(os.listdir(state["dir"]))

    t_pull_all = median_time(pull_cli, args.bulk_reps, fresh_dir)
    print(f"plancache pull of {args.plans} plans, verified:          {t_pull_all:7.2f} s")
    if aws:
        t_aws_pull = median_time(aws_pull, args.bulk_reps, fresh_dir)
        print(f"aws s3 sync bucket -> DIR (no verification):        {t_aws_pull:7.2f} s")
        print(f"  ratio pull / aws s3 sync = {t_pull_all / t_aws_pull:.2f}   (target <= 0.5)")
    else:
        print("aws s3 sync: awscli not installed (pip install awscli) -- comparison skipped")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--plans", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--bulk-reps", type=int, default=3)
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--server", choices=("moto", "s3rver"), default="moto")
    parser.add_argument(
        "--proxy",
        nargs=3,
        type=float,
        metavar=("LISTEN", "UPSTREAM", "RTT"),
        help=argparse.SUPPRESS,
    )
    args = parser.parse_args()
    if args.proxy:
        asyncio.run(_proxy(int(args.proxy[0]), int(args.proxy[1]), args.proxy[2]))
        return 0

    os.environ.update(AWS_ENV)
    from datetime import datetime, timezone

    import boto3

    from plancache.keys.keyfile import generate_keypair, load_keyring
    from plancache.storage.local.localdir import LocalPlanDir
    from plancache.storage.store import open_store
    from plancache.trust.plans.plan import Plan, plan_name, render_plan
    from plancache.trust.signing import sign_plan

    aws = aws_cmd()
    procs: list[subprocess.Popen[bytes]] = []
    tmp = Path(tempfile.mkdtemp(prefix="plancache-bench-"))
    try:
        server_port = late_port()
        server, server_label = start_server(args.server, server_port, tmp / "s3rver-data")
        procs.append(server)
        proxy_port = late_port()
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--proxy",
                    str(proxy_port),
                    str(server_port),
                    str(args.rtt_ms / 1000),
                ]
            )
        )
        wait_port(server_port)
        wait_port(proxy_port)
        endpoints = {
            "bare loopback": (f"http://127.0.0.1:{server_port}", "bare"),
            f"+{args.rtt_ms:g} ms RTT proxy": (f"http://127.0.0.1:{proxy_port}", "rtt"),
        }
        direct = endpoints["bare loopback"][0]
        s3 = boto3.client("s3", endpoint_url=direct)
        s3.create_bucket(Bucket="bench")

        signer = generate_keypair(tmp / "key", force=False, comment="bench")
        keyring = load_keyring(tmp / "key.pub")
        now = datetime.now(timezone.utc)
        local = LocalPlanDir(tmp / "plans")
        fps = [f"{i:016x}" for i in range(1, args.plans + 1)]
        for fp in fps:
            data = render_plan(Plan(fp, 10 * 2**30, 70 * 2**30))
            local.write(fp, data, sign_plan(plan_name(fp), data, signer, now))
        one = fps[0]

        print(
            f"plancache store benchmark: {args.plans} plans, {server_label}, medians "
            f"({args.reps} reps single, {args.bulk_reps} reps bulk), "
            f"python {sys.version.split()[0]}, {os.cpu_count()} cpus"
        )
        for label, (endpoint, slug) in endpoints.items():
            bench_endpoint(label, endpoint, slug, args, local, one, keyring, tmp, aws)

        print("\n== failures")
        hole = socket.socket()
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)
        budget = 3.0
        store = open_store(
            "s3://bench/x", {"endpoint_url": f"http://127.0.0.1:{hole.getsockname()[1]}"}, budget
        )
        t0 = time.perf_counter()
        error = store.fetch(one).error
        kind = error.reason.value if error is not None else "no error"
        t_hole = time.perf_counter() - t0
        print(
            f"black-holed store, {budget:g} s budget: {t_hole:.3f} s ({kind}); "
            f"ratio {t_hole / budget:.3f} (target <= 1.10)"
        )
        hole.close()
        refused = open_store(
            "s3://bench/x", {"endpoint_url": f"http://127.0.0.1:{late_port()}"}, budget
        )
        for _ in range(2):
            refused.fetch(one)

        def refused_fetch() -> None:
            refused.fetch(one)  # the error is the result

        t_refused = median_time(refused_fetch, args.reps * 4)
        print(f"refused connection: {t_refused * 1000:.1f} ms (target <= 50 ms)")
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
