"""gcpkms:// key references: real google-cloud-kms (REST transport) and google-auth (a
service-account key file, whose JWTs the stand-in verifies) against a local Cloud KMS stand-in
(tests/kms_standins.py)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from conftest import FP, plan_bytes
from kms_standins import GcpKms
from plancache.cli.main import main
from plancache.keys.schemes import load_signer
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust.errors import ConfigError, PlanCacheError, StoreTimeout
from plancache.trust.keyring.keyformat import key_id, openssh_line
from realtime import SLACK_S

pytest.importorskip("google.cloud.kms_v1")

NAME = "projects/p/locations/global/keyRings/ci/cryptoKeys/plans/cryptoKeyVersions/1"
REF = f"gcpkms://{NAME}"


@pytest.fixture(scope="module")
def gcp() -> Iterator[GcpKms]:
    server = GcpKms(
        {
            NAME: Ed25519PrivateKey.generate(),
            NAME.replace("plans", "denied"): Ed25519PrivateKey.generate(),
        }
    )
    server.denied.add(NAME.replace("plans", "denied"))
    yield server
    server.stop()


@pytest.fixture
def gcp_env(gcp: GcpKms, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {
        "GOOGLE_APPLICATION_CREDENTIALS": str(gcp.service_account(tmp_path)),
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDKMS": gcp.endpoint + "/",
        "PLANCACHE_TIMEOUT": "3",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def test_cloud_kms_signs_the_data_itself(gcp: GcpKms, gcp_env: dict[str, str]) -> None:
    real = gcp.keys[NAME]
    signer = load_signer(REF, gcp_env)
    assert signer.keyid == key_id(real.public_key())
    gcp.requests.clear()
    signature = signer.sign(b"the PAE bytes")
    real.public_key().verify(signature, b"the PAE bytes")
    (request,) = [r for r in gcp.requests if r["path"] != "/token"]
    assert request["path"] == f"/v1/{NAME}:asymmetricSign" and request["authorization"].startswith(
        "Bearer "
    )
    body = json.loads(request["body"])
    # pure Ed25519
    assert base64.b64decode(body["data"]) == b"the PAE bytes" and "digest" not in body


def test_cli_signs_with_cloud_kms_and_verify_accepts_it(
    gcp: GcpKms,
    gcp_env: dict[str, str],
    plan_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    LocalPlanDir(plan_dir).write(FP, plan_bytes(), None)
    assert main(["pubkey", REF]) == 0
    line = capsys.readouterr().out.strip()
    assert line == openssh_line(gcp.keys[NAME].public_key())
    # allowed_signers syntax
    (tmp_path / "trusted").write_text(f'ci@acme namespaces="plancache" {line}\n')
    assert main(["sign", "--key", REF, str(plan_dir)]) == 0
    assert main(["verify", "--trusted-keys", str(tmp_path / "trusted"), str(plan_dir)]) == 0
    assert "ci@acme" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        (REF.replace("plans", "denied"), "403 PERMISSION_DENIED"),
        (REF.replace("cryptoKeyVersions/1", "cryptoKeyVersions/9"), "404 NOT_FOUND"),
        ("gcpkms://projects/p/locations/global/keyRings/ci/cryptoKeys/plans", "is not gcpkms://"),
    ],
)
def test_unusable_cloud_kms_keys_are_one_line_config_errors(
    gcp_env: dict[str, str], ref: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_signer(ref, gcp_env)
    assert expected in info.value.detail and "\n" not in info.value.detail, info.value.detail


def test_a_key_version_of_another_algorithm_is_refused(
    gcp: GcpKms, gcp_env: dict[str, str]
) -> None:
    server = GcpKms({NAME: Ed25519PrivateKey.generate()}, algorithm="EC_SIGN_P256_SHA256")
    server.account_keys = gcp.account_keys  # the same service account
    try:
        with pytest.raises(ConfigError, match="EC_SIGN_P256_SHA256, not EC_SIGN_ED25519"):
            load_signer(
                REF, {**gcp_env, "CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDKMS": server.endpoint}
            )
    finally:
        server.stop()


def test_a_silent_cloud_kms_ends_at_the_budget(gcp: GcpKms, gcp_env: dict[str, str]) -> None:
    # A 2 s budget: loading the client and the public key is not what this test measures, and
    # 0.5 s for it proved too tight on a loaded CI machine (the AWS twin of this test).
    signer = load_signer(REF, {**gcp_env, "PLANCACHE_TIMEOUT": "2"})
    gcp.hang = True
    try:
        started = time.monotonic()
        with pytest.raises(PlanCacheError) as info:
            signer.sign(b"x")
        assert isinstance(info.value, StoreTimeout) and time.monotonic() - started < 2.0 + SLACK_S
    finally:
        gcp.hang = False
