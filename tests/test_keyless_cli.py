"""Keyless signing for operators (issue 37 items 1, 5): ``sign --key sigstore --identity-token``,
``verify``/``ls --json`` naming the identity, issuer and log index, ``--trusted-root``, and
``doctor``'s trust-root check, through the local Sigstore stack (tests/sigstore_stack.py)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
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
    paths = stack.client_files(
        tmp_path,
        IDENTITY,
        f"sigstore issuer={stack.issuer} identity-regexp=https://gitlab\\.com/acme/serving//"
        r"\.gitlab-ci\.yml@refs/heads/main",
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
    assert "0 trusted key(s) and 1 sigstore identity" in checks["trusted-keys"]["detail"]
    assert checks["trusted-keys"]["data"]["identities"][0].startswith("sigstore issuer=")
    assert checks["sigstore-trust-root"]["status"] == "ok", checks["sigstore-trust-root"]
    for garbage in ("{}", None):  # a root that does not parse, then one that is not there
        if garbage is None:
            files["root"].unlink()
        else:
            files["root"].write_text(garbage)
        _, out, _ = run(capsys, "doctor", "--json")
        checks = {c["name"]: c for c in json.loads(out)["checks"]}
        assert checks["trusted-keys"]["status"] == "fail"  # the keyring itself cannot load
        # ... and the root has its own line saying so
        assert checks["sigstore-trust-root"]["status"] == "fail", checks
        assert str(files["root"]) in checks["sigstore-trust-root"]["detail"]
    monkeypatch.delenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT")
    _, out, _ = run(capsys, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["sigstore-trust-root"]["status"] == "ok"  # the shipped public-good root
    assert "public-good" in checks["sigstore-trust-root"]["detail"]


def test_inspect_takes_the_trusted_root_and_shows_a_bundles_statement(
    capsys: pytest.CaptureFixture[str], stack: SigstoreStack, files: dict[str, Path], plans: Path
) -> None:
    """``inspect`` verifies like ``verify`` (``--trusted-root`` included) and reads a bundle as it
    reads an envelope: its statement shown as claimed, the signer only from the verification."""
    code, _, err = run(
        capsys, "sign", "--key", "sigstore", "--identity-token", str(files["token"]), str(plans)
    )
    assert code == 0, err
    sidecar = str(plans / f"startup_plan_{FP}.json.sig")
    trust = ("--trusted-keys", str(files["trusted"]), "--trusted-root", str(files["root"]))
    code, out, err = run(capsys, "inspect", *trust, "--json", sidecar)
    doc = json.loads(out)
    assert code == 0 and doc["status"] == "valid", out + err
    assert doc["signed_by"][0]["identity"] == IDENTITY
    assert doc["bundle"]["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert doc["statement"]["fingerprint"] == FP and "envelope" not in doc
    code, out, _ = run(capsys, "inspect", sidecar)  # no keys: the claim, never the certificate's
    assert code == 0 and "statement.fingerprint" in out and "malformed" not in out
    assert IDENTITY not in out


def test_explain_names_the_keyless_signer_of_the_plan_that_applies(
    capsys: pytest.CaptureFixture[str], stack: SigstoreStack, files: dict[str, Path], plans: Path
) -> None:
    """explain's verdict for a rank whose plan verifies says who signed it: the identity."""
    from plancache.pipeline.audit import check
    from plancache.pipeline.explain import NodeRank, explain_plan
    from plancache.pipeline.resolver import utcnow
    from plancache.pipeline.trust_config import trust_policy
    from plancache.trust.result import PlanResult

    code, _, err = run(
        capsys, "sign", "--key", "sigstore", "--identity-token", str(files["token"]), str(plans)
    )
    assert code == 0, err
    os.environ["PLANCACHE_SIGSTORE_TRUSTED_ROOT"] = str(files["root"])  # restored by `files`
    policy = trust_policy(str(files["trusted"]))
    plan, sig = LocalPlanDir(plans).read(FP)
    report = check(PlanResult(FP, "local", plan, sig), policy, utcnow())
    verdict = explain_plan(NodeRank(0, FP, {}), [report])
    assert verdict["decision"] == "apply", verdict
    (who,) = verdict["signed_by"]
    assert (who["identity"], who["issuer"]) == (IDENTITY, stack.issuer) and who["log_index"] >= 5
    assert f"signed by {IDENTITY}" in verdict["detail"]


