#!/usr/bin/env python3
"""Verifying keyless signatures (Sigstore bundles) beside key signatures (issue 37 item 4).

Signs N plans twice, into two directories: with an Ed25519 key (DSSE envelopes), and keylessly
through the test suite's local Fulcio + Rekor (tests/sigstore_stack.py: one certificate, N log
entries, real inclusion proofs and SETs); then co-signs each bundle with the key
(``signing.add_signature``: one envelope holding the keyless signature as a DSSE extension
beside the key's, verified under a threshold of 2) into a third. Then, interleaved, best of
``--rounds``:

  1. ``verify_plan`` of one plan in memory: envelope / bundle / co-signed, per call;
  2. the verify command's path (``check_many``, workers reading their share of the directory)
     over all N plans, on every core: envelopes / bundles / co-signed, wall time;
  3. the once-per-process cost a bundle adds: importing sigstore-python and parsing the root.

Usage: python scripts/bench_keyless.py [--plans 10000] [--rounds 3]
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from plancache.keys.schemes import load_signer
from plancache.pipeline.audit import check_many
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust.keyring.identities import IdentityPolicy, TrustedIdentity
from plancache.trust.keyring.keys import Ed25519Signer, Keyring, Signer, TrustedKey
from plancache.trust.plans.plan import Plan, plan_name, render_plan
from plancache.trust.policy import TrustPolicy
from plancache.trust.signing import add_signature, sign_plan
from plancache.trust.verify import verify_plan
from sigstore_stack import SigstoreStack

ROOT = Path(__file__).resolve().parents[1]
NOW = datetime.now(timezone.utc)
IDENTITY = "https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main"


def fingerprints(n: int) -> list[str]:
    return [f"{i:016x}" for i in range(n)]


def sign_all(directory: Path, fps: list[str], signer: Signer) -> float:
    local = LocalPlanDir(directory)
    started = time.perf_counter()
    for fp in fps:
        data = render_plan(Plan(fp, 20 * 2**30, 70 * 2**30))
        sig = sign_plan(plan_name(fp), data, signer, NOW, expires_at=NOW + timedelta(days=1))
        local.write(fp, data, sig)
    return time.perf_counter() - started


def cosign_all(bundles: Path, directory: Path, fps: list[str], key: Ed25519Signer) -> float:
    """Each plan's bundle co-signed by ``key``: an envelope holding the bundle's signature (a
    DSSE extension) and the key's, over the same statement; no second Fulcio or Rekor call."""
    source, local = LocalPlanDir(bundles), LocalPlanDir(directory)
    started = time.perf_counter()
    for fp in fps:
        data, sig = source.read(fp)[:2]
        assert data is not None and sig is not None
        local.write(fp, data, add_signature(plan_name(fp), data, sig, key))
    return time.perf_counter() - started


