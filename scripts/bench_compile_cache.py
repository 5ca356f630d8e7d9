"""Compile-cache verification cost, measured side by side (see BENCHMARKS.md).

1. verify a signed 30 MiB synthetic cache (300 files of 100 KiB, the shape of an inductor cache):
   signature + closed world + every sha256, best and median of N; target: median <= 50 ms. Then
   the guard itself on the same cache: verify *and* copy into a private directory, hashing the
   bytes written (what a boot pays), side by side with verify alone.
2. a warm vLLM load of a real signed cache (the recipe's toy module, tests/compile_toy.py), with
   and without the guard, boots interleaved, each in its own process; the guard's own time (copy
   included) is the decision line's elapsed_ms; target: guard time <= 10 % of the warm load.
3. pull of one cache: object reads counted where reads happen (:func:`counting_reads`: the
   capped read every backend goes through, ``Store.read_capped``, and on s3 before s3fs is
   made ``S3Direct.read``); target: 2 (signature, archive). A
   count of 0 means the counter missed the read path, not a free pull: it prints "not measured"
   and exits 1.

    PYTHONPATH=src .venv/bin/python scripts/bench_compile_cache.py [--rounds 3] [--work DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from plancache.pipeline.compile_cache import flows as cc
from plancache.pipeline.compile_cache.load import guard
from plancache.pipeline.compile_cache.local_caches import CacheRoot, verify_cache
from plancache.storage.store import open_store
from plancache.trust.keyring.keys import Ed25519Signer, signer_keyring

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "tests" / "compile_toy.py"
SUBJECT = "torch_aot_compile/" + "5a" * 32


@contextlib.contextmanager
def counting_reads() -> Iterator[list[str]]:
    """Every object read while inside, by name. Counted at each place a capped GET really runs:
    ``Store.read_capped`` (async: every backend's capped read goes through it, :meth:`Store.read`
    and :meth:`Store.fetch_many` alike) and ``S3Direct.read`` (a boot's plain-botocore reads on
    s3, which never reach ``read_capped``). Wrapping a method the reads no longer pass through is
    how this counter once printed "0 object reads": :func:`main` refuses a 0."""
    from plancache.storage.s3 import direct
    from plancache.storage.store import Store

    reads: list[str] = []
    original, direct_read = Store.read_capped, direct.S3Direct.read

    async def counted(store: Any, name: str, *args: Any, **kwargs: Any) -> bytes | None:
        reads.append(name)
        return await original(store, name, *args, **kwargs)

    def counted_direct(self: Any, name: str, *args: Any, **kwargs: Any) -> bytes | None:
        reads.append(name)
        return direct_read(self, name, *args, **kwargs)

    Store.read_capped = counted  # type: ignore[method-assign]  # counted, then put back
    direct.S3Direct.read = counted_direct  # type: ignore[method-assign]  # counted, then put back
    try:
        yield reads
    finally:
        Store.read_capped = original  # type: ignore[method-assign]  # the original, back
        direct.S3Direct.read = direct_read  # type: ignore[method-assign]  # the original, back


def synthetic(root: CacheRoot, mib: int = 30, files: int = 300) -> None:
    directory = root.directory(SUBJECT)
    for i in range(files):
        sub = directory / "inductor_cache" / f"{i % 32:02x}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"c{i:05d}.so").write_bytes(os.urandom(mib * 2**20 // files))


def bench_verify(work: Path, rounds: int) -> int:
    root = CacheRoot(work / "synthetic")
    synthetic(root)
    signer = Ed25519Signer(Ed25519PrivateKey.generate())
    now = datetime.now(timezone.utc)
    cc.sign_cache(root, SUBJECT, signer, now)
    keyring = signer_keyring(signer)
    times = []
    for _ in range(rounds * 5):
        started = time.perf_counter()
        assert verify_cache(root, SUBJECT, keyring, now).action == "verified"
        times.append(time.perf_counter() - started)
    best, median = min(times) * 1000, statistics.median(times) * 1000
    print(
        f"1. verify a signed 30 MiB cache (300 files): best {best:.1f} ms, median {median:.1f} ms "
        "(target: median <= 50 ms)"
    )
    bare = []
    for _ in range(rounds * 5):
        started = time.perf_counter()
        for path in root.directory(SUBJECT).rglob("*.so"):
            hashlib.sha256(path.read_bytes()).hexdigest()
        bare.append(time.perf_counter() - started)
    print(
        f"   bare sequential sha256 of the same files: best {min(bare) * 1000:.1f} ms; "
        f"ratio verify / bare {best / (min(bare) * 1000):.2f}"
    )
    guarded = []
    for i in range(rounds * 5):
        started = time.perf_counter()
        assert guard(root, SUBJECT, keyring, now, work / f"private-{i}").action == "load"
        guarded.append(time.perf_counter() - started)
        shutil.rmtree(work / f"private-{i}")
    print(
        "   the guard (verify + copy into a private directory): "
        f"best {min(guarded) * 1000:.1f} ms, median "
        f"{statistics.median(guarded) * 1000:.1f} ms; ratio guard / verify (medians) "
        f"{statistics.median(guarded) / statistics.median(times):.2f}"
    )
    return pull_reads(work, root, keyring, now)


def pull_reads(work: Path, root: CacheRoot, keyring: Any, now: datetime) -> int:
    """Push the signed cache to a file:// store, pull it into an empty root, print the reads
    counted (or "not measured" when none were: a counter that saw nothing measured nothing)."""
    store = open_store(f"file://{work}/store")
    cc.push_cache(store, root, SUBJECT, keyring, now)
    with counting_reads() as reads:
        assert (
            cc.pull_cache(store, CacheRoot(work / "pulled"), SUBJECT, keyring, now).action
            == "pulled"
        )
    if not reads:
        print("3. pull of one cache: not measured: counter saw no reads")
    else:
        print(
            f"3. pull of one cache: {len(reads)} object reads "
            f"({', '.join(Path(r).name[-12:] for r in reads)}) (target 2)"
        )
    return len(reads)


def boot(env: dict[str, str]) -> tuple[float, float | None, str]:
    out = subprocess.run(
        [sys.executable, str(TOY)], env=env, capture_output=True, text=True, timeout=900
    )
    forward = re.search(r'"first_forward_s": ([0-9.]+)', out.stdout)
    assert forward is not None, out.stdout[-2000:]
    first = float(forward.group(1))
    guard = re.search(r"compile-cache decision=(\S+) .*?elapsed_ms=([0-9]+)", out.stderr)
    loaded = re.search(r'"num_aot_artifacts_loaded": (\d)', out.stdout)
    return (
        first,
        float(guard.group(2)) if guard else None,
        (guard.group(1) if guard else "-") + f"/loaded={loaded.group(1) if loaded else '?'}",
    )


def bench_warm(work: Path, rounds: int) -> None:
    keys = work / "keys"
    if not (keys / "key").exists():
        keys.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "plancache.cli.main", "keygen", str(keys / "key")],
            check=True,
            capture_output=True,
        )
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PLANCACHE_", "TORCHINDUCTOR_", "TRITON_"))
    }
    base.update(
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        VLLM_CACHE_ROOT=str(work / "vllm"),
        PYTHONPATH=str(REPO / "src"),
        TMPDIR=str(work / "tmp"),
    )
    (work / "tmp").mkdir(exist_ok=True)
    guarded = dict(base, PLANCACHE_COMPILE_CACHE="1", PLANCACHE_TRUSTED_KEYS=str(keys / "key.pub"))
    if not (work / "vllm" / "torch_compile_cache").exists():
        print("   (cold compile and sign once)", flush=True)
        boot(dict(guarded, PLANCACHE_SIGNING_KEY=str(keys / "key")))
    plain_times, guarded_times, guard_ms = [], [], []
    for _ in range(rounds):
        plain_times.append(boot(base)[0])
        first, elapsed, decision = boot(guarded)
        assert decision.startswith("load/loaded=1"), decision
        guarded_times.append(first)
        guard_ms.append(elapsed or 0.0)
    plain, guarded_first, guard = (
        statistics.median(plain_times),
        statistics.median(guarded_times),
        statistics.median(guard_ms),
    )
    size = sum(
        p.stat().st_size
        for p in (work / "vllm" / "torch_compile_cache" / "torch_aot_compile").rglob("*")
        if p.is_file()
    )
    print(
        f"2. warm load of a real signed cache ({size / 2**20:.1f} MiB), medians of {rounds}: "
        f"first forward without guard {plain:.2f} s, with guard {guarded_first:.2f} s; "
        f"the guard's own time (copy incl.) {guard:.0f} ms "
        f"= {guard / 1000 / plain * 100:.1f} % of the warm load (target <= 10 %)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, help="keep the built cache here between runs")
    parser.add_argument("--skip-vllm", action="store_true", help="only the synthetic measurements")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-compile-cache-"))
    work.mkdir(parents=True, exist_ok=True)
    if not bench_verify(work, args.rounds):
        sys.exit(1)  # a figure the counter did not measure is not printed, nor passed as a run
    if not args.skip_vllm:
        bench_warm(work, args.rounds)


if __name__ == "__main__":
    main()
