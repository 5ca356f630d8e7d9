"""PoC 1: two entries of the root with the same key but different windows (rotation twins: a key
that served, was retired, and serves again under a new window, or a root listing a key twice).

Tried: the bundle was signed at NOW by the stack's key; the root lists that key twice, once
RETIRED (ended the day before) and once CURRENT. Verified with the retired twin first, then the
current twin first. Also: doctor's view of each root (root_expiry).
Expected (order-free verdict, as the CA rule already says 'one of them must cover it'): valid both
ways. Severity if order decides: medium (a good plan refused as retired-trust-root, blaming the
root; the verdict depends on the order of entries; doctor says OK for the same root).
"""
import copy
from common import CURRENT, RETIRED, bundle_verdict, root, sidecar

def twins(part, first, second):
    def edit(r):
        key = "certificateAuthorities" if part == "ca" else part
        a, b = copy.deepcopy(r[key][0]), copy.deepcopy(r[key][0])
        where = (lambda e: e) if part == "ca" else (lambda e: e["publicKey"])
        where(a)["validFor"], where(b)["validFor"] = first, second
        r[key] = [a, b]
    return edit

for part in ("tlogs", "ctlogs", "ca"):
    for label, order in (("retired first", (RETIRED, CURRENT)), ("current first", (CURRENT, RETIRED))):
        data = root(twins(part, *order))
        try:
            from plancache.cli.diagnose.trust_root_check import root_expiry
            doctor = root_expiry(data)
        except Exception as exc:
            doctor = f"n/a ({type(exc).__name__})"
        print(f"{part:6} {label:14} verify: {bundle_verdict(data, sidecar())[:90]}  | doctor expiry: {doctor}")
