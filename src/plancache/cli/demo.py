"""``plancache demo``: the whole story in temporary directories, nothing outside them touched.

CI bake (a profiling boot writes plans as vLLM does; ``push --key`` signs and uploads them)
-> an attacker with write access to the bucket alters one plan -> a spot boot pulls its
fingerprints, verified, into its own plan directory (the altered plan is rejected, nothing of
it is written) -> the gate's apply decision at two free-memory values. The store is an
embedded ``file://`` directory in the temp dir unless ``--store URL`` names a real one.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ..keys.keyfile import generate_keypair
from ..pipeline.resolver import Resolver
from ..pipeline.trust_config import trust_policy
from ..storage.local.localdir import LocalPlanDir
from ..trust.plans.gate import decide
from ..trust.plans.plan import Plan, plan_name, render_plan
from .parser import key_value

GIB = 2**30
DEMO_FINGERPRINT = "3f9a1c2be47d5a60"
TAMPERED_FINGERPRINT = "a7c0de5e11f00d42"


def step(text: str) -> None:
    print(f"==> {text}", flush=True)


def _plancache(*argv: str) -> int:
    """Run a plancache command as a user would, showing the command line and its output."""
    from .main import main  # late: main imports this module

    print(f"$ plancache {' '.join(argv)}", flush=True)
    sys.stdout.flush()
    return main(list(argv))


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="plancache-demo-") as tmp:
        root = Path(tmp)
        if not args.store:
            (root / "bucket").mkdir()  # the embedded store's "bucket": a push makes only the prefix
        store_url = args.store or (root / "bucket" / "plans").as_uri()
        options = [x for opt in args.storage_option for x in ("--storage-option", opt)]

        step(f"keygen: CI's signing key in {root / 'ci-key'}")
        signer = generate_keypair(root / "ci-key", force=False, comment="ci-signer")
        print(f"    key id {signer.keyid}")

        ci_plans = LocalPlanDir(root / "ci" / "vllm-cache" / "startup_plan")
        good = Plan(DEMO_FINGERPRINT, kv_cache_memory_bytes=38 * GIB, free_memory_baseline=70 * GIB)
        other = Plan(
            TAMPERED_FINGERPRINT, kv_cache_memory_bytes=12 * GIB, free_memory_baseline=70 * GIB
        )
        for plan in (good, other):
            ci_plans.write(plan.fingerprint, render_plan(plan), None)
        step(
            f"CI bake: a profiling boot wrote {ci_plans.path / plan_name(good.fingerprint)} (as "
            "vLLM 0.33 writes it)"
        )
        print(f"    {render_plan(good).decode()}")

        step(f"CI bake: sign with the CI key and push to {store_url}")
        code = _plancache(
            "push",
            "--key",
            str(root / "ci-key"),
            "--fact",
            "gpu_memory_utilization=0.9",
            "--fact",
            "device_name=NVIDIA H100 80GB HBM3",
            "--fact",
            f"device_total_memory={80 * GIB}",
            *options,
            str(ci_plans.path),
            store_url,
        )
        if code != 0:
            return code

        from ..storage.store import open_store

        store = open_store(store_url, dict(key_value(o) for o in args.storage_option), timeout=30)
        hostile = Plan(
            TAMPERED_FINGERPRINT, kv_cache_memory_bytes=69 * GIB, free_memory_baseline=70 * GIB
        )
        store.put_many({plan_name(TAMPERED_FINGERPRINT): render_plan(hostile)})
        step(
            f"attacker: rewrote {plan_name(TAMPERED_FINGERPRINT)} in the store with "
            "kv_cache_memory_bytes=69 GiB"
        )

        spot = LocalPlanDir(root / "spot" / "vllm-cache" / "startup_plan")
        step(
            "spot boot: pull the node's fingerprints, verified, into its plan directory (3 s "
            "budget)"
        )
        code = _plancache(
            "pull",
            "--trusted-keys",
            str(root / "ci-key.pub"),
            "--fingerprint",
            DEMO_FINGERPRINT,
            "--fingerprint",
            TAMPERED_FINGERPRINT,
            *options,
            store_url,
            str(spot.path),
        )
        print(
            f"    exit code {code} (1: a plan was rejected); spot directory holds: "
            f"{', '.join(sorted(p.name for p in spot.path.iterdir()))}"
        )

        found = Resolver(spot, trust_policy(str(root / "ci-key.pub"))).local(DEMO_FINGERPRINT)
        verified = found.verified
        if verified is None:
            print(f"    the pulled plan does not verify: {found.error}")
            return 1
        step(f"vLLM worker boot: the local plan verifies, signed by {', '.join(verified.signers)}")
        for free in (80 * GIB, 60 * GIB):
            d = decide(verified, free_memory=free, conditions={"gpu_memory_utilization": 0.9})
            verdict = (
                f"apply kv_cache_memory_bytes={d.kv_cache_memory_bytes}"
                if d.applied
                else "profile as usual"
            )
            step(f"gate at {free // GIB} GiB free: {d.reason} -> {verdict}")
            if d.detail:
                print(f"    {d.detail}")
        if args.store:
            store.delete([DEMO_FINGERPRINT, TAMPERED_FINGERPRINT])
            step(f"cleaned the demo's two plans out of {store_url}")
    return 0
