"""Shared by the proofs of concept: load the fixtures of make_fixtures.py, build variant roots,
and verify a plan sidecar end to end (verify_plan, as the CLI and the plugin do) or the bundle
alone (open_bundle). Runs against whatever plancache PYTHONPATH names (old or new)."""
import copy, json, sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "tests"))
from conftest import FP, NOW, plan_bytes  # noqa: E402,F401
from plancache.trust.errors import Rejected  # noqa: E402
from plancache.trust.keyless.sigstore_bundle import open_bundle  # noqa: E402
from plancache.trust.keyring.keys import Keyring  # noqa: E402
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys  # noqa: E402
from plancache.trust.plans.plan import plan_name  # noqa: E402
from plancache.trust.verify import verify_plan  # noqa: E402

FIX = Path("/tmp/rt48")
META = json.loads((FIX / "meta.json").read_text())
BASE_ROOT = json.loads((FIX / "root.json").read_text())


def t(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


EPOCH = "2020-01-01T00:00:00Z"
RETIRED = {"start": EPOCH, "end": t(NOW - timedelta(days=1))}
CURRENT = {"start": EPOCH, "end": t(NOW + timedelta(days=1))}
LATER = {"start": t(NOW + timedelta(days=4000))}


def root(edit=None) -> bytes:
    r = copy.deepcopy(BASE_ROOT)
    if edit:
        edit(r)
    return json.dumps(r).encode()


def policy(root_bytes: bytes, options: str = ""):
    line = f"{options} sigstore issuer={META['issuer']} identity={META['identity']}\n".lstrip()
    return parse_trusted_keys(line, "trusted").identities.with_root(root_bytes)


def sidecar(name: str = "now") -> bytes:
    return (FIX / f"sidecar_{name}.json").read_bytes()


def bundle_verdict(root_bytes: bytes, sig: bytes, options: str = "") -> str:
    try:
        _, signers = open_bundle(sig, policy(root_bytes, options), 64 * 1024)
    except Rejected as exc:
        return f"{exc.reason.value}: {exc.detail[:150]}"
    except Exception as exc:  # a crash is a finding too
        return f"CRASH {type(exc).__name__}: {exc}"[:200]
    return f"valid (log_time={getattr(signers[0], 'log_time', None)})"


def plan_verdict(root_bytes: bytes, sig: bytes, now: datetime = NOW, options: str = "") -> str:
    keyring = Keyring(identities=policy(root_bytes, options))
    try:
        verify_plan(plan_name(FP), plan_bytes(), sig, keyring, now)
    except Rejected as exc:
        return f"{exc.reason.value}: {exc.detail[:150]}"
    except Exception as exc:
        return f"CRASH {type(exc).__name__}: {exc}"[:200]
    return "valid"
