"""``prune --revoked`` and revoked Sigstore identities (issue 37's edges, item 1).

A trusted-keys file that only revokes (``@revoked sigstore issuer=… identity=…``, ``@revoked
SHA256:…``, or both) is enough for ``prune --revoked``: the trust root is pinned for it, and a
plan whose bundle verifies under that root and was signed by a revoked identity is ``revoked``,
while a plan signed keylessly by a live identity, or a forged bundle that only claims the
revoked identity, is kept. Through the CLI, against a directory store and moto's S3 server, with
plans signed by sigstore-python's real client through the local Fulcio and Rekor
(tests/sigstore_stack.py). ``verify`` still refuses a file that trusts nothing.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from cli_support import run
from conftest import NOW, make_signer, plan_bytes
from plancache.keys.keyfile import load_keyring
from plancache.keys.schemes import load_signer
from plancache.storage.store import open_store
from plancache.trust.errors import ConfigError, Reason, Rejected
from plancache.trust.plans.plan import plan_name
from plancache.trust.signing import sign_plan
from plancache.trust.verify import verify_plan
from sigstore_stack import SigstoreStack
from store_servers import (
    MotoServer,
    moto_server,  # noqa: F401 - a fixture, named as a parameter
)

REVOKED = "https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/old"
LIVE = "https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main"
BY_REVOKED, BY_LIVE, FORGED, BY_OLD_KEY = (
    "1111111111111111",
    "2222222222222222",
    "3333333333333333",
    "4444444444444444",
)
EXPIRY = timedelta(days=365 * 5)


@dataclass
class Signed:
    stack: SigstoreStack
    root: Path
    plans: dict[str, tuple[bytes, bytes]]
    old_key: str
    """The revoked Ed25519 key's id."""

    def revocations(self, *, identities: bool = True, keys: bool = True) -> str:
        lines = [f"@revoked sigstore issuer={self.stack.issuer} identity={REVOKED}"] * identities
        return "\n".join([*lines, *[f"@revoked {self.old_key}"] * keys]) + "\n"


def _forged(sidecar: bytes) -> bytes:
    """The revoked identity's genuine bundle with another payload: its certificate and log entry
    are real (both are public in the log), its signature no longer covers the payload."""
    bundle = json.loads(sidecar)
    payload = base64.b64decode(bundle["dsseEnvelope"]["payload"])
    payload = payload.replace(BY_REVOKED.encode(), FORGED.encode())
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(payload).decode()
    return json.dumps(bundle).encode() + b"\n"


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Signed]:
    """Four plans, signed once per module: keylessly by the revoked and by the live identity, a
    forgery claiming the revoked identity, and one by an Ed25519 key the file revokes."""
    folder = tmp_path_factory.mktemp("revoked")
    with SigstoreStack(now=NOW) as stack:
        (folder / "trust_config.json").write_bytes(stack.trust_config_bytes())
        (folder / "trusted_root.json").write_bytes(stack.trusted_root_bytes())
        env = {"PLANCACHE_SIGSTORE_TRUST_CONFIG": str(folder / "trust_config.json")}
        plans: dict[str, tuple[bytes, bytes]] = {}
        for fp, identity in ((BY_REVOKED, REVOKED), (BY_LIVE, LIVE)):
            signer = load_signer("sigstore", {**env, "SIGSTORE_ID_TOKEN": stack.token(identity)})
            data = plan_bytes(fp=fp)
            plans[fp] = data, sign_plan(plan_name(fp), data, signer, NOW, expires_at=NOW + EXPIRY)
        plans[FORGED] = plan_bytes(fp=FORGED), _forged(plans[BY_REVOKED][1])
        old = make_signer()
        data = plan_bytes(fp=BY_OLD_KEY)
        plans[BY_OLD_KEY] = data, sign_plan(plan_name(BY_OLD_KEY), data, old, NOW)
        yield Signed(stack, folder / "trusted_root.json", plans, old.keyid)


@pytest.fixture
def pinned(signed: Signed, monkeypatch: pytest.MonkeyPatch) -> Signed:
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT", str(signed.root))
    return signed


def _revocations_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "revocations"
    path.write_text(text)
    return path


