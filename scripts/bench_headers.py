"""A pulling node's precompiled header: what its install costs the boot, two versions side by side.

The build node's real header (a ``.gch``, 149 MiB) and a signed cache of the real one's shape
(1.7 MiB archive) are pushed to a loopback moto S3; then, alternating the versions given with
``--src`` (a checkout's ``src/``, e.g. a ``git worktree`` of the previous commit), each round
runs one fresh process per version and mode, in a fresh cache root:

- ``boot``: the plugin's own guard (``private_for``: pull, verify, private copy; the header's
  fetch as that version starts it) and then, ``--gap-ms`` later (vLLM's AOT load in between;
  0: inductor asks at once, the worst case), torch's ``_precompile_header`` through the plugin's
  wrapper: ``guard_ms`` is the guard's return, ``header_ms`` when the wrapper returned with the
  header installed, ``after_guard_ms`` their difference (what the header adds to the critical path);
- ``install``: ``pull_headers`` alone into a fresh root, the store opened first as the plugin
  before issue 23 item 6 did (``fresh``: a new client, its filesystem made by the first GET), then
  on a store whose filesystem is made already (``warm``: as the guard's store is by then).

    PYTHONPATH=src .venv/bin/python scripts/bench_headers.py --gch PATH.h.gch --rounds 5 \
        --src before=/tmp/old/src --src after=src
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SUBJECT = "torch_aot_compile/" + "b3" * 32


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--gch",
        type=Path,
        required=True,
        help="a real precompiled header (inductor's <hash>.h.gch)",
    )
    parser.add_argument(
        "--src",
        action="append",
        required=True,
        metavar="NAME=DIR",
        help="a version's src/ (repeatable)",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gap-ms", type=float, default=0.0)
    parser.add_argument("--modes", default="boot,install")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument(
        "--child", nargs=3, metavar=("MODE", "ROOT", "SETUP"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        return child(*args.child, gap_ms=args.gap_ms)
    versions = dict(v.split("=", 1) for v in args.src)
    sys.path.insert(0, str(REPO / "tests"))
    from store_servers import AWS_ENV, MotoServer

    os.environ.update(AWS_ENV)
    work = Path(tempfile.mkdtemp(prefix="bench-headers-", dir=args.work))
    moto = MotoServer()
    try:
        setup = seed(work, args.gch, moto)
        results: dict[tuple[str, str], list[dict]] = {}
        for r in range(args.rounds):
            order = list(versions)[r % len(versions) :] + list(versions)[: r % len(versions)]
            for mode in args.modes.split(","):
                for name in order:
                    root = work / f"{mode}-{name}-{r}"
                    env = {
                        **os.environ,
                        "PYTHONPATH": f"{Path(versions[name]).resolve()}:{REPO / 'tests'}",
                    }
                    out = subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--gch",
                            str(args.gch),
                            "--src",
                            "x=x",
                            "--gap-ms",
                            str(args.gap_ms),
                            "--child",
                            mode,
                            str(root),
                            str(setup),
                        ],
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=300,
                    )
                    if out.returncode != 0:
                        raise SystemExit(f"{mode} {name}: {out.stdout}{out.stderr}")
                    row = json.loads(out.stdout.strip().splitlines()[-1])
                    print(
                        json.dumps({"round": r + 1, "mode": mode, "version": name, **row}),
                        flush=True,
                    )
                    results.setdefault((mode, name), []).append(row)
                    shutil.rmtree(root, ignore_errors=True)
        print("medians (min-max) over", args.rounds, "rounds:")
        for (mode, name), rows in results.items():
            keys = [k for k, v in rows[0].items() if isinstance(v, (int, float))]
            print(
                f"  {mode:7} {name:8} "
                + "  ".join(
                    f"{k} {statistics.median(r[k] for r in rows):.0f} "
                    f"({min(r[k] for r in rows):.0f}-{max(r[k] for r in rows):.0f})"
                    for k in keys
                )
            )
    finally:
        moto.stop()
        shutil.rmtree(work, ignore_errors=True) if not os.environ.get("BENCH_KEEP") else None
    return 0


def seed(work: Path, gch: Path, moto: Any) -> Path:
    """Key, a signed cache shaped like the engine tests' (model + 17 kernels), and the header,
    pushed to a fresh bucket; the settings for the children in ``setup.json``."""
    import random

    from plancache.cli.main import main as cli
    from plancache.pipeline.compile_cache import flows as cc
    from plancache.pipeline.compile_cache import header_shipping as ch
    from plancache.pipeline.compile_cache.local_caches import CacheRoot
    from plancache.pipeline.resolver import utcnow
    from plancache.pipeline.trust_config import signer_for
    from plancache.storage.compile_cache import header_files as files
    from plancache.storage.store import open_store

    assert cli(["keygen", str(work / "key")]) == 0
    build = CacheRoot(work / "build")
    directory = build.directory(SUBJECT)
    noise = random.Random(1)
    (directory / "rank_0_0").mkdir(parents=True)
    (directory / "rank_0_0" / "model").write_bytes(noise.randbytes(1 << 20))
    for i in range(17):
        kernel = directory / "inductor_cache" / f"c{i:02d}"
        kernel.mkdir(parents=True)
        (kernel / f"k{i}.so").write_bytes(noise.randbytes(24 << 10))
        (kernel / f"k{i}.cpp").write_bytes(noise.randbytes(16 << 10))
    signer = signer_for(str(work / "key"))
    now = utcnow()
    url = f"s3://{moto.new_bucket()}/fleet"
    options = {"endpoint_url": moto.endpoint}
    store = open_store(url, options, timeout=60)
    cc.sign_cache(build, SUBJECT, signer, now)
    from plancache.trust.keyring.keys import signer_keyring

    digest = cc.push_cache(store, build, SUBJECT, signer_keyring(signer), now).archive_sha256
    headers = files.private_dir(build.root / "plancache-private")
    assert headers is not None
    shutil.copyfile(gch, headers / gch.name)
    pushed = ch.push_headers(
        store, SUBJECT, build.root, headers, [gch.name], signer, now, cache_archive_sha256=digest
    )
    assert pushed.action == "pushed", pushed
    setup = work / "setup.json"
    keys, name = str(work / "key.pub"), gch.name
    setup.write_text(
        json.dumps(
            {"url": url, "options": options, "keys": keys, "name": name, "archive_sha256": digest}
        )
    )
    return setup


def child(mode: str, root: str, setup_file: str, *, gap_ms: float) -> int:
    setup = json.loads(Path(setup_file).read_text())
    base = Path(root)
    os.environ.update(
        {
            "PLANCACHE_COMPILE_CACHE": "1",
            "PLANCACHE_TRUSTED_KEYS": setup["keys"],
            "PLANCACHE_URL": setup["url"],
            "PLANCACHE_STORAGE_OPTIONS": json.dumps(setup["options"]),
            "PLANCACHE_TIMEOUT": "30",
        }
    )
    from plancache.storage.compile_cache import header_files as files

    directory = files.private_dir(base / "plancache-private")
    assert directory is not None
    result = (
        boot(base, directory, setup["name"], gap_ms) if mode == "boot" else install(base, setup)
    )
    print(json.dumps(result))
    return 0


def boot(base: Path, directory: Path, name: str, gap_ms: float) -> dict:
    """The plugin's guard, then torch's ask for the header, as a pulling node's first boot does."""
    from plancache.pipeline.compile_cache.local_caches import CacheRoot
    from plancache.vllm_plugin.compile_cache import boot_headers as headers
    from plancache.vllm_plugin.compile_cache import decisions, guarded_dirs, torch_caches

    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logging.getLogger("vllm.plancache").addHandler(Lines())
    logging.getLogger("vllm.plancache").setLevel(logging.INFO)
    boot_dir = base / "plancache-private" / "boot-bench"
    boot_dir.mkdir(mode=0o700)
    torch_caches.private_dir = lambda sub: boot_dir / sub  # vLLM's boot directory, without vLLM
    # the boot record asks vLLM (imported by then in a real boot): not part of what is measured
    decisions.record = lambda *args, **kwargs: None
    headers.place(base, directory)
    built: list[str] = []

    def precompile(
        header: str, cmd: str, **options: object
    ) -> str:  # torch's: gcc builds a missing header
        if not (directory / name).exists():
            built.append(name)
        return str(directory / name[:-4])

    wrapped = headers.wrap(precompile)
    started = time.perf_counter()
    _, outcome = guarded_dirs.private_for(CacheRoot(base).directory(SUBJECT))
    guard_ms = (time.perf_counter() - started) * 1000
    time.sleep(gap_ms / 1000)
    wrapped("torch/csrc/inductor/cpp_prefix.h", "g++")
    header_ms = (time.perf_counter() - started) * 1000
    assert outcome.action == "load" and not built, (outcome, built, lines)
    fetched = next(line for line in lines if "compile-cache headers=" in line)
    decision = next(line for line in lines if "decision=" in line)
    return {
        "guard_ms": guard_ms,
        "header_ms": header_ms,
        "after_guard_ms": header_ms - guard_ms,
        "guard_line_ms": _elapsed_ms(decision),
        "fetch_line_ms": _elapsed_ms(fetched),
    }


