"""Issue 48 items 1, 2 and 4: retired trust-root parts stay retired, the verified time decides,
and a root that can verify nothing says so where it is loaded.

Each bundle is signed for real through the local Fulcio and Rekor (tests/sigstore_stack.py) at
a moment the test chooses, under a root whose parts' ``validFor`` windows the test chooses: a
Fulcio CA, CT log or transparency log retired before that moment still signs (a compromised or
retired part does what it is asked), and ``verify`` must refuse what it signed, while ``doctor``
says the same of the same root.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from cli_support import run
from conftest import FP, NOW, plan_bytes
from plancache.cli.diagnose.doctor import Checks
from plancache.cli.diagnose.trust_root_check import check_trust_root
from plancache.keys.schemes import load_signer
from plancache.keys.sigstore_root import check_trusted_root
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust.errors import ConfigError, Reason, Rejected
from plancache.trust.keyless.sigstore_bundle import open_bundle
from plancache.trust.keyring.identities import IdentityPolicy
from plancache.trust.keyring.keys import Keyring
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys
from plancache.trust.plans.plan import plan_name
from plancache.trust.signing import sign_plan
from plancache.trust.statement import format_time
from plancache.trust.verify import verify_plan
from sigstore_stack import SigstoreStack

IDENTITY = "https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main"
NAME = plan_name(FP)
CAP = 64 * 1024
DATA = Path(__file__).parent / "data" / "sigstore"
EPOCH = "2020-01-01T00:00:00Z"
RETIRED = {"start": EPOCH, "end": format_time(NOW - timedelta(days=1))}
"""A window that ended the day before the stack signs."""
CURRENT = {"start": EPOCH, "end": format_time(NOW + timedelta(days=1))}
LATER = {"start": format_time(NOW + timedelta(days=400))}
"""A window that has not started, even on the real clock."""


@pytest.fixture(scope="module")
def stack() -> Iterator[SigstoreStack]:
    with SigstoreStack(now=NOW) as s:
        yield s


def _signed(stack: SigstoreStack, folder: Path, signed_at: datetime = NOW) -> bytes:
    config = folder / "trust_config.json"
    config.write_bytes(stack.trust_config_bytes())
    signer = load_signer(
        "sigstore",
        {
            "SIGSTORE_ID_TOKEN": stack.token(IDENTITY),
            "PLANCACHE_SIGSTORE_TRUST_CONFIG": str(config),
        },
    )
    return sign_plan(NAME, plan_bytes(), signer, signed_at, expires_at=NOW + timedelta(days=30))


@pytest.fixture(scope="module")
def sidecar(stack: SigstoreStack, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return _signed(stack, tmp_path_factory.mktemp("signed"))


def _root(stack: SigstoreStack, **valid_for: dict[str, str]) -> bytes:
    saved = dict(stack.valid_for)
    stack.valid_for.update(valid_for)
    try:
        return stack.trusted_root_bytes()
    finally:
        stack.valid_for = saved


def _policy(stack: SigstoreStack, root: bytes, options: str = "") -> IdentityPolicy:
    line = f"{options} sigstore issuer={stack.issuer} identity={IDENTITY}\n".lstrip()
    ids = parse_trusted_keys(line, "trusted").identities
    assert ids is not None
    return ids.with_root(root)


def _reason(data: bytes, policy: IdentityPolicy) -> Reason | None:
    try:
        open_bundle(data, policy, CAP)
    except Rejected as exc:
        return exc.reason
    return None


# -- item 1: retired stays retired -------------------------------------------------------------


@pytest.mark.parametrize("part", ["ca", "ctlog", "tlog"])
def test_a_part_retired_before_the_verified_time_vouches_for_nothing(
    stack: SigstoreStack, sidecar: bytes, part: str
) -> None:
    """The part signed (a retired key does what it is asked): its cryptography holds, its
    window does not. Signed while it was current, the same bundle verifies."""
    assert _reason(sidecar, _policy(stack, _root(stack, **{part: CURRENT}))) is None
    retired = _root(stack, **{part: RETIRED})
    with pytest.raises(Rejected) as caught:
        open_bundle(sidecar, _policy(stack, retired), CAP)
    assert caught.value.reason is Reason.RETIRED_TRUST_ROOT
    assert format_time(NOW) in caught.value.detail  # the verified time it was judged at


def test_doctor_and_verify_agree_on_a_retired_root(
    stack: SigstoreStack, sidecar: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One root, read twice: ``doctor`` says it expired, and ``verify`` refuses what its retired
    parts signed after their end (before issue 48, ``doctor`` said expired and ``verify`` valid)."""
    retired = _root(stack, ca=RETIRED, ctlog=RETIRED, tlog=RETIRED)
    path = tmp_path / "root.json"
    path.write_bytes(retired)
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT", str(path))
    checks = Checks()
    keyring = Keyring(identities=_policy(stack, retired))
    check_trust_root(checks, keyring, NOW)
    (row,) = checks.items
    assert row["status"] == "fail" and "expired" in row["detail"], row
    assert _reason(sidecar, _policy(stack, retired)) is Reason.RETIRED_TRUST_ROOT