@pytest.mark.parametrize("kind", ["identities", "keys", "both"])
def test_a_revocations_only_file_loads_for_prune_and_pins_the_root(
    pinned: Signed, tmp_path: Path, kind: str
) -> None:
    text = pinned.revocations(identities=kind != "keys", keys=kind != "identities")
    path = _revocations_file(tmp_path, text)
    keyring = load_keyring(path, allow_revocations_only=True)
    assert not keyring.keys
    if kind == "keys":
        assert keyring.identities is None and keyring.revoked == {pinned.old_key}
    else:
        assert keyring.identities is not None and not keyring.identities.trusted
        assert keyring.identities.trusted_root == pinned.stack.trusted_root_bytes()
    with pytest.raises(ConfigError) as caught:  # verifying needs something trusted, as before
        load_keyring(path)
    assert "no usable key" in caught.value.detail


def test_a_revoked_identity_is_judged_on_a_verified_bundle_only(
    pinned: Signed, tmp_path: Path
) -> None:
    keyring = load_keyring(
        _revocations_file(tmp_path, pinned.revocations()), allow_revocations_only=True
    )
    reasons = {}
    for fp, (data, sig) in pinned.plans.items():
        with pytest.raises(Rejected) as caught:
            verify_plan(plan_name(fp), data, sig, keyring, NOW)
        reasons[fp] = caught.value.reason
    assert reasons == {
        BY_REVOKED: Reason.REVOKED,
        BY_LIVE: Reason.UNTRUSTED_KEY,  # no identity is trusted, and this one is not revoked
        FORGED: Reason.BAD_SIGNATURE,  # claims the revoked identity: not a reason to delete
        BY_OLD_KEY: Reason.REVOKED,
    }


def test_a_revoked_identity_beside_a_trusted_one_is_revoked(pinned: Signed, tmp_path: Path) -> None:
    text = (
        pinned.revocations(keys=False) + f"sigstore issuer={pinned.stack.issuer} identity={LIVE}\n"
    )
    keyring = load_keyring(_revocations_file(tmp_path, text))
    data, sig = pinned.plans[BY_REVOKED]
    with pytest.raises(Rejected) as caught:
        verify_plan(plan_name(BY_REVOKED), data, sig, keyring, NOW)
    assert caught.value.reason is Reason.REVOKED
    data, sig = pinned.plans[BY_LIVE]
    assert verify_plan(plan_name(BY_LIVE), data, sig, keyring, NOW).identities


@pytest.fixture(params=["file", "s3"])
def store_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, dict[str, Any]]:
    if request.param == "file":
        (tmp_path / "bucket").mkdir()
        return (tmp_path / "bucket" / "plans").as_uri(), {}
    moto: MotoServer = request.getfixturevalue("moto_server")
    return f"s3://{moto.new_bucket()}/team/plans", moto.options


def _options(options: dict[str, Any]) -> list[str]:
    return [x for k, v in options.items() for x in ("--storage-option", f"{k}={json.dumps(v)}")]


@pytest.mark.parametrize("kind", ["identities", "both"])
def test_prune_revoked_deletes_what_a_revoked_identity_signed(
    capsys: pytest.CaptureFixture[str],
    signed: Signed,
    store_url: tuple[str, dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    url, options = store_url
    store = open_store(url, options, 30)
    for fp, (data, sig) in signed.plans.items():
        store.put(fp, data, sig)
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT", "")
    path = _revocations_file(tmp_path, signed.revocations(keys=kind == "both"))
    trust = ("--trusted-keys", str(path), "--trusted-root", str(signed.root), *_options(options))
    doomed = [BY_REVOKED] + [BY_OLD_KEY] * (kind == "both")

    code, out, err = run(capsys, "prune", "--revoked", "--dry-run", *trust, url)
    assert code == 0, err
    listed = [line.split()[0] for line in out.splitlines()[1:] if line.strip()]
    assert sorted(listed) == sorted(doomed) and "would delete" in out
    assert store.fingerprints() == sorted(signed.plans)  # a dry run deletes nothing

    code, out, err = run(capsys, "prune", "--revoked", "--json", *trust, url)
    report = json.loads(out)
    assert code == 0 and report["ok"], out + err
    assert sorted(d["fingerprint"] for d in report["deleted"]) == sorted(doomed)
    assert {d["why"] for d in report["deleted"]} == {"revoked"}
    assert report["kept"] == len(signed.plans) - len(doomed)
    assert store.fingerprints() == sorted(set(signed.plans) - set(doomed))


def test_verify_still_refuses_a_revocations_only_file(
    capsys: pytest.CaptureFixture[str], pinned: Signed, tmp_path: Path
) -> None:
    (tmp_path / "plans").mkdir()
    path = _revocations_file(tmp_path, pinned.revocations())
    code, _, err = run(capsys, "verify", "--trusted-keys", str(path), str(tmp_path / "plans"))
    assert code == 2 and "no usable key" in err and len(err.strip().splitlines()) == 1
