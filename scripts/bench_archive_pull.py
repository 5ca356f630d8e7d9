"""A compile cache's archive in a store: its size and the pull a serving node pays (BENCHMARKS.md).

For each signed cache root given (e.g. one the build node of scripts/bench_engine.py left, and
one made before the precompiled header left the cache), pushes its archive to a loopback moto
S3 with ``plancache compile-cache push``, then pulls it into fresh roots with
``plancache compile-cache pull`` (signature, capped archive GET, sha256, extraction, full
verification), interleaving the roots, and prints the archive size and the pull's median wall
time, including the CLI's own start.

    PYTHONPATH=src .venv/bin/python scripts/bench_archive_pull.py
        --cache ROOT KEY.pub [--cache ROOT KEY.pub ...] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from compile_tampers import cli  # noqa: E402 - after tests/ is put on sys.path
from store_servers import AWS_ENV, MotoServer  # noqa: E402 - after tests/ is put on sys.path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--cache",
        nargs=2,
        action="append",
        required=True,
        metavar=("ROOT", "KEY.pub"),
        help="a signed cache root and the public key it is signed by (repeatable)",
    )
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    keys = {Path(root): key for root, key in args.cache}
    args.roots = list(keys)
    os.environ.update(AWS_ENV)
    moto = MotoServer()
    work = Path(tempfile.mkdtemp(prefix="bench-archive-"))
    try:
        option = f"endpoint_url={moto.endpoint}"
        urls = {}
        for root in args.roots:
            url = f"s3://{moto.new_bucket()}/fleet"
            pushed = cli(
                "compile-cache",
                "push",
                "--json",
                "--trusted-keys",
                keys[root],
                "--url",
                url,
                "--storage-option",
                option,
                str(root),
            )
            assert pushed.returncode == 0, pushed.stdout + pushed.stderr
            urls[root] = url
        times: dict[Path, list[float]] = {root: [] for root in args.roots}
        for r in range(args.rounds):
            for root in args.roots:
                dest = work / f"{r}-{args.roots.index(root)}"
                started = time.perf_counter()
                pulled = cli(
                    "compile-cache",
                    "pull",
                    "--json",
                    "--trusted-keys",
                    keys[root],
                    "--url",
                    urls[root],
                    "--storage-option",
                    option,
                    "--timeout",
                    "120",
                    str(dest),
                )
                times[root].append(time.perf_counter() - started)
                assert pulled.returncode == 0, pulled.stdout + pulled.stderr
        client = moto.client()
        for root in args.roots:
            bucket = urls[root].split("/")[2]
            sizes = [
                o["Size"]
                for o in client.list_objects_v2(Bucket=bucket)["Contents"]
                if o["Key"].endswith(".tar")
            ]
            print(
                json.dumps(
                    {
                        "root": str(root),
                        "archive_bytes": sizes,
                        "archive_mib": [round(s / 2**20, 2) for s in sizes],
                        "pull_median_s": round(statistics.median(times[root]), 3),
                        "pull_all_s": [round(t, 3) for t in times[root]],
                    }
                )
            )
    finally:
        moto.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
