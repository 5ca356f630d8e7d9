#!/usr/bin/env python3
"""Benchmarks for the trust core and offline verify (issue "Signed plan core").

Prints ratios measured side by side in one run, so a noisy shared machine moves both sides:
  1. verifying one signed plan  /  (one bare Ed25519 verify + parsing the plan)   target <= 1.5
  2. verify of N plans on all cores  /  (cores x single-core rate)                 target >= 0.8
  3. which heavy modules ``import plancache`` (and the CLI/trust modules) pull in   target: none

Usage: python scripts/bench_core.py [--plans 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from plancache.pipeline.audit import check_many
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust import envelope as dsse
from plancache.trust.keyring.keyformat import openssh_line
from plancache.trust.keyring.keys import Ed25519Signer, Keyring, TrustedKey
from plancache.trust.plans.plan import Plan, parse_plan, plan_name, render_plan
from plancache.trust.policy import TrustPolicy
from plancache.trust.signing import sign_plan
from plancache.trust.verify import verify_plan

NOW = datetime.now(timezone.utc)
HEAVY = ("fsspec", "s3fs", "gcsfs", "aiobotocore", "botocore", "torch", "vllm")


def best_of(func, rounds: int, number: int) -> float:
    """Best per-call seconds over ``rounds`` rounds of ``number`` calls (least disturbed run)."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(number):
            func()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def bench_single(rounds: int) -> None:
    signer = Ed25519Signer(Ed25519PrivateKey.generate())
    keyring = Keyring({signer.keyid: TrustedKey(signer.keyid, "ci", signer.public)})
    fp = "0123456789abcdef"
    name = plan_name(fp)
    data = render_plan(Plan(fp, 20 * 2**30, 70 * 2**30))
    sig = sign_plan(name, data, signer, NOW, expires_at=NOW + timedelta(days=1))
    env = dsse.decode(sig)
    pae = dsse.pae(env.payload_type, env.payload)
    raw_sig = env.signatures[0].sig

    def baseline() -> None:
        signer.public.verify(raw_sig, pae)
        parse_plan(data, name)

    def full() -> None:
        verify_plan(name, data, sig, keyring, NOW)

    number = 2000
    # interleave the two sides so drift affects both
    base_t = full_t = float("inf")
    for _ in range(rounds):
        base_t = min(base_t, best_of(baseline, 1, number))
        full_t = min(full_t, best_of(full, 1, number))
    print(
        f"1. verify one plan: {full_t * 1e6:.1f} us; bare Ed25519 verify + parse: "
        f"{base_t * 1e6:.1f} us; ratio {full_t / base_t:.2f} (target <= 1.5)"
    )