@pytest.mark.parametrize("part", ["ca", "ctlogs", "tlogs"])
@pytest.mark.parametrize("retired_first", [True, False])
def test_a_key_listed_once_per_window_is_judged_by_every_window_in_any_order(
    stack: SigstoreStack, sidecar: bytes, part: str, retired_first: bool
) -> None:
    """The same key twice (served, retired, serving again): one of its windows covers the
    verified time, so it verifies whichever entry the root lists first (red team 48a: with the
    retired twin first, a current log's or CT log's bundle was ``retired-trust-root``)."""
    root = json.loads(stack.trusted_root_bytes())
    key = "certificateAuthorities" if part == "ca" else part
    retired, current = json.loads(json.dumps(root[key][0])), json.loads(json.dumps(root[key][0]))
    for entry, window in ((retired, RETIRED), (current, CURRENT)):
        (entry if part == "ca" else entry["publicKey"])["validFor"] = window
    root[key] = [retired, current] if retired_first else [current, retired]
    assert _reason(sidecar, _policy(stack, json.dumps(root).encode())) is None
    root[key] = [retired, dict(retired)]  # and with no window covering it, still refused
    assert _reason(sidecar, _policy(stack, json.dumps(root).encode())) is (
        Reason.RETIRED_TRUST_ROOT
    )


@pytest.mark.parametrize("part", ["ca", "ctlogs", "tlogs"])
def test_doctor_and_verify_agree_between_a_retired_part_and_its_successor(
    stack: SigstoreStack,
    sidecar: bytes,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    part: str,
) -> None:
    """A part retired yesterday and its successor not yet in service: nothing signed now
    verifies, and ``doctor`` says so (red team 48a: it counted the successor's open end and
    said ok, valid for years)."""
    root = json.loads(stack.trusted_root_bytes())
    key = "certificateAuthorities" if part == "ca" else part
    retired, later = json.loads(json.dumps(root[key][0])), json.loads(json.dumps(root[key][0]))
    for entry, window in ((retired, RETIRED), (later, LATER)):
        (entry if part == "ca" else entry["publicKey"])["validFor"] = window
    root[key] = [retired, later]
    data = json.dumps(root).encode()
    path = tmp_path / "root.json"
    path.write_bytes(data)
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT", str(path))
    checks = Checks()
    check_trust_root(checks, Keyring(identities=_policy(stack, data)), NOW)
    (row,) = checks.items
    assert row["status"] == "fail" and "expired" in row["detail"], row
    assert _reason(sidecar, _policy(stack, data)) is Reason.RETIRED_TRUST_ROOT


