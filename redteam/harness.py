"""Red-team harness: the local Fulcio/Rekor stack (tests/sigstore_stack.py), a signer whose
certificate the attack chooses, and a verdict (None = valid, a reason, or config-error) from
plancache's verify_plan. Runs against whichever plancache is on PYTHONPATH (new: src/, old:
/tmp/old48b/src), so each PoC says what both do."""

from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from sigstore_stack import SigstoreStack  # noqa: E402

from plancache.keys.schemes import load_signer  # noqa: E402
from plancache.trust.errors import PlanCacheError, Rejected  # noqa: E402
from plancache.trust.keyring.keys import Keyring  # noqa: E402
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys  # noqa: E402
from plancache.trust.signing import sign_plan  # noqa: E402
from plancache.trust.verify import verify_plan  # noqa: E402
from plancache.trust.plans.plan import plan_name  # noqa: E402

FP = "0123456789abcdef"
NAME = plan_name(FP)
CALLED = "acme/serving/.github/workflows/bake.yml@refs/heads/main"
SAN = "https://github.com/" + CALLED
CODE = "new" if "old48b" not in os.environ.get("PYTHONPATH", "") else "old"


def plan() -> bytes:
    from plancache.trust.plans.plan import Plan, render_plan

    return render_plan(Plan(FP, 20 << 30, 70 << 30))


def now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def github(stack: SigstoreStack, repository: str = "acme/serving", event: str = "push",
           ref: str = "refs/heads/main", called: str = CALLED) -> str:
    return stack.token(
        f"repo:{repository}:ref:{ref}", job_workflow_ref=called, repository=repository,
        ref=ref, workflow_ref=f"{repository}/.github/workflows/ci.yml@{ref}", event_name=event,
    )


class Env:
    def __init__(self) -> None:
        self.stack = SigstoreStack().__enter__()
        self.dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"redteam48b-{os.getpid()}"
        self.dir.mkdir(exist_ok=True)
        (self.dir / "tc.json").write_bytes(self.stack.trust_config_bytes())
        self.env = {"PLANCACHE_SIGSTORE_TRUST_CONFIG": str(self.dir / "tc.json")}

    def sign(self, token: str) -> bytes:
        signer = load_signer("sigstore", {**self.env, "SIGSTORE_ID_TOKEN": token})
        t = now()
        return sign_plan(NAME, plan(), signer, t, expires_at=t + timedelta(days=30))

    def keyring(self, text: str, threshold: int = 1) -> Keyring:
        k = parse_trusted_keys(text, "trusted")
        assert k.identities is not None
        return Keyring(k.keys, k.revoked, threshold, k.identities.with_root(self.stack.trusted_root_bytes()))

    def verdict(self, sidecar: bytes, text: str, threshold: int = 1) -> str:
        try:
            keyring = self.keyring(text, threshold)
        except PlanCacheError as exc:
            return f"config-error ({exc.detail[:150]})"
        try:
            v = verify_plan(NAME, plan(), sidecar, keyring, now())
        except Rejected as exc:
            return f"{exc.reason.value} ({(exc.detail or '')[:200]})"
        return f"valid (signers={v.signers})"

    def close(self) -> None:
        self.stack.close()


def report(label: str, outcome: str) -> None:
    print(f"[{CODE}] {label}: {outcome}")
