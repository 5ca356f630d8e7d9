"""PoC 3: doctor and verify on the same root, at the same moment (NOW, the injectable clock).

 a) the stack's CA listed twice: once RETIRED (ended yesterday), once not yet started (LATER):
    between the two windows nothing signed can verify;
 b) the same for the transparency log (retired + later) and c) for the CT log;
 d) the only log's window ends an hour after NOW (valid at load): a bundle signed at NOW
    verifies an hour later too (the verified time decides), and doctor at NOW+2h says expired.
Expected: when verify refuses every bundle signed now, doctor must not say 'ok'.
Severity: medium (doctor says OK while every new plan is refused: the operator is misled).
"""
import copy
from datetime import timedelta
from common import LATER, NOW, RETIRED, bundle_verdict, plan_verdict, root, sidecar, t
from plancache.cli.diagnose.setup_checks import Checks

def doctor(data, now=NOW):
    import os, tempfile
    from plancache.cli.diagnose.trust_root_check import check_trust_root
    from common import policy
    from plancache.trust.keyring.keys import Keyring
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        f.write(data)
    os.environ["PLANCACHE_SIGSTORE_TRUSTED_ROOT"] = f.name
    checks = Checks()
    check_trust_root(checks, Keyring(identities=policy(data)), now)
    row = checks.items[0]
    return f"{row['status']}: {row['detail'][:90]}"

def pair(part, first, second):
    def edit(r):
        key = "certificateAuthorities" if part == "ca" else part
        a, b = copy.deepcopy(r[key][0]), copy.deepcopy(r[key][0])
        where = (lambda e: e) if part == "ca" else (lambda e: e["publicKey"])
        where(a)["validFor"], where(b)["validFor"] = first, second
        r[key] = [a, b]
    return edit

for part in ("ca", "tlogs", "ctlogs"):
    data = root(pair(part, RETIRED, LATER))
    print(f"{part:6} retired+later: verify now: {plan_verdict(data, sidecar())[:80]} | doctor now: {doctor(data)}")
data = root(lambda r: r["tlogs"][0]["publicKey"].update(validFor={"start": "2020-01-01T00:00:00Z", "end": t(NOW + timedelta(hours=1))}))
print("log ends NOW+1h: verify at NOW+2h:", plan_verdict(data, sidecar(), now=NOW + timedelta(hours=2))[:60],
      "| doctor NOW+2h:", doctor(data, NOW + timedelta(hours=2)))