def best(func, rounds: int) -> float:
    result = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        func()
        result = min(result, time.perf_counter() - started)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plans", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    fps = fingerprints(args.plans)
    cores = os.cpu_count() or 1
    with SigstoreStack() as stack, tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "trust_config.json"
        config.write_bytes(stack.trust_config_bytes())
        env = {
            "SIGSTORE_ID_TOKEN": stack.token(IDENTITY),
            "PLANCACHE_SIGSTORE_TRUST_CONFIG": str(config),
        }
        keyless = load_signer("sigstore", env)
        key = Ed25519Signer(Ed25519PrivateKey.generate())
        keys_dir, bundles_dir = Path(tmp) / "keys", Path(tmp) / "bundles"
        t_key = sign_all(keys_dir, fps, key)
        t_keyless = sign_all(bundles_dir, fps, keyless)
        cosigned_dir = Path(tmp) / "cosigned"
        t_cosign = cosign_all(bundles_dir, cosigned_dir, fps, key)
        print(
            f"signing {args.plans} plans: key {t_key:.1f} s, keyless {t_keyless:.1f} s "
            f"({t_keyless / args.plans * 1000:.2f} ms a plan, local Fulcio/Rekor on loopback), "
            f"co-signing the bundles with the key {t_cosign:.1f} s"
        )
        key_ring = Keyring({key.keyid: TrustedKey(key.keyid, "ci", key.public)})
        line = TrustedIdentity(stack.issuer, IDENTITY, name="bake")
        id_ring = Keyring(identities=IdentityPolicy((line,), (), stack.trusted_root_bytes()))
        co_ring = Keyring(key_ring.keys, frozenset(), 2, id_ring.identities)

        name = plan_name(fps[0])
        data, key_sig = LocalPlanDir(keys_dir).read(fps[0])[:2]
        _, bundle_sig = LocalPlanDir(bundles_dir).read(fps[0])[:2]
        _, co_sig = LocalPlanDir(cosigned_dir).read(fps[0])[:2]
        started = time.perf_counter()
        verify_plan(name, data, bundle_sig, id_ring, NOW)
        first = time.perf_counter() - started
        assert set(verify_plan(name, data, co_sig, co_ring, NOW).signers) == {"ci", "bake"}
        n = 500
        per_key = (
            best(
                lambda: [verify_plan(name, data, key_sig, key_ring, NOW) for _ in range(n)],
                args.rounds,
            )
            / n
        )
        per_bundle = (
            best(
                lambda: [verify_plan(name, data, bundle_sig, id_ring, NOW) for _ in range(n)],
                args.rounds,
            )
            / n
        )
        per_co = (
            best(
                lambda: [verify_plan(name, data, co_sig, co_ring, NOW) for _ in range(n)],
                args.rounds,
            )
            / n
        )
        print(
            f"1. verify_plan: key {per_key * 1e6:.0f} us, bundle {per_bundle * 1e6:.0f} us, "
            f"co-signed {per_co * 1e6:.0f} us, ratios {per_bundle / per_key:.1f} and "
            f"{per_co / per_key:.1f}"
        )
        print(f"3. first bundle in a process (sigstore import, root parse): {first * 1000:.0f} ms")
        size = [
            sum(f.stat().st_size for f in d.iterdir() if f.suffix == ".sig")
            for d in (bundles_dir, keys_dir, cosigned_dir)
        ]
        print(
            f"   sidecars: bundle {size[0] / args.plans:.0f} B, "
            f"envelope {size[1] / args.plans:.0f} B, co-signed {size[2] / args.plans:.0f} B a plan"
        )

        def run(directory: Path, ring: Keyring) -> None:
            reports = check_many(
                fps, TrustPolicy.signed(ring), NOW, jobs=cores, directory=LocalPlanDir(directory)
            )
            assert all(r.ok for r in reports), {r.reason for r in reports}

        walls = {"keys": float("inf"), "bundles": float("inf"), "co-signed": float("inf")}
        for _ in range(args.rounds):  # interleaved
            walls["keys"] = min(walls["keys"], best(lambda: run(keys_dir, key_ring), 1))
            walls["bundles"] = min(walls["bundles"], best(lambda: run(bundles_dir, id_ring), 1))
            walls["co-signed"] = min(
                walls["co-signed"], best(lambda: run(cosigned_dir, co_ring), 1)
            )
        print(
            f"2. verify {args.plans} plans on {cores} cores: keys {walls['keys']:.2f} s, "
            f"bundles {walls['bundles']:.2f} s, co-signed {walls['co-signed']:.2f} s, ratios "
            f"{walls['bundles'] / walls['keys']:.1f} and {walls['co-signed'] / walls['keys']:.1f}"
        )
        cmd = [
            sys.executable,
            "-c",
            "import time,sys;t=time.perf_counter();import plancache.vllm_plugin;"
            "print((time.perf_counter()-t)*1000,"
            " any(m.startswith('sigstore') for m in sys.modules))",
        ]
        out = subprocess.run(
            cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}
        )
        ms, loaded = out.stdout.split()
        print(f"4. import plancache.vllm_plugin: {float(ms):.1f} ms, sigstore imported: {loaded}")


if __name__ == "__main__":
    main()
