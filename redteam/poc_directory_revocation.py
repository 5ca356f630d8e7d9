"""A revocation near miss split across a trusted-keys directory (issue 48 item 5).

Tried: a directory with trusted.pub (the bake line) and revoked.pub (the same line, @revoked,
with the org in capitals: a line that can never match what trusted.pub trusts). Within one file
this is a load error; split across two files (each checked alone) it loaded, and the revoked
identity's bundle stayed valid. Expected: refused at load, as in one file."""
import tempfile
from pathlib import Path

from harness import SAN, Env, NAME, now, plan, report
from plancache.keys.keyfile import load_keyring
from plancache.trust.errors import PlanCacheError, Rejected
from plancache.trust.keyring.keys import Keyring
from plancache.trust.verify import verify_plan

e = Env()
iss = e.stack.issuer
acme = e.sign(e.stack.token("x", job_workflow_ref=SAN.removeprefix("https://github.com/"),
                            repository="acme/serving", ref="refs/heads/main",
                            workflow_ref="acme/serving/.github/workflows/ci.yml@refs/heads/main",
                            event_name="push"))
with tempfile.TemporaryDirectory() as d:
    (Path(d) / "trusted.pub").write_text(f"sigstore issuer={iss} identity={SAN}\n")
    (Path(d) / "revoked.pub").write_text(
        f"@revoked sigstore issuer={iss} identity={SAN.replace('acme', 'ACME')}\n")
    try:
        k = load_keyring(Path(d), pin_root=False)
    except PlanCacheError as exc:
        report("directory: trusted.pub + near-miss revoked.pub", f"refused at load: {exc.detail[:150]}")
    else:
        ids = k.identities.with_root(e.stack.trusted_root_bytes())
        try:
            verify_plan(NAME, plan(), acme, Keyring(k.keys, k.revoked, 1, ids), now())
            report("directory: trusted.pub + near-miss revoked.pub", "loaded; the identity's bundle is VALID (the revocation revoked nothing)")
        except Rejected as exc:
            report("directory: trusted.pub + near-miss revoked.pub", f"loaded; bundle {exc.reason.value}")
e.close()
