"""Sign real bundles through the local Fulcio/Rekor (tests/sigstore_stack.py) with the NEW code's
signer, once, and save them for the proofs of concept (which then run against old and new src).

Writes /tmp/rt48/: sidecar_now.json (a plan sidecar signed at NOW), sidecar_late.json (signed
at NOW, statement signed_at = NOW + skew exactly), root.json (the stack's root), meta.json.
"""
import json, sys
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "tests"))
from conftest import FP, NOW, plan_bytes  # noqa: E402
from plancache.keys.schemes import load_signer  # noqa: E402
from plancache.trust.plans.plan import plan_name  # noqa: E402
from plancache.trust.signing import sign_plan  # noqa: E402
from sigstore_stack import SigstoreStack  # noqa: E402

IDENTITY = "https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main"
OUT = Path("/tmp/rt48"); OUT.mkdir(exist_ok=True)
with SigstoreStack(now=NOW) as stack:
    cfg = OUT / "trust_config.json"; cfg.write_bytes(stack.trust_config_bytes())
    def sign(signed_at):
        signer = load_signer("sigstore", {"SIGSTORE_ID_TOKEN": stack.token(IDENTITY),
                                          "PLANCACHE_SIGSTORE_TRUST_CONFIG": str(cfg)})
        return sign_plan(plan_name(FP), plan_bytes(), signer, signed_at,
                         expires_at=NOW + timedelta(days=30))
    (OUT / "sidecar_now.json").write_bytes(sign(NOW))
    (OUT / "sidecar_skew_edge.json").write_bytes(sign(NOW + timedelta(minutes=5)))
    (OUT / "sidecar_skew_past.json").write_bytes(sign(NOW + timedelta(minutes=5, seconds=1)))
    (OUT / "root.json").write_bytes(stack.trusted_root_bytes())
    (OUT / "meta.json").write_text(json.dumps({"issuer": stack.issuer, "identity": IDENTITY,
                                               "now": NOW.isoformat()}))
print("ok", sorted(p.name for p in OUT.iterdir()))