def bench_many(plans: int, rounds: int) -> None:
    """The verify command's own path: a pool whose workers read and verify their share."""
    cores = os.cpu_count() or 1
    signer = Ed25519Signer(Ed25519PrivateKey.generate())
    keyring = Keyring({signer.keyid: TrustedKey(signer.keyid, "ci", signer.public)})
    with tempfile.TemporaryDirectory() as tmp:
        local = LocalPlanDir(Path(tmp))
        for i in range(plans):
            fp = f"{i:016x}"
            data = render_plan(Plan(fp, 20 * 2**30, 70 * 2**30))
            local.write(fp, data, sign_plan(plan_name(fp), data, signer, NOW))
        policy = TrustPolicy.signed(keyring)
        fps = local.fingerprints()
        one = many = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            check_many(fps, policy, NOW, jobs=1, directory=local)
            one = min(one, time.perf_counter() - start)
            start = time.perf_counter()
            reports = check_many(fps, policy, NOW, jobs=cores, directory=local)
            many = min(many, time.perf_counter() - start)
        assert all(r.status == "valid" for r in reports)
        single_rate, multi_rate = plans / one, plans / many
        print(
            f"2a. verify {plans} plans from a directory (read + verify, as the command does): "
            f"1 core {single_rate:,.0f}/s, {cores} cores {multi_rate:,.0f}/s; "
            f"efficiency {multi_rate / (cores * single_rate):.2f} (target >= 0.8)"
        )

        keyfile = Path(tmp) / "trusted"
        keyfile.write_text(openssh_line(signer.public, "ci") + "\n")
        cmd = [
            sys.executable,
            "-m",
            "plancache.cli.main",
            "verify",
            f"--trusted-keys={keyfile}",
            "--json",
            tmp,
        ]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
        one = many = float("inf")
        for _ in range(max(1, rounds // 2)):
            start = time.perf_counter()
            subprocess.run([*cmd, "--jobs", "1"], check=True, capture_output=True, env=env)
            one = min(one, time.perf_counter() - start)
            start = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, env=env)
            many = min(many, time.perf_counter() - start)
        print(
            f"2b. whole `plancache verify --json DIR` over {plans} plans, including interpreter "
            f"start-up and the JSON report (serial parts): --jobs 1 {one:.2f} s, "
            f"{cores} cores {many:.2f} s; speed-up {one / many:.2f}x"
        )


FLOOR = r"""
import base64, hashlib, json, os, sys
from concurrent.futures import ProcessPoolExecutor
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

DIR, KEY = sys.argv[1], Ed25519PublicKey.from_public_bytes(bytes.fromhex(sys.argv[2]))

def check(names):
    ok = 0
    for name in names:
        with open(os.path.join(DIR, name), "rb") as f:
            plan = f.read()
        with open(os.path.join(DIR, name + ".sig"), "rb") as f:
            env = json.loads(f.read())
        payload = base64.b64decode(env["payload"])
        kind = env["payloadType"].encode()
        pae = b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)
        KEY.verify(base64.b64decode(env["signatures"][0]["sig"]), pae)
        statement = json.loads(payload)
        assert statement["subject"][0]["digest"]["sha256"] == hashlib.sha256(plan).hexdigest()
        ok += json.loads(plan)["kv_cache_memory_bytes"] > 0
    return ok

if __name__ == "__main__":
    names = sorted(n for n in os.listdir(DIR) if n.endswith(".json"))
    jobs = os.cpu_count() or 1
    size = max(1, len(names) // (jobs * 8))
    with ProcessPoolExecutor(jobs) as pool:
        chunks = [names[i:i + size] for i in range(0, len(names), size)]
        assert sum(pool.map(check, chunks)) == len(names)
"""


def compile_sources() -> None:
    """Byte-compile the source tree first, as ``scripts/bench_cli.py`` does: an installed wheel
    has its bytecode (pip compiles at install), as the floor's cryptography has here, and this
    machine sets ``PYTHONDONTWRITEBYTECODE=1``, so a source tree would be compiled again in
    every run of the command (50-60 ms of its start, not plancache's cost)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "compileall",
            "-q",
            str(Path(__file__).resolve().parents[1] / "src"),
        ],
        check=True,
        capture_output=True,
    )


def bench_floor(plans: int, rounds: int) -> None:
    """Whole ``plancache verify DIR`` against the least a verifier must do, both as whole
    processes (interpreter start included) on every core, measured interleaved."""
    signer = Ed25519Signer(Ed25519PrivateKey.generate())
    with tempfile.TemporaryDirectory() as tmp:
        local = LocalPlanDir(Path(tmp))
        for i in range(plans):
            fp = f"{i:016x}"
            data = render_plan(Plan(fp, 20 * 2**30, 70 * 2**30))
            local.write(fp, data, sign_plan(plan_name(fp), data, signer, NOW), sync=False)
        keyfile = Path(tmp).parent / f"bench-trusted-{os.getpid()}"
        keyfile.write_text(openssh_line(signer.public, "ci") + "\n")
        raw = signer.public.public_bytes_raw().hex()
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
        command = [
            sys.executable,
            "-m",
            "plancache.cli.main",
            "verify",
            f"--trusted-keys={keyfile}",
            tmp,
        ]
        floor_cmd = [sys.executable, "-c", FLOOR, tmp, raw]
        cmd_t = floor_t = float("inf")
        try:
            for _ in range(rounds):
                start = time.perf_counter()
                subprocess.run(floor_cmd, check=True, capture_output=True, env=env)
                floor_t = min(floor_t, time.perf_counter() - start)
                start = time.perf_counter()
                subprocess.run(command, check=True, capture_output=True, env=env)
                cmd_t = min(cmd_t, time.perf_counter() - start)
        finally:
            keyfile.unlink()
        print(
            f"2c. whole `plancache verify DIR` over {plans} plans {cmd_t:.2f} s; all-cores floor "
            "(bare read + Ed25519 over the PAE + digest + plan parse, process pool) "
            f"{floor_t:.2f} s; "
            f"ratio {cmd_t / floor_t:.2f} (target <= 1.25)"
        )


def bench_imports() -> None:
    code = (
        "import sys, plancache, plancache.trust.verify, plancache.trust.plans.gate, "
        "plancache.cli.main;"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules) or 'none')"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    print(
        f"3. heavy modules imported by plancache, its trust core and CLI: {out.stdout.strip()} "
        "(target: none)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plans", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--only", choices=("floor",), help="run only this part (e.g. against another checkout)"
    )
    args = parser.parse_args()
    compile_sources()
    if args.only == "floor":
        bench_floor(args.plans, args.rounds)
        return
    bench_single(args.rounds)
    bench_many(args.plans, args.rounds)
    bench_floor(args.plans, args.rounds)
    bench_imports()


if __name__ == "__main__":
    main()
