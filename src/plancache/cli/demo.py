"""``plancache demo``: the whole story in temporary directories, nothing outside them touched."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from ..storage.keyfiles import generate_keypair, load_keyring
from ..storage.localdir import LocalPlanDir
from ..trust.gate import decide
from ..trust.plan import Plan, plan_name, render_plan
from ..trust.signing import sign_plan
from ..trust.verify import verify_plan
from .offline import utcnow

GIB = 2**30
DEMO_FINGERPRINT = "3f9a1c2be47d5a60"


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("demo", help="run the whole story in temporary directories",
                       description="keygen -> a plan written as vLLM writes it -> sign -> verify -> the "
                       "gate's decision at two free-memory values. Touches nothing outside a temp dir.")
    p.set_defaults(func=run)


def step(text: str) -> None:
    print(f"==> {text}")


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="plancache-demo-") as tmp:
        root = Path(tmp)
        step(f"keygen: CI's signing key in {root / 'ci-key'}")
        signer = generate_keypair(root / "ci-key", force=False, comment="ci-signer")
        print(f"    key id {signer.keyid}")

        plans = LocalPlanDir(root / "vllm-cache" / "startup_plan")
        plan = Plan(DEMO_FINGERPRINT, kv_cache_memory_bytes=38 * GIB, free_memory_baseline=70 * GIB)
        plan_bytes = render_plan(plan)
        plans.write(plan.fingerprint, plan_bytes, None)
        step(f"a profiling boot wrote {plans.path / plan_name(plan.fingerprint)} (as vLLM 0.33 writes it)")
        print(f"    {plan_bytes.decode()}")

        now = utcnow()
        sig = sign_plan(plan.name, plan_bytes, signer, now, comment="demo", provenance={"gpu_memory_utilization": 0.9})
        plans.write_sig(plan.fingerprint, sig)
        step(f"sign: wrote the sidecar {plan.name}.sig (DSSE envelope, in-toto statement, Ed25519)")

        keyring = load_keyring(root / "ci-key.pub")
        read_plan, read_sig = plans.read(plan.fingerprint)
        assert read_plan is not None
        verified = verify_plan(plan.name, read_plan, read_sig, keyring, utcnow())
        step(f"verify with ci-key.pub: valid, signed by {', '.join(verified.signers)}")

        for free in (80 * GIB, 60 * GIB):
            d = decide(verified, free_memory=free, conditions={"gpu_memory_utilization": 0.9})
            verdict = f"apply kv_cache_memory_bytes={d.kv_cache_memory_bytes}" if d.applied else "profile as usual"
            step(f"gate at {free // GIB} GiB free: {d.reason} -> {verdict}")
            print(f"    {d.detail}")
    return 0