BLOCK_NETWORK = """
import sys
def no_network(event, args):
    if event in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.sendto"):
        raise PermissionError(f"no network here: {event}")
sys.addaudithook(no_network)
from plancache.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_node_verifies_bundles_with_no_network_at_all(
    capsys: pytest.CaptureFixture[str], stack: SigstoreStack, files: dict[str, Path], plans: Path
) -> None:
    """Item 4: ``verify`` in a process whose every connection and name lookup is refused (an
    audit hook, so no library can get around it), the local Sigstore servers still up: the
    bundles verify. The same process cannot sign: the hook does hold."""
    code, _, err = run(
        capsys, "sign", "--key", "sigstore", "--identity-token", str(files["token"]), str(plans)
    )
    assert code == 0, err
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"),
        "PLANCACHE_SIGSTORE_TRUSTED_ROOT": str(files["root"]),
    }
    offline = [sys.executable, "-c", BLOCK_NETWORK]
    done = subprocess.run(
        [*offline, "verify", "--trusted-keys", str(files["trusted"]), "--json", str(plans)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["ok"], done.stdout + done.stderr
    assert {p["signed_by"][0]["identity"] for p in report["plans"]} == {IDENTITY}
    sign = ["sign", "--key", "sigstore", "--identity-token", str(files["token"]), "--replace"]
    blocked = subprocess.run(
        [*offline, *sign, str(plans)], env=env, capture_output=True, text=True, timeout=60
    )
    assert blocked.returncode == 1 and "refused (config-error)" in blocked.stdout, blocked.stderr
    fulcio = stack.url("fulcio").split("://")[1]  # up, but never reached: named, with the cause
    assert f"could not reach {fulcio}" in blocked.stdout, blocked.stdout


def test_pubkey_prints_the_identity_line_fulcio_certifies(
    capsys: pytest.CaptureFixture[str], stack: SigstoreStack, files: dict[str, Path], tmp_path: Path
) -> None:
    """``pubkey sigstore`` is the keyless signer's trusted-keys line, from its certificate: for a
    GitHub-shaped token, the workflow's URL, not the token's ``sub``."""
    github = tmp_path / "github-token"
    github.write_text(
        stack.token(
            "repo:acme/serving:ref:refs/heads/main",
            job_workflow_ref="acme/serving/.github/workflows/bake.yml@refs/heads/main",
        )
    )
    before = stack.rekor_requests
    code, out, err = run(capsys, "pubkey", "sigstore", "--identity-token", str(github))
    workflow = "https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main"
    assert code == 0 and out == f"sigstore issuer={stack.issuer} identity={workflow}\n", err
    assert stack.rekor_requests == before  # nothing logged
    code, out, _ = run(capsys, "pubkey", "sigstore", "--identity-token", str(github), "--name", "b")
    assert out.startswith("name=b sigstore issuer=")
    code, _, err = run(
        capsys, "pubkey", "sigstore", "--identity-token", str(github), "--name", "a b"
    )
    assert code == 2 and "one word" in err
    called_from = tmp_path / "called-token"  # as Fulcio certifies a reusable workflow's run
    called_from.write_text(
        stack.token(
            "repo:acme/serving:ref:refs/heads/main",
            job_workflow_ref="acme/serving/.github/workflows/bake.yml@refs/heads/main",
            repository="acme/serving",
            ref="refs/heads/main",
            workflow_ref="acme/serving/.github/workflows/ci.yml@refs/heads/main",
            event_name="push",
        )
    )
    code, out, err = run(capsys, "pubkey", "sigstore", "--identity-token", str(called_from))
    assert code == 0, err
    assert out == (
        f"sigstore issuer={stack.issuer} identity={workflow} "
        "source-repository=https://github.com/acme/serving\n"
    )


def _commands(parser: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, set[str]]]:
    """Every command of the parser (compile-cache's actions included) with its option strings."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{path} {name}".strip())
    if path:
        yield path, {s for a in parser._actions for s in a.option_strings}


def test_every_command_that_verifies_takes_the_trusted_root() -> None:
    """Item 3: ``--trusted-root`` wherever ``--trusted-keys`` is (docs/commands.md says so), and
    ``--identity-token`` wherever ``--key`` signs."""
    from plancache.cli.parser import build_parser

    commands = dict(_commands(build_parser()))
    verifying = {name for name, flags in commands.items() if "--trusted-keys" in flags}
    assert {"verify", "ls", "inspect", "pull", "explain", "compile-cache pull"} <= verifying
    assert [name for name in sorted(verifying) if "--trusted-root" not in commands[name]] == []
    signing = {"sign", "push", "pubkey", "compile-cache sign"}
    assert [name for name in sorted(signing) if "--identity-token" not in commands[name]] == []


def test_sign_names_the_certified_identity_not_the_tokens_claim(
    capsys: pytest.CaptureFixture[str], stack: SigstoreStack, files: dict[str, Path], plans: Path
) -> None:
    """The key a signing run reports is the SAN Fulcio certified (what ``verify`` will show),
    not a GitHub token's ``sub`` claim."""
    github = files["token"].parent / "github-token"
    github.write_text(
        stack.token(
            "repo:acme/serving:ref:refs/heads/main",
            job_workflow_ref="acme/serving/.github/workflows/bake.yml@refs/heads/main",
        )
    )
    code, out, err = run(
        capsys, "sign", "--key", "sigstore", "--identity-token", str(github), "--json", str(plans)
    )
    workflow = "https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main"
    assert code == 0, err
    assert json.loads(out)["key"] == f"sigstore:{workflow}"
    assert "repo:acme" not in out + err