def test_a_ca_that_starts_after_the_verifier_was_built_verifies_once_it_has_started(
    stack: SigstoreStack, sidecar: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rotation published ahead of time: the new CA starts after the process verified its
    first bundle. sigstore-python keeps the CAs that had started when its verifier was built,
    on the real clock; that clock is moved here (sigstore-python reads no other), and once the
    CA has started its bundle verifies in the same process (red team 48a: the cached verifier
    refused it as ``foreign-trust-root`` until a restart)."""
    import sigstore._utils

    from plancache.trust.keyless import verifier_refusals

    moment = [NOW - timedelta(hours=1)]

    class Wall(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return moment[0]

    monkeypatch.setattr(sigstore._utils, "datetime", Wall)
    monkeypatch.setattr(verifier_refusals, "datetime", Wall)
    root = json.loads(stack.trusted_root_bytes())
    root["certificateAuthorities"][0]["validFor"] = {
        "start": format_time(NOW - timedelta(minutes=30))
    }
    with SigstoreStack() as other:  # the CA in service before it: the verifier builds
        root["certificateAuthorities"].insert(0, other.trusted_root()["certificateAuthorities"][0])
    policy = _policy(stack, json.dumps(root).encode())
    # not started yet on the verifier's clock: the root's CA, not another instance's (red team
    # 48a: it was foreign-trust-root)
    assert _reason(sidecar, policy) is Reason.RETIRED_TRUST_ROOT
    moment[0] = NOW + timedelta(minutes=1)
    assert _reason(sidecar, policy) is None


# -- item 4: a root that can verify nothing is a config error -----------------------------------


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda r: r.update(ctlogs=[]), "no CT log"),
        (lambda r: r.update(tlogs=[]), "no transparency log"),
        (lambda r: r["tlogs"][0]["publicKey"].update(validFor=LATER), "transparency-log key"),
        (lambda r: r["ctlogs"][0]["publicKey"].update(validFor=LATER), "CT log key"),
        (lambda r: r["certificateAuthorities"][0].update(validFor=LATER), "certificate authority"),
        (  # red team 48a: a window ending before it starts (a typo) loaded, refusing everything
            lambda r: r["ctlogs"][0]["publicKey"].update(
                validFor={"start": "2026-06-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"}
            ),
            "before it starts",
        ),
    ],
)
def test_a_root_that_can_verify_no_bundle_is_a_config_error_and_doctor_fails(
    stack: SigstoreStack,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    change: Any,
    said: str,
) -> None:
    """Before issue 48 such a root loaded, ``doctor`` said OK and every bundle was ``bad-bundle``
    (exit 1, blaming the bundles)."""
    root = json.loads(stack.trusted_root_bytes())
    change(root)
    path = tmp_path / "root.json"
    path.write_text(json.dumps(root))
    with pytest.raises(ConfigError) as caught:
        check_trusted_root(path.read_bytes(), str(path))
    assert said in caught.value.detail
    trusted = tmp_path / "trusted"
    trusted.write_text(f"sigstore issuer={stack.issuer} identity={IDENTITY}\n")
    plans = tmp_path / "plans"
    LocalPlanDir(plans).write(FP, plan_bytes(), None)
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT", "")
    args = ("--trusted-keys", str(trusted), "--trusted-root", str(path))
    code, _, err = run(capsys, "verify", *args, str(plans))
    assert code == 2 and said in err, err
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(trusted))
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT", str(path))
    _, out, _ = run(capsys, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["sigstore-trust-root"]["status"] == "fail", checks
    assert said in checks["sigstore-trust-root"]["detail"]


def test_another_instances_log_key_is_a_foreign_trust_root(
    stack: SigstoreStack, sidecar: bytes
) -> None:
    """The pinned root's CA and CT log, another instance's Rekor: the entry's log is not one the
    root names (before issue 48: ``bad-log-proof``)."""
    root = json.loads(stack.trusted_root_bytes())
    with SigstoreStack() as other:
        root["tlogs"] = json.loads(other.trusted_root_bytes())["tlogs"]
    with pytest.raises(Rejected) as caught:
        open_bundle(sidecar, _policy(stack, json.dumps(root).encode()), CAP)
    assert caught.value.reason is Reason.FOREIGN_TRUST_ROOT
    assert "transparency log" in caught.value.detail


# -- item 2: the verified time decides ---------------------------------------------------------


def test_an_identity_window_is_judged_at_the_verified_time_not_signed_at(
    stack: SigstoreStack, tmp_path: Path
) -> None:
    """``valid-after=FIX`` (trust the workflow only for what it signs after an incident): a
    signature logged before FIX, its statement dated after FIX, is refused. With the skew wide
    enough to let the date pass, the window still judges the log's time (``expired``); at the
    default skew the misdated statement is refused for what it is."""
    fix = NOW + timedelta(hours=1)
    misdated = _signed(stack, tmp_path, signed_at=NOW + timedelta(hours=2))
    keyring = Keyring(
        identities=_policy(stack, stack.trusted_root_bytes(), f"valid-after={format_time(fix)}")
    )
    later = NOW + timedelta(hours=3)
    with pytest.raises(Rejected) as caught:
        verify_plan(NAME, plan_bytes(), misdated, keyring, later)
    assert caught.value.reason is Reason.SIGNING_TIME_MISMATCH
    assert format_time(NOW) in caught.value.detail
    with pytest.raises(Rejected) as caught:
        verify_plan(NAME, plan_bytes(), misdated, keyring, later, clock_skew=timedelta(hours=3))
    assert caught.value.reason is Reason.EXPIRED


def test_a_statement_backdated_before_its_log_time_is_refused(
    stack: SigstoreStack, tmp_path: Path
) -> None:
    backdated = _signed(stack, tmp_path, signed_at=NOW - timedelta(hours=1))
    keyring = Keyring(identities=_policy(stack, stack.trusted_root_bytes()))
    with pytest.raises(Rejected) as caught:
        verify_plan(NAME, plan_bytes(), backdated, keyring, NOW)
    assert caught.value.reason is Reason.SIGNING_TIME_MISMATCH
    within = _signed(stack, tmp_path, signed_at=NOW - timedelta(minutes=4))
    assert verify_plan(NAME, plan_bytes(), within, keyring, NOW).identities


def test_an_unsigned_integrated_time_never_becomes_the_log_time() -> None:
    """A Rekor v2 bundle (an RFC 3161 timestamp, no SET) with an ``integratedTime`` added by
    anyone: it still verifies (nothing signs that field), and ``log_time`` is the TSA's."""
    from importlib.resources import files

    staging = (
        files("sigstore._store")
        .joinpath("https%3A%2F%2Ftuf-repo-cdn.sigstage.dev", "trusted_root.json")
        .read_bytes()
    )
    data = json.loads((DATA / "staging-rekor-v2-conformance-beacon.sigstore.json").read_bytes())
    identity = (
        "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/"
        ".github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main"
    )
    line = f"sigstore issuer=https://token.actions.githubusercontent.com identity={identity}\n"
    ids = parse_trusted_keys(line, "t").identities
    assert ids is not None
    _, (honest,) = open_bundle(json.dumps(data).encode(), ids.with_root(staging), CAP)
    data["verificationMaterial"]["tlogEntries"][0]["integratedTime"] = "1700000000"
    _, (signer,) = open_bundle(json.dumps(data).encode(), ids.with_root(staging), CAP)
    assert signer.log_time == honest.log_time
    assert signer.log_time != datetime.fromtimestamp(1700000000, timezone.utc)


def test_a_bundle_without_a_set_holds_exactly_one_timestamp(stack: SigstoreStack) -> None:
    """Its verified time is its one timestamp: with two, which one the verifier trusted is
    unknown (sigstore-python does not say)."""
    data = json.loads((DATA / "staging-rekor-v2-conformance-beacon.sigstore.json").read_bytes())
    stamps = data["verificationMaterial"]["timestampVerificationData"]["rfc3161Timestamps"]
    stamps.append({"signedTimestamp": base64.b64encode(b"\x30\x00").decode()})
    ids = parse_trusted_keys(f"sigstore issuer={stack.issuer} identity={IDENTITY}\n", "t")
    assert ids.identities is not None
    policy = ids.identities.with_root(stack.trusted_root_bytes())
    with pytest.raises(Rejected) as caught:
        open_bundle(json.dumps(data).encode(), policy, CAP)
    assert caught.value.reason is Reason.MALFORMED
    assert "one RFC 3161 timestamp" in caught.value.detail


def test_a_keyless_batch_dates_each_statement_when_it_is_signed(tmp_path: Path) -> None:
    """``sign`` takes one ``now`` for a whole directory; a keyless statement must agree with its
    log's time, so a long batch (here: ``now`` twenty minutes old, as after many Rekor round
    trips) dates each keyless statement when it is signed, and every plan is signed."""
    from plancache.pipeline.directory_signing import SigningRequest, sign_directory

    plans = LocalPlanDir(tmp_path / "plans")
    plans.write(FP, plan_bytes(), None)
    plans.write("fedcba9876543210", plan_bytes(fp="fedcba9876543210"), None)
    with SigstoreStack() as live:  # the real clock: the signer's moment is the log's
        config = tmp_path / "trust_config.json"
        config.write_bytes(live.trust_config_bytes())
        signer = load_signer(
            "sigstore",
            {
                "SIGSTORE_ID_TOKEN": live.token(IDENTITY),
                "PLANCACHE_SIGSTORE_TRUST_CONFIG": str(config),
            },
        )
        stale = datetime.now(timezone.utc) - timedelta(minutes=20)
        outcomes = sign_directory(plans, signer, stale, SigningRequest())
    assert [(o.action, o.reason) for o in outcomes] == [("signed", "")] * 2, outcomes


def test_the_shipped_public_good_root_holds_a_retired_ca_whose_certificate_outlives_it() -> None:
    """Why the windows are checked at all: Sigstore retires a CA by its ``validFor`` end, while
    its certificate stays valid for years (a chain check at the signing time would pass)."""
    from cryptography import x509

    from plancache.keys.sigstore_root import public_good_root
    from plancache.trust.keyless.trust_root import parse_root

    root = parse_root(public_good_root())
    retired = [
        ca
        for ca in root.cas
        if ca.window.end is not None
        and ca.window.end.year == 2022
        and x509.load_der_x509_certificate(ca.certificates[-1]).not_valid_after_utc.year >= 2031
    ]
    assert retired, [(ca.name, ca.window) for ca in root.cas]
    assert any(not k.window.covers(NOW) for k in root.ctlogs)  # and a retired CT log


def test_a_timestamp_authority_retired_before_its_stamp_is_a_retired_trust_root() -> None:
    """A real Rekor v2 bundle (its time is a TSA's) under its own root, then under the same root
    with the TSA's window ended before the stamp: sigstore-python drops the timestamp and says
    no verified time is left; plancache names the retired TSA."""
    from importlib.resources import files

    staging = json.loads(
        files("sigstore._store")
        .joinpath("https%3A%2F%2Ftuf-repo-cdn.sigstage.dev", "trusted_root.json")
        .read_bytes()
    )
    data = (DATA / "staging-rekor-v2-conformance-beacon.sigstore.json").read_bytes()
    identity = (
        "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/"
        ".github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main"
    )
    line = f"sigstore issuer=https://token.actions.githubusercontent.com identity={identity}\n"
    ids = parse_trusted_keys(line, "t").identities
    assert ids is not None
    _, (signer,) = open_bundle(data, ids.with_root(json.dumps(staging).encode()), CAP)
    assert signer.log_time is not None
    for tsa in staging["timestampAuthorities"]:
        tsa["validFor"]["end"] = format_time(signer.log_time - timedelta(days=1))
    with pytest.raises(Rejected) as caught:
        open_bundle(data, ids.with_root(json.dumps(staging).encode()), CAP)
    assert caught.value.reason is Reason.RETIRED_TRUST_ROOT
    assert "timestamp authority" in caught.value.detail
    staging["timestampAuthorities"][0]["certChain"] = staging["certificateAuthorities"][0][
        "certChain"
    ]  # another authority's chain: the stamp verifies under no TSA of the root
    with pytest.raises(Rejected) as caught:
        open_bundle(data, ids.with_root(json.dumps(staging).encode()), CAP)
    assert caught.value.reason is Reason.FOREIGN_TRUST_ROOT


def _staging_root() -> dict[str, Any]:
    from importlib.resources import files

    root: dict[str, Any] = json.loads(
        files("sigstore._store")
        .joinpath("https%3A%2F%2Ftuf-repo-cdn.sigstage.dev", "trusted_root.json")
        .read_bytes()
    )
    return root


def test_a_stamp_at_its_authoritys_end_is_retired_not_foreign() -> None:
    """sigstore-python counts a TSA's stamp only before the end of its window (the end
    excluded); one made at the very end is the root's retired TSA's, not another instance's
    (red team 48a: ``foreign-trust-root``)."""
    staging = _staging_root()
    data = (DATA / "staging-rekor-v2-conformance-beacon.sigstore.json").read_bytes()
    identity = (
        "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/"
        ".github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main"
    )
    line = f"sigstore issuer=https://token.actions.githubusercontent.com identity={identity}\n"
    ids = parse_trusted_keys(line, "t").identities
    assert ids is not None
    _, (signer,) = open_bundle(data, ids.with_root(json.dumps(staging).encode()), CAP)
    assert signer.log_time is not None
    for tsa in staging["timestampAuthorities"]:
        tsa["validFor"]["end"] = format_time(signer.log_time)
    with pytest.raises(Rejected) as caught:
        open_bundle(data, ids.with_root(json.dumps(staging).encode()), CAP)
    assert caught.value.reason is Reason.RETIRED_TRUST_ROOT, caught.value
    assert "timestamp authority" in caught.value.detail


def test_a_stamp_the_roots_authority_made_over_another_signature_is_a_bad_bundle(
    stack: SigstoreStack, sidecar: bytes
) -> None:
    """A bundle whose one timestamp is genuine (a TSA of the root signed it) but over another
    bundle's signature: the bundle is at fault, not the root (red team 48a: it was
    ``foreign-trust-root``, sending the operator to their trust root)."""
    root = json.loads(stack.trusted_root_bytes())
    root["timestampAuthorities"] = _staging_root()["timestampAuthorities"]
    beacon = json.loads((DATA / "staging-rekor-v2-conformance-beacon.sigstore.json").read_bytes())
    stamps = beacon["verificationMaterial"]["timestampVerificationData"]
    bundle = json.loads(sidecar)
    bundle["verificationMaterial"]["tlogEntries"][0].pop("inclusionPromise")
    bundle["verificationMaterial"]["timestampVerificationData"] = stamps
    with pytest.raises(Rejected) as caught:
        open_bundle(json.dumps(bundle).encode(), _policy(stack, json.dumps(root).encode()), CAP)
    assert caught.value.reason is Reason.BAD_BUNDLE, caught.value
    assert "does not cover the bundle's signature" in caught.value.detail