def _elapsed_ms(line: str) -> float:
    """The ``elapsed_ms=`` a plugin line states."""
    found = re.search(r"elapsed_ms=(\d+)", line)
    assert found is not None, line
    return float(found.group(1))


def install(base: Path, setup: dict) -> dict:
    """``pull_headers`` alone: on a store opened for it (fresh), then on one already used (warm)."""
    from plancache.clock import Deadline
    from plancache.pipeline.compile_cache.header_shipping import pull_headers
    from plancache.pipeline.resolver import utcnow
    from plancache.pipeline.trust_config import worker_policy
    from plancache.storage.compile_cache import archives
    from plancache.storage.store import open_store

    keyring = worker_policy(setup["keys"], 1).keyring
    assert keyring is not None, setup["keys"]
    timings = {}
    for kind in ("fresh", "warm"):
        where = base / kind
        started = time.perf_counter()
        store = open_store(setup["url"], setup["options"], timeout=60)
        if kind == "warm":
            archives.get_object(
                store, archives.sig_name(SUBJECT), 1 << 16
            )  # the guard's pull made its filesystem
            started = time.perf_counter()
        outcome = pull_headers(
            store,
            SUBJECT,
            keyring,
            utcnow(),
            where,
            where / "plancache-private" / "headers",
            cache_archive_sha256=setup["archive_sha256"],
            deadline=Deadline.after(60),
        )
        timings[f"{kind}_ms"] = (time.perf_counter() - started) * 1000
        assert (
            outcome.action == "installed"
            and (where / "plancache-private" / "headers" / setup["name"]).exists()
        ), outcome
    return timings


if __name__ == "__main__":
    sys.exit(main())
