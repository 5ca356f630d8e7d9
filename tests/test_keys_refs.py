"""Key references that are not remote: env://, ssh-keygen's keys (encrypted ones need bcrypt),
keygen --format openssh, plancache pubkey, errors that say what a file holds; and what every
reference shares: the 4096-byte signing cap and the call budget (CLI exit 2, plugin WARNING)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from conftest import FP, NOW, make_signer, plan_bytes
from plancache.cli.main import main
from plancache.keys.keyfile import generate_keypair, load_keyring
from plancache.keys.remote_signer import RemoteSigner
from plancache.keys.schemes import load_signer
from plancache.trust import envelope as dsse
from plancache.trust.errors import ConfigError, StoreTimeout
from plancache.trust.keyring.keyformat import key_id, openssh_line
from plancache.trust.keyring.keys import signer_keyring
from plancache.trust.plans.plan import plan_name
from plancache.trust.signing import MAX_SIGNED_BYTES, sign_plan
from plancache.trust.verify import verify_plan
from realtime import SLACK_S

SSH_KEYGEN = shutil.which("ssh-keygen")
needs_ssh_keygen = pytest.mark.skipif(
    SSH_KEYGEN is None, reason="ssh-keygen (openssh-client) is not installed"
)


def error_of(func, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        func(*args, **kwargs)
    assert "\n" not in info.value.detail
    return info.value.detail


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_env_reference_signs_with_the_key_text_in_the_variable() -> None:
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    signer = load_signer("env://CI_KEY", {"CI_KEY": pem.decode()})
    assert signer.keyid == key_id(private.public_key())
    private.public_key().verify(signer.sign(b"m"), b"m")
    assert "CI_KEY is not set" in error_of(load_signer, "env://CI_KEY", {})
    assert "does not name an environment variable" in error_of(load_signer, "env://1-bad", {})
    public_line = openssh_line(private.public_key())
    assert "holds an OpenSSH public key line" in error_of(
        load_signer, "env://CI_KEY", {"CI_KEY": public_line}
    )


@needs_ssh_keygen
def test_ssh_keygen_keys_encrypted_or_not(tmp_path: Path) -> None:
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "pw", "-C", "ci", "-f", str(tmp_path / "enc")],
        check=True,
    )
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "ci", "-f", str(tmp_path / "plain")],
        check=True,
    )
    enc_id = load_keyring(tmp_path / "enc.pub").keys
    signer = load_signer(str(tmp_path / "enc"), {"PLANCACHE_KEY_PASSPHRASE": "pw"})
    assert set(enc_id) == {signer.keyid}  # the .pub ssh-keygen wrote trusts what the key signs
    assert "PLANCACHE_KEY_PASSPHRASE" in error_of(load_signer, str(tmp_path / "enc"), {})
    assert "wrong passphrase" in error_of(
        load_signer, str(tmp_path / "enc"), {"PLANCACHE_KEY_PASSPHRASE": "nope"}
    )
    # a passphrase set for an unencrypted key is ignored, and a prompt is never asked for it
    asked: list[str] = []
    plain = load_signer(
        str(tmp_path / "plain"), {"PLANCACHE_KEY_PASSPHRASE": "pw"}, prompt=asked.append
    )
    assert set(load_keyring(tmp_path / "plain.pub").keys) == {plain.keyid} and asked == []
    # on a terminal the prompt answers for an encrypted key
    assert load_signer(str(tmp_path / "enc"), {}, prompt=lambda _: "pw").keyid == signer.keyid


@needs_ssh_keygen
@pytest.mark.parametrize("passphrase", ["", "s3cret"])
def test_keygen_format_openssh_is_read_by_ssh_keygen(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    passphrase: str,
) -> None:
    monkeypatch.setenv("PLANCACHE_KEY_PASSPHRASE", passphrase)
    code, _, _ = run(
        capsys, "keygen", "--format", "openssh", "--comment", "ci", str(tmp_path / "ci")
    )
    assert code == 0 and (tmp_path / "ci").read_bytes().startswith(
        b"-----BEGIN OPENSSH PRIVATE KEY-----"
    )
    derived = subprocess.run(
        [SSH_KEYGEN, "-y", "-P", passphrase, "-f", str(tmp_path / "ci")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert derived[:2] == (tmp_path / "ci.pub").read_text().split()[:2]


def test_pubkey_prints_the_line_for_a_trusted_keys_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    signer = generate_keypair(tmp_path / "ci", False, "", env={})
    code, out, err = run(capsys, "pubkey", str(tmp_path / "ci"), "--name", "ci 2026")
    assert (
        code == 0 and out == openssh_line(signer.public, "ci 2026") + "\n" and signer.keyid in err
    )
    (tmp_path / "trusted").write_text(out)
    assert load_keyring(tmp_path / "trusted").keys[signer.keyid].name == "ci 2026"
    monkeypatch.setenv("PLANCACHE_KEY_TEXT", (tmp_path / "ci").read_text())
    assert (
        run(capsys, "pubkey", "env://PLANCACHE_KEY_TEXT")[1] == openssh_line(signer.public) + "\n"
    )
    code, _, err = run(capsys, "pubkey", str(tmp_path / "ci"), "--name", "x\nssh-ed25519 AAAA evil")
    assert code == 2 and err.count("\n") == 1  # a name cannot add a line to a trusted-keys file


def test_errors_say_what_the_file_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    generate_keypair(tmp_path / "ci", False, "", env={})
    code, _, err = run(capsys, "sign", "--key", str(tmp_path / "ci.pub"), str(tmp_path))
    assert code == 2 and "ci.pub holds an OpenSSH public key line" in err and "chmod" not in err, (
        err
    )
    code, _, err = run(capsys, "verify", "--trusted-keys", str(tmp_path / "ci"), str(tmp_path))
    assert (
        code == 2 and f"trusted-keys file {tmp_path / 'ci'} holds a PEM private key (PKCS#8)" in err
    ), err
    (tmp_path / "cert").write_text("-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n")
    os.chmod(tmp_path / "cert", 0o600)
    assert "holds an X.509 certificate, not a private key" in error_of(
        load_signer, str(tmp_path / "cert"), {}
    )
    (tmp_path / "junk").write_bytes(b"\x00\x01binary")
    os.chmod(tmp_path / "junk", 0o600)
    assert "binary data" in error_of(load_signer, str(tmp_path / "junk"), {})
    assert "binary data" in error_of(load_keyring, tmp_path / "junk")
    assert "env://VAR, pkcs11:" in error_of(load_signer, "vault://x", {})


def _pae_len(comment: str) -> tuple[int, int]:
    """(length of the signed message, length of the statement in it)."""
    sidecar = sign_plan(plan_name(FP), plan_bytes(), make_signer(), NOW, comment=comment)
    envelope = dsse.decode(sidecar)
    return len(dsse.pae(envelope.payload_type, envelope.payload)), len(envelope.payload)


def test_the_signed_message_is_capped_at_4096_bytes() -> None:
    base, statement = _pae_len("")
    # PAE spells the statement's length: at the cap it takes 4 digits
    assert len(str(statement)) == 3
    fits = "c" * (MAX_SIGNED_BYTES - base - 1)
    assert _pae_len(fits)[0] == MAX_SIGNED_BYTES  # exactly at the cap: signed
    with pytest.raises(ConfigError, match="capped at 4096"):
        sign_plan(plan_name(FP), plan_bytes(), make_signer(), NOW, comment=fits + "c")


def _remote(sign, budget: float = 0.3) -> RemoteSigner:
    private = Ed25519PrivateKey.generate()
    return RemoteSigner("test-kms", private.public_key(), lambda data: sign(private, data), budget)


def test_a_remote_signer_is_bounded_and_checked() -> None:
    good = _remote(lambda key, data: key.sign(data))
    sidecar = sign_plan(plan_name(FP), plan_bytes(), good, NOW, expires_at=NOW + timedelta(days=1))
    verify_plan(plan_name(FP), plan_bytes(), sidecar, signer_keyring(good), NOW)
    assert "does not verify" in error_of(
        _remote(lambda key, data: Ed25519PrivateKey.generate().sign(data)).sign, b"m"
    )
    assert "64-byte" in error_of(_remote(lambda key, data: b"short").sign, b"m")
    # a PlanCacheError: the plugin's save logs it and keeps the plan unsigned (unbounded, the
    # call would end after 5 s with no signature: a different error)
    with pytest.raises(StoreTimeout):
        sign_plan(plan_name(FP), plan_bytes(), _remote(lambda key, data: time.sleep(5)), NOW)


def test_the_plugin_boots_with_an_unreachable_key_unsigned_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from plancache.vllm_plugin.worker_boot import load_boot
    from store_servers import AWS_ENV, BlackHole

    hole = BlackHole()
    env = {
        "PLANCACHE_SIGNING_KEY": "awskms:///alias/ci",
        "AWS_ENDPOINT_URL_KMS": hole.endpoint,
        "PLANCACHE_TIMEOUT": "3",
        **AWS_ENV,
    }
    old = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # boto3 reads its settings from the process environment
    try:
        with caplog.at_level(logging.WARNING, logger="vllm.plancache"):
            boot = load_boot(env)
            assert caplog.text == "" and hole.held == []  # the boot does not load the key
            started = time.monotonic()
            assert boot.signer is None  # loaded at first signing: the black hole's budget
            assert time.monotonic() - started < 3.0 + SLACK_S  # tests/realtime.py
            assert boot.signer is None  # once: the warning below is logged once
        assert caplog.text.count("PLANCACHE_SIGNING_KEY") == 1 and "saved unsigned" in caplog.text
    finally:
        hole.stop()
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def test_an_existing_statement_over_the_cap_is_not_co_signed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from plancache.trust import signing
    from plancache.trust.errors import Reason, Rejected

    # as an older plancache would have signed it
    monkeypatch.setattr(signing, "MAX_SIGNED_BYTES", 1 << 20)
    sidecar = sign_plan(plan_name(FP), plan_bytes(), make_signer(), NOW, comment="c" * 5000)
    monkeypatch.undo()
    with pytest.raises(Rejected) as info:
        signing.add_signature(plan_name(FP), plan_bytes(), sidecar, make_signer())
    assert info.value.reason is Reason.TOO_LARGE


def test_the_compile_guard_loads_its_signing_key_only_to_sign(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A warm boot checks caches but signs none: an unreachable KMS key must cost it nothing."""
    from plancache.vllm_plugin import plugin_state
    from plancache.vllm_plugin.compile_cache import guard_settings
    from store_servers import AWS_ENV, BlackHole

    hole = BlackHole()
    generate_keypair(tmp_path / "ci", force=False, comment="ci")
    for name, value in {
        "PLANCACHE_SIGNING_KEY": "awskms:///alias/ci",
        "AWS_ENDPOINT_URL_KMS": hole.endpoint,
        "PLANCACHE_TIMEOUT": "1",
        "PLANCACHE_TRUSTED_KEYS": f"{tmp_path / 'ci'}.pub",
        **AWS_ENV,
    }.items():
        monkeypatch.setenv(name, value)
    plugin_state.start_boot()  # a boot of its own: the settings are read once a boot
    try:
        with caplog.at_level(logging.WARNING, logger="vllm.plancache"):
            config = guard_settings.settings()
            assert config is not None and config.keyring is not None
            assert hole.held == [] and caplog.text == ""
            # tried once, at signing
            assert guard_settings.signer() is None and guard_settings.signer() is None
        assert caplog.text.count("signing key unusable") == 1
    finally:
        plugin_state.start_boot()
        hole.stop()


