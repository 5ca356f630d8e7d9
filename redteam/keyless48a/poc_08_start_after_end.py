"""PoC 8: a part whose validFor starts after it ends (start 2026-06-01, end 2026-01-01), and an
empty validFor ({}), for each part: does the root load, what does verify say of a bundle signed
at NOW, what does doctor say. Expected: not 'valid' for the inverted window; the same story from
doctor and verify. Severity: low (an operator's typo; medium if verify and doctor disagree)."""
from common import NOW, plan_verdict, root, sidecar
from plancache.keys.sigstore_root import check_trusted_root
from plancache.cli.diagnose.trust_root_check import root_expiry

for label, window in (("inverted", {"start": "2026-06-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"}), ("empty {}", {})):
    for part in ("ca", "tlogs", "ctlogs"):
        def edit(r):
            if part == "ca":
                r["certificateAuthorities"][0]["validFor"] = window
            else:
                r[part][0]["publicKey"]["validFor"] = window
        data = root(edit)
        try:
            check_trusted_root(data, "root", NOW); load = "loads"
        except Exception as exc:
            load = f"config-error ({str(exc)[:70]})"
        try:
            exp = root_expiry(data, NOW)
        except TypeError:
            exp = root_expiry(data)
        except Exception as exc:
            exp = f"doctor error {exc}"
        print(f"{label:9} {part:6} {load:50} verify: {plan_verdict(data, sidecar())[:60]:60} doctor expiry: {exp}")
