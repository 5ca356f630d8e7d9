#!/usr/bin/env python3
"""Whole-process cost of a boot-time pull: ``plancache pull --fingerprint FP URL DIR`` against a
minimal Python script doing the same two GETs with boto3 and writing the plan file.

    python scripts/bench_cli.py [--reps 15]

Both run as fresh processes (interpreter start, imports, the two GETs, the write), interleaved,
against the same moto S3 server on 127.0.0.1, with the same credentials and endpoint from the
environment. The pull also verifies the signature and writes plan and sidecar atomically; the
boto3 script does neither, so it is the floor. Prints the medians and their ratio
(target, issue 50 item 7 (c): <= 1.0), then which modules the pull imported beyond the boto3
script's.
Needs the test extras (moto[server], boto3, s3fs).
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

TARGET = 1.0
"""A boot-time pull of one plan is no slower than the boto3 script (issue 50 item 7 (c))."""

BOTO3_SCRIPT = """
import os, sys, boto3
from concurrent.futures import ThreadPoolExecutor
bucket, prefix, fp, out = sys.argv[1:5]
s3 = boto3.client("s3")
def get(name):
    return s3.get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"].read()
with ThreadPoolExecutor(2) as pool:
    plan, sig = pool.map(get, [f"startup_plan_{fp}.json", f"startup_plan_{fp}.json.sig"])
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, f"startup_plan_{fp}.json"), "wb") as f:
    f.write(plan)
"""


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    return elapsed


def imported(cmd: list[str], env: dict[str, str]) -> set[str]:
    """Top-level packages a command imports (``python -X importtime``, from its stderr)."""
    done = subprocess.run(
        [cmd[0], "-X", "importtime", *cmd[1:]], env=env, capture_output=True, text=True
    )
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=15, help="runs of each side (default 15)")
    args = parser.parse_args()

    # An installed wheel has its bytecode (pip compiles at install), as boto3's side has here;
    # this machine sets PYTHONDONTWRITEBYTECODE=1, so a source tree would compile on every run.
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(ROOT / "src")],
        check=True,
        capture_output=True,
    )
    from conftest import FP, plan_bytes
    from plancache.keys.keyfile import generate_keypair
    from plancache.pipeline.resolver import utcnow
    from plancache.storage.store import open_store
    from plancache.trust.plans.plan import plan_name
    from plancache.trust.signing import sign_plan
    from store_servers import AWS_ENV, MotoServer

    server = MotoServer()
    try:
        bucket = server.new_bucket()
        url = f"s3://{bucket}/plans"
        with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
            signer = generate_keypair(Path(tmp) / "key", force=False, comment="bench")
            data = plan_bytes()
            store = open_store(url, server.options, 30)
            store.put(FP, data, sign_plan(plan_name(FP), data, signer, utcnow()))
            env = {
                **os.environ,
                **AWS_ENV,
                "AWS_ENDPOINT_URL": server.endpoint,
                "PYTHONPATH": os.pathsep.join(
                    [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
                ),
            }
            script = Path(tmp) / "minimal_boto3.py"
            script.write_text(BOTO3_SCRIPT)
            pull = [
                sys.executable,
                "-m",
                "plancache.cli.main",
                "pull",
                "--trusted-keys",
                str(Path(tmp) / "key.pub"),
                "--fingerprint",
                FP,
                url,
            ]
            floor = [sys.executable, str(script), bucket, "plans", FP]
            t_pull: list[float] = []
            t_floor: list[float] = []
            for rep in range(args.reps + 1):
                a = timed([*pull, f"{tmp}/pull-{rep}"], env)
                b = timed([*floor, f"{tmp}/floor-{rep}"], env)
                if rep:  # the first round warms the page cache and moto
                    t_pull.append(a)
                    t_floor.append(b)
            extra = sorted(
                imported([*pull, f"{tmp}/imp-a"], env) - imported([*floor, f"{tmp}/imp-b"], env)
            )
    finally:
        server.stop()
    m_pull, m_floor = statistics.median(t_pull), statistics.median(t_floor)
    print(
        f"plancache pull --fingerprint (whole process): median {m_pull * 1000:6.0f} ms "
        f"(min {min(t_pull) * 1000:.0f}, max {max(t_pull) * 1000:.0f}) over {len(t_pull)} runs"
    )
    print(
        f"minimal boto3 script, same two GETs + write:  median {m_floor * 1000:6.0f} ms "
        f"(min {min(t_floor) * 1000:.0f}, max {max(t_floor) * 1000:.0f})"
    )
    ratio = m_pull / m_floor
    print(
        f"ratio {ratio:.2f} (target, issue 50 item 7 (c): <= {TARGET}): "
        f"{'met' if ratio <= TARGET else 'NOT met'}"
    )
    print(
        f"top-level packages the pull imports beyond the boto3 script: {', '.join(extra) or 'none'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