@pytest.mark.parametrize(
    ("module", "argv", "extra"),
    [
        ("PyKCS11", ["pubkey", "pkcs11:token=ci;object=k?module-path=/x.so&pin-value=1"], "pkcs11"),
        ("boto3", ["pubkey", "awskms:///alias/ci"], "awskms"),
        (
            "google",
            [
                "pubkey",
                "gcpkms://projects/p/locations/l/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1",
            ],
            "gcpkms",
        ),
        ("s3fs", ["ls", "s3://bucket/plans"], "s3"),
        ("botocore", ["pull", "--fingerprint", FP, "s3://bucket/plans", "DEST"], "s3"),
        ("gcsfs", ["ls", "gs://bucket/plans"], "gcs"),
        ("adlfs", ["ls", "az://container/plans"], "azure"),
    ],
    ids=["pkcs11", "awskms", "gcpkms", "s3-s3fs", "s3-botocore", "gcs", "azure"],
)
def test_a_missing_optional_dependency_names_the_extra(
    module: str, argv: list[str], extra: str, tmp_path: Path
) -> None:
    """Without the package an extra brings, the error names ``plancache[extra]`` (one line,
    exit 2), never ``internal error: ModuleNotFoundError``. The package is hidden by a module
    of that name, first on the path, that fails to import as a missing one does."""
    import sys

    shadow = tmp_path / "shadow" / module
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        f"raise ModuleNotFoundError('No module named ' + {module!r}, name={module!r})\n"
    )
    generate_keypair(tmp_path / "k", force=False, comment="k")
    argv = [str(tmp_path / "dest") if a == "DEST" else a for a in argv]
    if argv[0] == "pull":
        argv[1:1] = ["--trusted-keys", str(tmp_path / "k.pub")]
    path = os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "plancache.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        f"plancache[{extra}]" in result.stdout + result.stderr
        and "internal error" not in result.stderr
    ), result.stderr
