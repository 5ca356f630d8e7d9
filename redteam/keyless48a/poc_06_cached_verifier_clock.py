"""PoC 6: a long-running process (the same Python process verifying many bundles, as a node
agent or a long `verify` over a big store) and a root whose new Fulcio CA starts shortly after
the process built its verifier (a rotation published ahead of time).

sigstore-python computes the CA certificates a Verifier trusts once, at construction, against the
real wall clock (`is_timerange_valid`, allow_expired=True still skips parts not yet started);
plancache caches one Verifier per root's bytes for the process (verifier_refusals.verifier).
Tried: root with the CA starting at wall-now+2 s; verify one bundle (builds the verifier); wait
3 s; sign a bundle with the (now started) CA; verify it in the same process, then in a fresh one.
Severity: medium (a good plan refused until restart, as foreign-trust-root: blames the bundle/root).
"""
import json, subprocess, sys, time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from common import FIX, HERE, META, FP, plan_bytes, bundle_verdict
sys.path.insert(0, str(HERE.parent.parent / "tests"))
from sigstore_stack import SigstoreStack
from plancache.keys.schemes import load_signer
from plancache.trust.plans.plan import plan_name
from plancache.trust.signing import sign_plan

start = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=20)
with SigstoreStack() as stack:  # the real clock
    stack.valid_for["ca"] = {"start": start.strftime("%Y-%m-%dT%H:%M:%SZ")}
    with SigstoreStack() as other:  # the old CA, in service: the verifier builds
        old_ca = other.trusted_root()["certificateAuthorities"][0]
    r = stack.trusted_root(); r["certificateAuthorities"].insert(0, old_ca)
    root = json.dumps(r).encode()
    cfg = FIX / "cfg6.json"; cfg.write_bytes(stack.trust_config_bytes())
    def sign():
        signer = load_signer("sigstore", {"SIGSTORE_ID_TOKEN": stack.token(META["identity"]), "PLANCACHE_SIGSTORE_TRUST_CONFIG": str(cfg)})
        now = datetime.now(timezone.utc)
        return sign_plan(plan_name(FP), plan_bytes(), signer, now, expires_at=now + timedelta(days=1))
    early = sign()
    META["issuer"] = stack.issuer
    import common; common.META["issuer"] = stack.issuer
    print("before the CA starts:", bundle_verdict(root, early)[:100])
    time.sleep(max(0, (start - datetime.now(timezone.utc)).total_seconds() + 1))
    late = sign()
    print("after it started, same process:", bundle_verdict(root, late)[:140])
    (FIX / "late.json").write_bytes(late); (FIX / "root6.json").write_bytes(root)
    code = ("import sys; sys.path.insert(0, %r); import common; common.META['issuer'] = %r; "
            "from pathlib import Path; print(common.bundle_verdict(Path('/tmp/rt48/root6.json').read_bytes(), Path('/tmp/rt48/late.json').read_bytes())[:100])") % (str(HERE), stack.issuer)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    print("after it started, fresh process:", (out.stdout + out.stderr).strip()[-160:])
