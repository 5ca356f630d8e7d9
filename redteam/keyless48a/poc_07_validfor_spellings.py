"""PoC 7: validFor spellings. For each string as the transparency log's validFor.end: what
plancache's reader (trust_root.parse_root) makes of it, what sigstore-models makes of it, and
whether the root loads (check_trusted_root). A spelling both accept but read as different
instants would let the two halves judge different windows.
Severity: medium if they disagree on an instant; low if one refuses (config-error at load).
"""
import json
from datetime import timezone
from common import root
from plancache.trust.keyless.trust_root import parse_root
from plancache.keys.sigstore_root import check_trusted_root

def sig_models(data):
    from sigstore_models.trustroot import v1
    try:
        r = v1.TrustedRoot.from_json(data)
        e = r.tlogs[0].public_key.valid_for.end
        return e.astimezone(timezone.utc).isoformat() if e else None
    except Exception as exc:
        return f"refused ({type(exc).__name__})"

for end in ["2026-12-31T23:59:59Z", "2026-12-31T23:59:60Z", "2026-12-31T23:59:59.123456789Z",
            "2026-12-31T23:59:59+05:30", "2026-12-31T23:59:59z", "2026-12-31t23:59:59Z",
            "2026-12-31 23:59:59Z", "20261231T235959Z", "2026-W53-4T23:59:59Z",
            "2026-12-31T23:59:59", "2026-12-31", "9999-12-31T23:59:59-01:00", "2026-12-31T23:59:59.5Z",
            "2026-12-31T23:59:59,5Z", "2026-12-31T23:59:59+0530", "2026-12-31T23:59:59.1234567+00:00"]:
    data = root(lambda r: r["tlogs"][0]["publicKey"].update(validFor={"start": "2020-01-01T00:00:00Z", "end": end}))
    try:
        ours = parse_root(data).tlogs[0].window.end
        ours = ours.isoformat() if ours else None
    except ValueError as exc:
        ours = f"refused ({str(exc)[:40]})"
    try:
        check_trusted_root(data, "root"); load = "loads"
    except Exception as exc:
        load = "config-error"
    theirs = sig_models(data)
    flag = "" if (ours == theirs or "refused" in str(ours) or "refused" in str(theirs)) else "  <-- DISAGREE"
    print(f"{end:36} ours={ours!s:40} sigstore={theirs!s:40} {load}{flag}")
