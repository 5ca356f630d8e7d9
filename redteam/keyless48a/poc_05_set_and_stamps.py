"""PoC 5: the verified time of a Rekor v1 bundle (SET) under tampering.
 a) integratedTime +1 s (the SET covers the old value);
 b) integratedTime removed (0) while the SET stays;
 c) a SET plus the staging bundle's RFC 3161 timestamp (a TSA not in the root, over another
    signature): do SET and stamp disagree quietly?
 d) a SET plus two such timestamps;
 e) the SET's signature emptied ("") with integratedTime kept;
 f) integratedTime as the string "0001700000000" (leading zeros: same int, other text);
 g) logIndex altered (the SET covers it).
Expected: no variant verifies with a time other than the SET's; each refusal names the log proof.
"""
import base64, json
from common import HERE, bundle_verdict, root, sidecar

base = root()
sig = json.loads(sidecar())
staging = json.loads((HERE.parent.parent / "tests/data/sigstore/staging-rekor-v2-conformance-beacon.sigstore.json").read_text())
stamp = staging["verificationMaterial"]["timestampVerificationData"]["rfc3161Timestamps"][0]

def variant(edit):
    b = json.loads(json.dumps(sig)); e = b["verificationMaterial"]["tlogEntries"][0]; edit(b, e)
    return json.dumps(b).encode()

print("honest                 :", bundle_verdict(base, sidecar()))
print("a integratedTime +1    :", bundle_verdict(base, variant(lambda b, e: e.update(integratedTime=str(int(e["integratedTime"]) + 1)))))
print("b integratedTime gone  :", bundle_verdict(base, variant(lambda b, e: e.pop("integratedTime"))))
print("c SET + foreign stamp  :", bundle_verdict(base, variant(lambda b, e: b["verificationMaterial"].update(timestampVerificationData={"rfc3161Timestamps": [stamp]}))))
print("d SET + two stamps     :", bundle_verdict(base, variant(lambda b, e: b["verificationMaterial"].update(timestampVerificationData={"rfc3161Timestamps": [stamp, stamp]}))))
print("e SET emptied          :", bundle_verdict(base, variant(lambda b, e: e["inclusionPromise"].update(signedEntryTimestamp=""))))
print("f leading zeros        :", bundle_verdict(base, variant(lambda b, e: e.update(integratedTime="000" + str(e["integratedTime"])))))
print("g logIndex +1          :", bundle_verdict(base, variant(lambda b, e: e.update(logIndex=str(int(e["logIndex"]) + 1)))))

# h) the root also names the staging TSA: the stamp verifies under it, but over another
#    signature (the beacon's), so it must not count; the SET's time is the verified time.
from importlib.resources import files
stg_root = json.loads(files("sigstore._store").joinpath("https%3A%2F%2Ftuf-repo-cdn.sigstage.dev", "trusted_root.json").read_bytes())
with_tsa = root(lambda r: r.update(timestampAuthorities=stg_root["timestampAuthorities"]))
print("h SET + stamp, TSA in root:", bundle_verdict(with_tsa, variant(lambda b, e: b["verificationMaterial"].update(timestampVerificationData={"rfc3161Timestamps": [stamp]}))))
print("i no SET + stamp of another signature:", bundle_verdict(with_tsa, variant(lambda b, e: (e.pop("inclusionPromise"), b["verificationMaterial"].update(timestampVerificationData={"rfc3161Timestamps": [stamp]})))))
