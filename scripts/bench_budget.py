#!/usr/bin/env python3
"""Does ``--timeout`` hold for the SDK's import too? Wall time of one command against a black hole,
in a fresh interpreter (the store's SDK not imported yet), next to the budget it was given.

    python scripts/bench_budget.py [--budget 0.5] [--reps 5] [--against OTHER_SRC]

For each store (s3 on plain botocore, s3 through s3fs, gs, az) and command (``pull
--fingerprint``, ``ls``), each rep runs ``plancache.cli.main.main`` in a new process whose
endpoint is a listener on 127.0.0.1 that accepts and never answers, and times the call from
inside (interpreter start-up excluded, the SDK's import included: the point). Also times the
SDK's bare import in another fresh process, side by side. Prints the medians and the ratio
wall / budget. ``--against`` also runs another tree's ``src`` (e.g. a ``git worktree`` of an
older commit), interleaved rep by rep with this one. Target (issue 19): wall <= budget + 0.2 s
on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
FP = "0123456789abcdef"
AZURE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
STORES = {  # name: (URL, extra arguments, the SDK module its open imports)
    "s3 (botocore)": ("s3://bucket/plans", [], "botocore"),
    "s3 (s3fs)": ("s3://bucket/plans", ["--storage-option", "config_kwargs={}"], "s3fs"),
    "gs": ("gs://bucket/plans", ["--storage-option", "token=anon"], "gcsfs"),
    "az": ("az://container/plans", [], "adlfs"),
}
TIMED = """
import json, sys, time
started = time.monotonic()
if sys.argv[1] == "import":
    __import__(sys.argv[2])
    code = 0
else:
    from plancache.cli.main import main
    started = time.monotonic()
    code = main(sys.argv[2:])
print(json.dumps({"code": code, "elapsed": time.monotonic() - started}), file=sys.stderr)
"""


def black_hole() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    held: list[socket.socket] = []
    threading.Thread(
        target=lambda: [held.append(sock.accept()[0]) for _ in iter(int, 1)], daemon=True
    ).start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


def timed(env: dict[str, str], *argv: str) -> float:
    proc = subprocess.run(
        [sys.executable, "-c", TIMED, *argv], env=env, capture_output=True, text=True, timeout=120
    )
    return float(json.loads(proc.stderr.strip().splitlines()[-1])["elapsed"])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--against", help="another tree's src directory, timed beside this one")
    args = parser.parse_args()
    trees = {"this": SRC, **({"other": args.against} if args.against else {})}
    endpoint = black_hole()
    work = Path(tempfile.mkdtemp(prefix="bench-budget-"))
    subprocess.run(
        [sys.executable, "-m", "plancache.cli.main", "keygen", str(work / "k")],
        check=True,
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
    )
    env = {
        **os.environ,
        "PYTHONPATH": SRC,
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ENDPOINT_URL": endpoint,
        "STORAGE_EMULATOR_HOST": endpoint,
        "AZURE_STORAGE_CONNECTION_STRING": (
            f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={AZURE_KEY};"
            f"BlobEndpoint={endpoint}/devstoreaccount1;"
        ),
    }
    budget = ["--timeout", str(args.budget)]
    print(f"budget {args.budget} s, {args.reps} reps, medians; wall from main() called to returned")
    for name, (url, extra, module) in STORES.items():
        commands = {
            "pull --fingerprint": [
                "pull",
                "--trusted-keys",
                str(work / "k.pub"),
                "--fingerprint",
                FP,
                *budget,
                *extra,
                url,
                str(work / "dest"),
            ],
            "ls": ["ls", *budget, *extra, url],
        }
        imports = statistics.median(timed(env, "import", module) for _ in range(args.reps))
        for label, argv in commands.items():
            walls: dict[str, list[float]] = {tree: [] for tree in trees}
            for _ in range(args.reps):  # the trees interleaved, rep by rep
                for tree, src in trees.items():
                    walls[tree].append(timed({**env, "PYTHONPATH": src}, "main", *argv))
            for tree, times in walls.items():
                wall = statistics.median(times)
                print(
                    f"{tree:5} {name:14} {label:18} wall {wall:.2f} s = budget + "
                    f"{wall - args.budget:.2f} s "
                    f"(ratio {wall / args.budget:.2f}); bare `import {module}` {imports:.2f} s"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
