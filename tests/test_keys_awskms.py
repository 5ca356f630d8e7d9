"""awskms:// key references: real boto3 against a local stand-in speaking KMS's JSON protocol
(tests/kms_standins.py), backed by real Ed25519 keys."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import FP, plan_bytes
from kms_standins import AwsKms, aws_key, p256_key
from plancache.cli.main import main
from plancache.keys.schemes import load_signer
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust import envelope as dsse
from plancache.trust.errors import ConfigError, PlanCacheError, StoreTimeout
from plancache.trust.keyring.keyformat import key_id, openssh_line
from realtime import SLACK_S
from store_servers import AWS_ENV, BlackHole, closed_port, self_signed

pytest.importorskip("boto3")


@pytest.fixture(scope="module")
def kms() -> Iterator[AwsKms]:
    server = AwsKms(
        [
            aws_key("1234abcd-12ab-34cd-56ef-1234567890ab", aliases=("alias/plancache-ci",)),
            aws_key("denied-key", denied=True),
            p256_key("p256-key"),
        ]
    )
    yield server
    server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kms: AwsKms) -> dict[str, str]:
    env = {
        **AWS_ENV,
        "AWS_ENDPOINT_URL_KMS": kms.endpoint,
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "PLANCACHE_TIMEOUT": "3",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return env


def one_line_error(func, *args) -> PlanCacheError:
    with pytest.raises(PlanCacheError) as info:
        func(*args)
    assert "\n" not in info.value.detail
    return info.value


@pytest.mark.parametrize(
    ("ref", "region"),
    [
        ("awskms:///alias/plancache-ci", "eu-west-2"),
        ("awskms:///1234abcd-12ab-34cd-56ef-1234567890ab", "eu-west-2"),
        # the ARN's
        (
            "awskms:///arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            "us-east-1",
        ),
    ],
)
def test_kms_signs_ed25519_raw_and_the_key_id_is_its_public_keys(
    kms: AwsKms, aws_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, ref: str, region: str
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-2")
    real = kms.keys[0].private
    signer = load_signer(ref, aws_env)
    assert signer.keyid == key_id(real.public_key())  # the key id is the public key's fingerprint
    kms.requests.clear()
    signature = signer.sign(b"message to sign")
    real.public_key().verify(signature, b"message to sign")  # raises if not the KMS key's signature
    (request,) = kms.requests
    assert request["target"] == "TrentService.Sign"
    assert (
        request["body"]["MessageType"] == "RAW"
        and request["body"]["SigningAlgorithm"] == "ED25519_SHA_512"
    )
    # the message, not a digest
    assert base64.b64decode(request["body"]["Message"]) == b"message to sign"
    assert request["authorization"].startswith("AWS4-HMAC-SHA256 Credential=plancache-test/")
    assert f"/{region}/kms/aws4_request" in request["authorization"]


def test_cli_signs_with_kms_and_verify_accepts_it(
    kms: AwsKms,
    aws_env: dict[str, str],
    plan_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    LocalPlanDir(plan_dir).write(FP, plan_bytes(), None)
    assert main(["pubkey", "awskms:///alias/plancache-ci", "--name", "kms-ci"]) == 0
    line = capsys.readouterr().out.strip()
    assert line == openssh_line(kms.keys[0].private.public_key(), "kms-ci")
    (tmp_path / "trusted").write_text(line + "\n")
    kms.requests.clear()
    assert main(["sign", "--key", "awskms:///alias/plancache-ci", str(plan_dir)]) == 0
    signed = [r for r in kms.requests if r["target"] == "TrentService.Sign"]
    sidecar = LocalPlanDir(plan_dir).read(FP)[1]
    envelope = dsse.decode(sidecar)
    assert base64.b64decode(signed[0]["body"]["Message"]) == dsse.pae(
        envelope.payload_type, envelope.payload
    )
    capsys.readouterr()
    assert main(["verify", "--trusted-keys", str(tmp_path / "trusted"), str(plan_dir)]) == 0
    assert "valid" in capsys.readouterr().out


def test_endpoint_in_the_uri_is_https(
    aws_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = self_signed(tmp_path, "kms")
    server = AwsKms([aws_key("tls-key")], tls=(cert, key))
    try:
        monkeypatch.delenv("AWS_ENDPOINT_URL_KMS")
        monkeypatch.setenv("AWS_CA_BUNDLE", str(cert))
        port = server.endpoint.rsplit(":", 1)[1]
        signer = load_signer(f"awskms://127.0.0.1:{port}/tls-key", aws_env)
        assert signer.keyid == key_id(server.keys[0].private.public_key())
        server.keys[0].private.public_key().verify(signer.sign(b"x"), b"x")
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("awskms:///denied-key", "AccessDeniedException"),
        ("awskms:///alias/nope", "NotFoundException"),
        ("awskms:///p256-key", "ECC_NIST_P256"),
        ("awskms://", "is not awskms:///KEY-ID"),
        ("awskms://host with space/k", "is not awskms:///KEY-ID"),
    ],
)
def test_unusable_kms_keys_are_one_line_config_errors(
    aws_env: dict[str, str], ref: str, expected: str
) -> None:
    error = one_line_error(load_signer, ref, aws_env)
    assert isinstance(error, ConfigError) and expected in error.detail, error.detail


def test_unreachable_kms_fails_fast_and_a_silent_one_within_the_budget(
    aws_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_KMS", f"http://127.0.0.1:{closed_port()}")
    # imports boto3, loads KMS's model: slow on a busy machine, not the call timed next
    one_line_error(load_signer, "awskms:///alias/plancache-ci", aws_env)
    started = time.monotonic()
    error = one_line_error(load_signer, "awskms:///alias/plancache-ci", aws_env)
    assert isinstance(error, ConfigError) and time.monotonic() - started < SLACK_S, error.detail
    hole = BlackHole()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_KMS", hole.endpoint)
        env = {**aws_env, "PLANCACHE_TIMEOUT": "0.5"}
        started = time.monotonic()
        error = one_line_error(load_signer, "awskms:///alias/plancache-ci", env)
        assert isinstance(error, StoreTimeout) and time.monotonic() - started < 0.5 + SLACK_S, (
            error.detail
        )
    finally:
        hole.stop()


def test_a_kms_that_stops_answering_mid_run_times_out_the_signature(
    kms: AwsKms, aws_env: dict[str, str]
) -> None:
    # A 2 s budget: the load (a botocore client, KMS's service model, GetPublicKey) took over
    # 0.5 s once on a loaded CI machine, and the load is not what this test is about.
    signer = load_signer("awskms:///alias/plancache-ci", {**aws_env, "PLANCACHE_TIMEOUT": "2"})
    kms.hang = True
    try:
        started = time.monotonic()
        with pytest.raises(StoreTimeout):
            signer.sign(b"x")
        assert time.monotonic() - started < 2.0 + SLACK_S  # tests/realtime.py
    finally:
        kms.hang = False
