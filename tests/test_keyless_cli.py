"""Keyless signing for operators (issue 37 items 1, 5): ``sign --key sigstore --identity-token``,
``verify``/``ls --json`` naming the identity, issuer and log index, ``--trusted-root``, and
``doctor``'s trust-root check, through the local Sigstore stack (tests/sigstore_stack.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_support import run
from conftest import FP, GIB, plan_bytes
from plancache.storage.local.localdir import LocalPlanDir
from sigstore_stack import SigstoreStack

IDENTITY = "https://gitlab.com/acme/serving//.gitlab-ci.yml@refs/heads/main"
FP2 = "fedcba9876543210"


@pytest.fixture(scope="module")
def stack() -> Iterator[SigstoreStack]:
    with SigstoreStack() as s:
        yield s


@pytest.fixture
def files(stack: SigstoreStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    paths = {
        "config": tmp_path / "trust_config.json",
        "root": tmp_path / "trusted_root.json",
        "token": tmp_path / "token",
        "trusted": tmp_path / "trusted",
    }
    paths["config"].write_bytes(stack.trust_config_bytes())
    paths["root"].write_bytes(stack.trusted_root_bytes())
    paths["token"].write_text(stack.token(IDENTITY))
    paths["trusted"].write_text(
        f"sigstore issuer={stack.issuer} identity-regexp=https://gitlab\\.com/acme/serving//"
        r"\.gitlab-ci\.yml@refs/heads/main" + "\n"
    )
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUST_CONFIG", str(paths["config"]))
    for name in ("SIGSTORE_ID_TOKEN", "PLANCACHE_SIGSTORE_TRUSTED_ROOT"):
        monkeypatch.delenv(name, raising=False)
    # the CLI sets these from its flags for the rest of the process: restored after each test
    monkeypatch.setenv("PLANCACHE_SIGSTORE_IDENTITY_TOKEN_FILE", "")
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT", "")
    return paths


@pytest.fixture
def plans(plan_dir: Path) -> Path:
    local = LocalPlanDir(plan_dir)
    local.write(FP, plan_bytes(), None)
    local.write(FP2, plan_bytes(fp=FP2, kv=GIB, baseline=2 * GIB), None)
    return plan_dir


def test_sign_keylessly_then_verify_and_ls_name_the_identity(
    capsys: pytest.CaptureFixture[str], stack: SigstoreStack, files: dict[str, Path], plans: Path
) -> None:
    code, out, err = run(
        capsys, "sign", "--key", "sigstore", "--identity-token", str(files["token"]), str(plans)
    )
    assert code == 0 and "2 signed" in err, err
    assert files["token"].read_text() not in out + err  # the token is never printed
    trust = ("--trusted-keys", str(files["trusted"]), "--trusted-root", str(files["root"]))
    code, out, err = run(capsys, "verify", *trust, "--json", str(plans))
    report = json.loads(out)
    assert code == 0 and report["ok"], out + err
    for plan in report["plans"]:
        (who,) = plan["signed_by"]
        assert (who["identity"], who["issuer"]) == (IDENTITY, stack.issuer)
        assert isinstance(who["log_index"], int) and who["log_index"] >= 5
        assert plan["keyless"][0]["log_time"]
    code, out, err = run(capsys, "ls", *trust, "--json", str(plans))
    assert code == 0 and {p["signed_by"][0]["identity"] for p in json.loads(out)["plans"]} == {
        IDENTITY
    }
    code, out, err = run(capsys, "ls", str(plans))  # no keys: the claim, unverified
    assert code == 0 and "unverified" in out


def test_a_wrong_identity_or_a_foreign_root_fails_verify_with_its_reason(
    capsys: pytest.CaptureFixture[str], stack: SigstoreStack, files: dict[str, Path], plans: Path
) -> None:
    code, _, err = run(
        capsys, "sign", "--key", "sigstore", "--identity-token", str(files["token"]), str(plans)
    )
    assert code == 0, err
    other = files["trusted"].parent / "other"
    other.write_text(f"sigstore issuer={stack.issuer} identity={IDENTITY}-fork\n")
    trust = ("--trusted-root", str(files["root"]), "--json", str(plans))
    code, out, _ = run(capsys, "verify", "--trusted-keys", str(other), *trust)
    assert code == 1 and {p["reason"] for p in json.loads(out)["plans"]} == {"wrong-identity"}
    with SigstoreStack() as foreign:
        files["root"].write_bytes(foreign.trusted_root_bytes())
    code, out, _ = run(capsys, "verify", "--trusted-keys", str(files["trusted"]), *trust)
    assert code == 1 and {p["reason"] for p in json.loads(out)["plans"]} == {"foreign-trust-root"}


def test_doctor_checks_the_trust_root(
    capsys: pytest.CaptureFixture[str],
    files: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    monkeypatch.setenv("PLANCACHE_TRUSTED_KEYS", str(files["trusted"]))
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT", str(files["root"]))
    _, out, _ = run(capsys, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["trusted-keys"]["status"] == "ok"
    assert checks["sigstore-trust-root"]["status"] == "ok", checks["sigstore-trust-root"]
    files["root"].write_text("{}")
    _, out, _ = run(capsys, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["trusted-keys"]["status"] == "fail"  # the keyring itself cannot load
    monkeypatch.delenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT")
    _, out, _ = run(capsys, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["sigstore-trust-root"]["status"] == "ok"  # the shipped public-good root
    assert "public-good" in checks["sigstore-trust-root"]["detail"]
