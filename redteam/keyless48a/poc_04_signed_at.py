"""PoC 4: a keyless statement's signed_at against its verified time (the log's, NOW).
 a) signed_at = verified + skew exactly (5 min): the edge, expected valid;
 b) signed_at = verified + skew + 1 s: expected signing-time-mismatch;
 c) a) verified one hour later (now = NOW+1h), and at now = NOW (signed_at in the future by the
    skew exactly, at the 'not-yet-valid' edge too);
 d) co-signing (thresholds 1 and 2): a key signs the statement at NOW; the same statement co-signed by an identity
    whose log records it a day later (the stack at NOW+1d): one entry's time vs the statement.
Severity: low unless a misdated statement verifies (high) or a good co-signed plan is refused.
"""
import sys
from datetime import timedelta
from common import NOW, FIX, META, plan_verdict, root, sidecar, HERE, FP, plan_bytes, policy

base = root()
print("a skew edge  at NOW   :", plan_verdict(base, sidecar("skew_edge")))
print("a skew edge  at NOW+1h:", plan_verdict(base, sidecar("skew_edge"), now=NOW + timedelta(hours=1)))
print("b skew +1s   at NOW+1h:", plan_verdict(base, sidecar("skew_past"), now=NOW + timedelta(hours=1)))

# d) co-signing across a day (signs with the new code's signer: a fixture step, not the verifier)
from plancache.trust import envelope as dsse
from plancache.trust.keyless.dsse_extension import as_extension
from plancache.trust.keyring.keys import Keyring
from plancache.trust.plans.plan import plan_name
from plancache.trust.signing import sign_plan
from plancache.trust.verify import verify_plan
from plancache.trust.errors import Rejected
sys.path.insert(0, str(HERE.parent.parent / "tests"))
try:
    from plancache.keys.schemes import load_signer
    from conftest import keyring_of, make_signer
except Exception as exc:
    print("d skipped:", exc); raise SystemExit
from sigstore_stack import SigstoreStack
key = make_signer()
keysig = sign_plan(plan_name(FP), plan_bytes(), key, NOW, expires_at=NOW + timedelta(days=30))
env = dsse.decode(keysig, dsse.MAX_SIG_BYTES)
for later in (timedelta(minutes=4), timedelta(days=1)):
    with SigstoreStack(now=NOW + later) as stack:
        cfg = FIX / "cfg2.json"; cfg.write_bytes(stack.trust_config_bytes())
        signer = load_signer("sigstore", {"SIGSTORE_ID_TOKEN": stack.token(META["identity"]),
                                          "PLANCACHE_SIGSTORE_TRUST_CONFIG": str(cfg)})
        bundle = signer.sign_statement(env.payload)
        line = f"sigstore issuer={stack.issuer} identity={META['identity']}\n"
        from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys
        ids = parse_trusted_keys(line, "t").identities.with_root(stack.trusted_root_bytes())
        co = dsse.encode(dsse.Envelope(env.payload_type, env.payload, env.signatures + as_extension(bundle).signatures))
        for threshold in (1, 2):
            keyring = Keyring(keyring_of(key).keys, frozenset(), threshold, ids)
            try:
                verify_plan(plan_name(FP), plan_bytes(), co, keyring, NOW + later + timedelta(minutes=1))
                print(f"d co-signed {later} later, threshold {threshold}:", "valid")
            except Rejected as exc:
                print(f"d co-signed {later} later, threshold {threshold}:", exc.reason.value, exc.detail[:100])
        # e) the key alone (the same envelope before the keyless co-signature), threshold 1
        try:
            verify_plan(plan_name(FP), plan_bytes(), keysig, Keyring(keyring_of(key).keys, frozenset(), 1, ids), NOW + later + timedelta(minutes=1))
            print(f"e the key's signature alone, {later} later, threshold 1: valid")
        except Rejected as exc:
            print("e key alone:", exc.reason.value)
