"""``plancache doctor`` with keyless signing set up never touches the network (issue 37's
edges, item 2).

A node's doctor runs where no Sigstore service may be reachable (an air-gapped cluster, a node
whose egress allows only the store). With ``PLANCACHE_SIGNING_KEY=sigstore`` it reports what
signing would need (where the OIDC token comes from and when it expires, the trust
configuration and whether it parses, the trusted root's expiry) without asking Fulcio, Rekor
or Sigstore's TUF repository for anything. Proven in a child process whose every
``socket.connect`` and name lookup is recorded by an audit hook (none may happen), and which
runs in a network namespace of its own (``unshare -n``: no route out at all) where this machine
allows it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from sigstore_stack import SigstoreStack

ISSUER = "https://token.actions.githubusercontent.com"
IDENTITY = "https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main"
SRC = Path(__file__).resolve().parents[1] / "src"
HANG_GUARD = 120
"""Seconds before a child is killed as hung: a guard against a hang, not a time measurement."""

CHILD = """
import json, sys
attempts = []
def hook(event, args):
    if event in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname",
                 "socket.gethostbyaddr", "socket.sendto"):
        attempts.append([event, repr(args)[:200]])
sys.addaudithook(hook)
from plancache.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
print("ATTEMPTS " + json.dumps(attempts), file=sys.stderr)
sys.exit(code)
"""


def _token(lifetime: int = 600) -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "sub": IDENTITY, "aud": "sigstore", "iat": now, "nbf": now}
    claims["exp"] = now + lifetime
    key = ec.generate_private_key(ec.SECP256R1())
    return jwt.encode(claims, key, algorithm="ES256", headers={"kid": "k"})


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


UNSHARE = _unshare_works()


def doctor(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[int, str, str, list[object]]:
    """``plancache doctor ARGS`` in a child with no route out (when ``unshare -n`` works here)
    and every connection attempt recorded; its exit code, stdout, stderr and the attempts."""
    home = tmp_path / "home"  # no TUF cache of a previous run to fall back on
    home.mkdir(exist_ok=True)
    base = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm"),
        "NO_PROXY": "",
    }
    argv = [sys.executable, "-c", CHILD, "doctor", *args]
    if UNSHARE:
        argv = ["unshare", "-n", *argv]
    done = subprocess.run(
        argv, env={**base, **env}, capture_output=True, text=True, timeout=HANG_GUARD
    )
    err_lines = done.stderr.splitlines()
    attempts = json.loads(err_lines[-1].removeprefix("ATTEMPTS ")) if err_lines else None
    assert attempts is not None and err_lines[-1].startswith("ATTEMPTS"), done.stderr
    return done.returncode, done.stdout, "\n".join(err_lines[:-1]), attempts


@pytest.fixture(scope="module")
def stack() -> SigstoreStack:
    with SigstoreStack() as s:
        return s  # its keys and trust files only: its servers are never asked here


@pytest.mark.parametrize("config", ["public-good", "file"])
def test_doctor_with_keyless_signing_makes_no_connection(
    tmp_path: Path, stack: SigstoreStack, config: str
) -> None:
    trusted = tmp_path / "trusted"
    trusted.write_text(f"sigstore issuer={ISSUER} identity={IDENTITY}\n")
    env = {
        "PLANCACHE_SIGNING_KEY": "sigstore",
        "SIGSTORE_ID_TOKEN": _token(),
        "PLANCACHE_TRUSTED_KEYS": str(trusted),
    }
    if config == "file":
        (tmp_path / "cfg.json").write_bytes(stack.trust_config_bytes())
        (tmp_path / "root.json").write_bytes(stack.trusted_root_bytes())
        env["PLANCACHE_SIGSTORE_TRUST_CONFIG"] = str(tmp_path / "cfg.json")
        env["PLANCACHE_SIGSTORE_TRUSTED_ROOT"] = str(tmp_path / "root.json")
    _, out, err, attempts = doctor(tmp_path, env, "--json")
    assert attempts == [], attempts
    assert "Traceback" not in err, err
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert all("\n" not in c["detail"] for c in checks.values())
    assert checks["signing-key"]["status"] == "ok", checks["signing-key"]
    token = checks["sigstore-token"]
    assert token["status"] == "ok" and "SIGSTORE_ID_TOKEN" in token["detail"]
    assert "expires" in token["detail"] and ISSUER in token["detail"]
    trust = checks["sigstore-trust-config"]
    assert trust["status"] == "ok", trust
    if config == "file":
        assert "parses" in trust["detail"] and stack.url("fulcio") in trust["detail"]
    else:
        assert "public-good" in trust["detail"] and "not contacted" in trust["detail"]
    assert "valid until" in trust["detail"] or "no end date" in trust["detail"]
    assert checks["sigstore-trust-root"]["status"] == "ok"
    assert env["SIGSTORE_ID_TOKEN"] not in out + err

    _, out, err, attempts = doctor(tmp_path, env)  # the table: one line per check
    assert attempts == [] and "Traceback" not in err, err
    names = [line.split()[0] for line in out.splitlines()[1:] if line and not line[0].isspace()]
    assert {"signing-key", "sigstore-token", "sigstore-trust-config"} <= set(names)
    assert len(names) == len(set(names)), out  # each check once, each on one line
    assert env["SIGSTORE_ID_TOKEN"] not in out + err


def test_doctor_names_an_expired_or_missing_token_without_showing_it(
    tmp_path: Path,
) -> None:
    expired = _token(lifetime=-120)
    _, out, err, attempts = doctor(
        tmp_path, {"PLANCACHE_SIGNING_KEY": "sigstore", "SIGSTORE_ID_TOKEN": expired}, "--json"
    )
    assert attempts == [] and "Traceback" not in err, err
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["sigstore-token"]["status"] == "warn"
    assert "expired at" in checks["sigstore-token"]["detail"]
    assert checks["signing-key"]["status"] == "warn"
    assert expired not in out + err and expired.split(".")[1] not in out + err

    _, out, err, attempts = doctor(tmp_path, {"PLANCACHE_SIGNING_KEY": "sigstore"}, "--json")
    assert attempts == [] and "Traceback" not in err, err
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["sigstore-token"]["status"] == "warn"
    assert "no OIDC token" in checks["sigstore-token"]["detail"]


def test_doctor_names_the_ci_token_it_would_ask_for_without_asking(tmp_path: Path) -> None:
    """GitHub Actions' token is fetched from the runner at signing time: doctor says so and
    asks nothing (the request URL here is a closed port it must not connect to)."""
    env = {
        "PLANCACHE_SIGNING_KEY": "sigstore",
        "GITHUB_ACTIONS": "true",
        "ACTIONS_ID_TOKEN_REQUEST_URL": "http://127.0.0.1:9/token?x=1",
        "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "runner-secret-value",
    }
    _, out, err, attempts = doctor(tmp_path, env, "--json")
    assert attempts == [] and "Traceback" not in err, err
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["sigstore-token"]["status"] == "ok"
    assert "GitHub Actions" in checks["sigstore-token"]["detail"]
    assert "runner-secret-value" not in out + err
