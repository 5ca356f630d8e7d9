"""pkcs11: key references against a real SoftHSM2 token whose Ed25519 key was made inside the
token by pkcs11-tool (OpenSC): the private key never leaves it. Signatures are checked by
cryptography against the public key pkcs11-tool reads from the token, not plancache's reading.

Skips (with the reason) only where SoftHSM2/OpenSC or PyKCS11 cannot be had: the test
bootstrap (scripts/bootstrap-test-env.sh) installs them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from conftest import FP, plan_bytes
from plancache.keys.schemes import load_signer
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust.errors import ConfigError, PlanCacheError
from plancache.trust.keyring.keyformat import key_id, openssh_line
from realtime import SLACK_S

MODULE = "/usr/lib/softhsm/libsofthsm2.so"
_missing = [tool for tool in ("softhsm2-util", "pkcs11-tool") if shutil.which(tool) is None]
if _missing or not os.path.exists(MODULE):
    pytest.skip(
        f"SoftHSM2/OpenSC not installed ({', '.join(_missing) or MODULE}): "
        "scripts/bootstrap-test-env.sh installs softhsm2 and opensc with apt-get",
        allow_module_level=True,
    )
pytest.importorskip("PyKCS11", reason="PyKCS11 missing: pip install 'plancache[pkcs11]'")

PIN = "735913"


@pytest.fixture(scope="module")
def token(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dict[str, str], Ed25519PublicKey]]:
    """A private SoftHSM2 token store with token 'ci' holding Ed25519 key 'signer' (id 01),
    generated inside the token; yields the environment and the public key pkcs11-tool reads."""
    root = tmp_path_factory.mktemp("softhsm")
    (root / "tokens").mkdir()
    conf = root / "softhsm2.conf"
    conf.write_text(
        f"directories.tokendir = {root}/tokens\nobjectstore.backend = file\nlog.level = ERROR\n"
    )
    env = {**os.environ, "SOFTHSM2_CONF": str(conf)}

    def tool(*args: str) -> None:
        subprocess.run(args, env=env, check=True, capture_output=True, timeout=60)

    tool(
        "softhsm2-util", "--init-token", "--free", "--label", "ci", "--so-pin", "0000", "--pin", PIN
    )
    tool(
        "pkcs11-tool",
        "--module",
        MODULE,
        "--token-label",
        "ci",
        "--login",
        "--pin",
        PIN,
        "--keypairgen",
        "--key-type",
        "EC:edwards25519",
        "--label",
        "signer",
        "--id",
        "01",
    )
    tool(
        "pkcs11-tool",
        "--module",
        MODULE,
        "--token-label",
        "ci",
        "--read-object",
        "--type",
        "pubkey",
        "--label",
        "signer",
        "-o",
        str(root / "pub.pem"),
    )
    public = serialization.load_pem_public_key((root / "pub.pem").read_bytes())
    assert isinstance(public, Ed25519PublicKey)
    old = os.environ.get("SOFTHSM2_CONF")
    # SoftHSM reads it when PyKCS11 loads the module, in this process
    os.environ["SOFTHSM2_CONF"] = str(conf)
    yield env, public
    if old is None:
        os.environ.pop("SOFTHSM2_CONF", None)
    else:
        os.environ["SOFTHSM2_CONF"] = old


def uri(path: str = "token=ci;object=signer", query: str = f"pin-value={PIN}") -> str:
    return f"pkcs11:{path}?module-path={MODULE}" + (f"&{query}" if query else "")


@pytest.mark.parametrize(
    "path",
    [
        "token=ci;object=signer",
        "token=ci;id=%01",
        "object=signer;type=private",
        "token=ci;object=signer;id=%01",
    ],
)
def test_the_token_signs_and_cryptography_verifies_with_the_tokens_public_key(
    token: tuple[dict[str, str], Ed25519PublicKey], path: str
) -> None:
    _, public = token
    signer = load_signer(uri(path), {})
    # the key id is the OpenSSH fingerprint of the token's key
    assert signer.keyid == key_id(public)
    signature = signer.sign(b"DSSEv1 message")
    public.verify(signature, b"DSSEv1 message")  # cryptography, against pkcs11-tool's public key


def test_plancache_sign_with_the_token_and_verify_against_its_public_key(
    token: tuple[dict[str, str], Ed25519PublicKey], plan_dir: Path, tmp_path: Path
) -> None:
    env, public = token
    LocalPlanDir(plan_dir).write(FP, plan_bytes(), None)
    # from pkcs11-tool's reading
    (tmp_path / "token.pub").write_text(openssh_line(public, "hsm-ci") + "\n")
    cli = [sys.executable, "-m", "plancache.cli.main"]
    run_env = {**env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    signed = subprocess.run(
        [*cli, "sign", "--key", uri(), str(plan_dir)],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert signed.returncode == 0, signed.stderr
    # the PIN is never shown
    assert "pin-value" not in signed.stderr and PIN not in signed.stdout + signed.stderr
    verified = subprocess.run(
        [*cli, "verify", "--trusted-keys", str(tmp_path / "token.pub"), str(plan_dir)],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verified.returncode == 0 and "hsm-ci" in verified.stdout, (
        verified.stdout + verified.stderr
    )
    pub = subprocess.run(
        [*cli, "pubkey", uri(), "--name", "hsm-ci"],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert pub.stdout.strip() == openssh_line(public, "hsm-ci")


def test_pin_from_a_file_that_only_the_owner_reads(
    token: tuple[dict[str, str], Ed25519PublicKey], tmp_path: Path
) -> None:
    pin_file = tmp_path / "pin"
    pin_file.write_text(PIN + "\n")
    os.chmod(pin_file, 0o600)
    assert load_signer(uri(query=f"pin-source=file:{pin_file}"), {}).keyid == key_id(token[1])
    os.chmod(pin_file, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_signer(uri(query=f"pin-source=file:{pin_file}"), {})


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        (uri(query="pin-value=9999"), "CKR_PIN_INCORRECT"),
        (uri(query=""), "0 private key objects match (log in"),
        (uri("token=nope;object=signer"), "no token matches; tokens present: 'ci'"),
        (uri("token=ci;object=other"), "0 private key objects match"),
        (uri("token=ci;object=signer;pin=1"), "unknown or repeated path attribute 'pin'"),
        (
            f"pkcs11:token=ci;object=signer?module-path=/nonexistent/lib.so&pin-value={PIN}",
            "cannot load the PKCS#11 module",
        ),
        (
            f"pkcs11:token=ci;object=signer?module-path=libm.so.6&pin-value={PIN}",
            "is not a PKCS#11 module",
        ),
        ("pkcs11:token=ci;object=signer", "add ?module-path="),
    ],
)
def test_a_token_that_cannot_be_used_is_one_line(
    token: tuple[dict[str, str], Ed25519PublicKey], ref: str, expected: str
) -> None:
    started = time.monotonic()
    with pytest.raises(PlanCacheError) as info:
        load_signer(ref, {})
    detail = info.value.detail
    assert (
        expected in detail and "\n" not in detail and "9999" not in detail and PIN not in detail
    ), detail
    assert time.monotonic() - started < SLACK_S  # no wait on a module that cannot be used


def test_cli_exit_2_and_one_line_for_a_wrong_pin(
    token: tuple[dict[str, str], Ed25519PublicKey], plan_dir: Path
) -> None:
    env, _ = token
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "plancache.cli.main",
            "sign",
            "--key",
            uri(query="pin-value=0000"),
            str(plan_dir),
        ],
        env={**env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        result.returncode == 2
        and result.stderr.count("\n") == 1
        and "CKR_PIN_INCORRECT" in result.stderr
    ), result.stderr


def _cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plancache.cli.main", *argv],
        env={**env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_pin_source_that_is_a_fifo_is_refused_without_blocking(
    token: tuple[dict[str, str], Ed25519PublicKey], tmp_path: Path
) -> None:
    """``pin-source=file:FIFO`` used to block in ``open`` before any budget started: now the
    file is opened non-blocking and refused as not a regular file, one line, exit 2."""
    env, _ = token
    fifo = tmp_path / "pin"
    os.mkfifo(fifo, 0o600)
    result = _cli({**env, "PLANCACHE_TIMEOUT": "2"}, "pubkey", uri(query=f"pin-source=file:{fifo}"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "not a regular file" in result.stderr and result.stdout == ""


def test_a_module_that_fails_to_load_keeps_stdout_to_the_json_report(
    token: tuple[dict[str, str], Ed25519PublicKey], plan_dir: Path, tmp_path: Path
) -> None:
    """PyKCS11's loader prints dlopen's complaint with C printf on stdout; with ``--json``
    stdout must hold the report alone. The complaint goes into the one error line instead."""
    env, _ = token
    LocalPlanDir(plan_dir).write(FP, plan_bytes(), None)
    bad = tmp_path / "not-a-module.so"
    bad.write_bytes(b"garbage")
    key = f"pkcs11:token=ci;object=signer?module-path={bad}&pin-value={PIN}"
    result = _cli(env, "sign", "--json", "--key", key, str(plan_dir))
    import json

    doc = json.loads(result.stdout)  # exactly one document, nothing before it
    assert result.returncode == 2 and doc["ok"] is False, result.stdout
    assert result.stdout.startswith("{") and "too short" in doc["error"]["detail"]
    assert PIN not in result.stdout + result.stderr
