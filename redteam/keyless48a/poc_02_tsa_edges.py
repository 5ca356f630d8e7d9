"""PoC 2: a Rekor v2 bundle (staging conformance beacon; its verified time is one RFC 3161 stamp)
under the staging root whose timestamp authority's validFor is edited:
 a) end == the stamp's time exactly (windows include their end, says trust_root.Window);
 b) start == the stamp's time exactly;
 c) no validFor at all (plancache reads: always valid);
 d) validFor with an end but no start;
 e) validFor with a +05:30 offset and fractional seconds that equal the stamp's time;
 f) the TSA listed twice (retired twin first, current second);
 g) the transparency log's window ending exactly at the stamp's time.
Severity: medium where a reason blames the wrong party (foreign/bad-bundle for the root's own
retired or misconfigured TSA), or a root plancache loads fine makes every such bundle fail.
"""
import copy, json
from datetime import timedelta
from importlib.resources import files
from pathlib import Path
from common import HERE
from plancache.trust.errors import Rejected
from plancache.trust.keyless.sigstore_bundle import open_bundle
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys

STAGING = json.loads(files("sigstore._store").joinpath(
    "https%3A%2F%2Ftuf-repo-cdn.sigstage.dev", "trusted_root.json").read_bytes())
DATA = (HERE.parent.parent / "tests/data/sigstore/staging-rekor-v2-conformance-beacon.sigstore.json").read_bytes()
IDENT = ("https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/"
         ".github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main")
ids = parse_trusted_keys(f"sigstore issuer=https://token.actions.githubusercontent.com identity={IDENT}\n", "t").identities

def verdict(root):
    try:
        from plancache.keys.sigstore_root import check_trusted_root
        check_trusted_root(json.dumps(root).encode(), "root")
        load = "loads"
    except Exception as exc:
        load = f"load refused ({type(exc).__name__}: {str(exc)[:60]})"
    try:
        _, (s,) = open_bundle(DATA, ids.with_root(json.dumps(root).encode()), 64 * 1024)
        return f"{load}; valid log_time={s.log_time}"
    except Rejected as exc:
        return f"{load}; {exc.reason.value}: {exc.detail[:110]}"
    except Exception as exc:
        return f"{load}; CRASH {type(exc).__name__}: {exc}"[:160]

_, (honest,) = open_bundle(DATA, ids.with_root(json.dumps(STAGING).encode()), 64 * 1024)
gen = honest.log_time
Z = lambda d: d.strftime("%Y-%m-%dT%H:%M:%S") + (f".{d.microsecond:06d}" if d.microsecond else "") + "Z"
print("stamp time", gen, "TSAs:", len(STAGING["timestampAuthorities"]), "tlogs:", len(STAGING["tlogs"]))
cases = {
 "a end==stamp": lambda r: [t["validFor"].update(end=Z(gen)) for t in r["timestampAuthorities"]],
 "b start==stamp": lambda r: [t["validFor"].update(start=Z(gen)) for t in r["timestampAuthorities"]],
 "c no validFor": lambda r: [t.pop("validFor") for t in r["timestampAuthorities"]],
 "d no start": lambda r: [t["validFor"].pop("start") for t in r["timestampAuthorities"]],
 "e +05:30 .000": lambda r: [t["validFor"].update(end=(gen + timedelta(hours=5, minutes=30)).strftime("%Y-%m-%dT%H:%M:%S.000+05:30")) for t in r["timestampAuthorities"]],
 "f twin retired first": lambda r: r.update(timestampAuthorities=[dict(copy.deepcopy(t), validFor={"start": "2020-01-01T00:00:00Z", "end": Z(gen - timedelta(days=1))}) for t in r["timestampAuthorities"]] + r["timestampAuthorities"]),
 "g tlog end==stamp": lambda r: [t["publicKey"]["validFor"].update(end=Z(gen)) for t in r["tlogs"]],
 "h tlog end==stamp-1s": lambda r: [t["publicKey"]["validFor"].update(end=Z(gen - timedelta(seconds=1))) for t in r["tlogs"]],
}
for name, edit in cases.items():
    r = copy.deepcopy(STAGING); edit(r)
    print(f"{name:22} {verdict(r)}")
