"""What keyless signing and verifying read from an operator's paths and variables, when those
are hostile (issue 37's edges, item 3).

``--identity-token FILE`` / ``SIGSTORE_ID_TOKEN``, ``PLANCACHE_SIGSTORE_TRUST_CONFIG``,
``PLANCACHE_SIGSTORE_TRUSTED_ROOT`` / ``--trusted-root``: a FIFO with no writer (must not hang:
run in a child with a hang guard), a directory, ``/dev/zero``, a 100 MiB file, a symlink to
another user's file (read as ``nobody``: denied; read as root: not a token, never shown), a
token with a line break or a NUL inside, an expired token. Each is exit 2 and one line, and no
token's bytes appear in any output.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from cli_support import run
from conftest import FP, plan_bytes
from plancache.keys.schemes import load_signer
from plancache.storage.local.localdir import LocalPlanDir
from plancache.trust.errors import ConfigError
from sigstore_stack import SigstoreStack

IDENTITY = "https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main"
SRC = Path(__file__).resolve().parents[1] / "src"
HANG_GUARD = 120
"""Seconds before a child is killed as hung: a guard, not a time measurement."""
NOBODY = 65534


@pytest.fixture(scope="module")
def stack() -> Iterator[SigstoreStack]:
    with SigstoreStack() as s:
        yield s


@pytest.fixture(scope="module")
def files(stack: SigstoreStack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("inputs")
    paths = {
        "config": folder / "trust_config.json",
        "root": folder / "trusted_root.json",
        "trusted": folder / "trusted",
    }
    paths["config"].write_bytes(stack.trust_config_bytes())
    paths["root"].write_bytes(stack.trusted_root_bytes())
    paths["trusted"].write_text(f"sigstore issuer={stack.issuer} identity={IDENTITY}\n")
    return paths


@pytest.fixture
def hostile(tmp_path: Path) -> dict[str, Path]:
    """The hostile paths: a FIFO (nobody writes), a directory, /dev/zero, a 100 MiB file."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    with open(tmp_path / "huge", "wb") as f:
        f.truncate(100 * 1024 * 1024)  # sparse: 100 MiB to read, nothing on disk
    return {
        "fifo": tmp_path / "fifo",
        "dir": tmp_path / "dir",
        "zero": Path("/dev/zero"),
        "huge": tmp_path / "huge",
    }


@pytest.fixture
def plans(plan_dir: Path) -> Path:
    LocalPlanDir(plan_dir).write(FP, plan_bytes(), None)
    return plan_dir


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "SIGSTORE_ID_TOKEN",
        "PLANCACHE_SIGSTORE_TRUST_CONFIG",
        "PLANCACHE_SIGSTORE_TRUSTED_ROOT",
        "PLANCACHE_SIGSTORE_IDENTITY_TOKEN_FILE",
        "PLANCACHE_SIGNING_KEY",
        "PLANCACHE_TRUSTED_KEYS",
    ):
        monkeypatch.delenv(name, raising=False)
    # the CLI sets these from its flags for the rest of the process: restored after each test
    monkeypatch.setenv("PLANCACHE_SIGSTORE_IDENTITY_TOKEN_FILE", "")
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT", "")


def one_error_line(code: int, out: str, err: str) -> str:
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("plancache: error: "), err
    return lines[0]


def child(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    """``plancache ARGV`` in a child process (a FIFO that blocked would hang it, not the suite)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SIGSTORE", "PLANCACHE"))}
    base["PYTHONPATH"] = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "plancache.cli.main", *argv],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        cwd=cwd,
    )
    return done.returncode, done.stdout, done.stderr


# -- the token ------------------------------------------------------------------------------------


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("kind", ["dir", "zero", "huge"])
def test_an_identity_token_file_that_is_not_one_is_one_line(
    capsys: pytest.CaptureFixture[str],
    files: dict[str, Path],
    hostile: dict[str, Path],
    plans: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUST_CONFIG", str(files["config"]))
    code, out, err = run(
        capsys, "sign", "--key", "sigstore", "--identity-token", str(hostile[kind]), str(plans)
    )
    line = one_error_line(code, out, err)
    assert "--identity-token" in line
    assert ("larger than" if kind == "huge" else "not a regular file") in line


def test_an_identity_token_fifo_never_blocks(
    files: dict[str, Path], hostile: dict[str, Path], plans: Path, tmp_path: Path
) -> None:
    env = {"PLANCACHE_SIGSTORE_TRUST_CONFIG": str(files["config"])}
    argv = ["sign", "--key", "sigstore", "--identity-token", str(hostile["fifo"]), str(plans)]
    line = one_error_line(*child(argv, env, tmp_path))
    assert "not a regular file" in line


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("inside", ["\n", "\x00", "\r", " "])
def test_a_token_with_a_break_inside_is_refused_unshown(
    capsys: pytest.CaptureFixture[str],
    stack: SigstoreStack,
    files: dict[str, Path],
    plans: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    inside: str,
) -> None:
    token = stack.token(IDENTITY)
    head, body, sig = token.split(".")
    broken = f"{head}.{body[:20]}{inside}{body[20:]}.{sig}"
    path = tmp_path / "token"
    path.write_bytes(broken.encode() + b"\n")
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUST_CONFIG", str(files["config"]))
    before = stack.fulcio_requests
    code, out, err = run(
        capsys, "sign", "--key", "sigstore", "--identity-token", str(path), str(plans)
    )
    line = one_error_line(code, out, err)
    assert "not one line of text" in line
    for part in (head, body[:20], body[20:], sig):
        assert part not in out + err
    assert stack.fulcio_requests == before  # nothing sent anywhere
    env = {"SIGSTORE_ID_TOKEN": broken, "PLANCACHE_SIGSTORE_TRUST_CONFIG": str(files["config"])}
    with pytest.raises(ConfigError) as caught:  # the variable, as the plugin reads it
        load_signer("sigstore", env)
    assert "from SIGSTORE_ID_TOKEN is not one line of text" in caught.value.detail
    assert body[:20] not in caught.value.detail


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("where", ["file", "variable"])
def test_an_expired_token_is_one_line_naming_its_expiry(
    capsys: pytest.CaptureFixture[str],
    stack: SigstoreStack,
    files: dict[str, Path],
    plans: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    token = stack.token(IDENTITY, lifetime=-600)
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUST_CONFIG", str(files["config"]))
    if where == "file":
        (tmp_path / "token").write_text(token + "\n")
        flags = ["--identity-token", str(tmp_path / "token")]
    else:
        monkeypatch.setenv("SIGSTORE_ID_TOKEN", token)
        flags = []
    code, out, err = run(capsys, "sign", "--key", "sigstore", *flags, str(plans))
    line = one_error_line(code, out, err)
    expected = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(time.time() - 600))[:13]
    assert "expired at" in line and expected in line, line
    for part in token.split("."):
        assert part not in out + err


@pytest.mark.usefixtures("clean_env")
def test_a_symlink_to_another_users_file_is_not_shown(
    capsys: pytest.CaptureFixture[str],
    files: dict[str, Path],
    plans: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Root follows the link (tokens are mounted as links) and finds no token: what the file holds
    is never printed, nor sent."""
    other = tmp_path / "bob-credentials"
    other.write_text("aws_secret_access_key = hunter2-not-a-token\n")
    if os.geteuid() == 0:
        os.chown(other, NOBODY, NOBODY)
    other.chmod(0o600)
    (tmp_path / "token").symlink_to(other)
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUST_CONFIG", str(files["config"]))
    code, out, err = run(
        capsys, "sign", "--key", "sigstore", "--identity-token", str(tmp_path / "token"), str(plans)
    )
    line = one_error_line(code, out, err)
    assert "hunter2" not in out + err and "not one line of text" in line


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)
def test_a_symlink_to_a_file_this_user_may_not_read_is_one_line(
    files: dict[str, Path], plans: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """As ``nobody``, a link to root's 0600 file: denied, one line, no hang."""
    shared = tmp_path_factory.mktemp("shared")
    shared.chmod(0o755)
    secret = shared / "root-only"
    secret.write_text("root-secret-value\n")
    secret.chmod(0o600)
    (shared / "token").symlink_to(secret)
    config = shared / "trust_config.json"
    shutil.copy(files["config"], config)
    config.chmod(0o644)
    base = {"PYTHONPATH": str(SRC), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    env = {**base, "HOME": str(shared), "PLANCACHE_SIGSTORE_TRUST_CONFIG": str(config)}
    argv = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        sys.executable,
        "-m",
        "plancache.cli.main",
        "sign",
        "--key",
        "sigstore",
        "--identity-token",
        str(shared / "token"),
        str(shared),
    ]
    done = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=HANG_GUARD, cwd=shared
    )
    line = one_error_line(done.returncode, done.stdout, done.stderr)
    assert "Permission denied" in line and "root-secret-value" not in done.stdout + done.stderr


# -- the trust configuration and the trusted root ------------------------------------------------


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("kind", ["dir", "zero", "huge"])
def test_a_trust_config_that_is_not_a_file_is_one_line(
    capsys: pytest.CaptureFixture[str],
    stack: SigstoreStack,
    hostile: dict[str, Path],
    plans: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    monkeypatch.setenv("SIGSTORE_ID_TOKEN", stack.token(IDENTITY))
    monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUST_CONFIG", str(hostile[kind]))
    code, out, err = run(capsys, "sign", "--key", "sigstore", str(plans))
    line = one_error_line(code, out, err)
    assert "PLANCACHE_SIGSTORE_TRUST_CONFIG" in line
    assert ("larger than" if kind == "huge" else "not a regular file") in line


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("kind", ["dir", "zero", "huge"])
@pytest.mark.parametrize("how", ["flag", "variable"])
def test_a_trusted_root_that_is_not_a_file_is_one_line(
    capsys: pytest.CaptureFixture[str],
    files: dict[str, Path],
    hostile: dict[str, Path],
    plans: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    how: str,
) -> None:
    flags = ["--trusted-root", str(hostile[kind])] if how == "flag" else []
    if how == "variable":
        monkeypatch.setenv("PLANCACHE_SIGSTORE_TRUSTED_ROOT", str(hostile[kind]))
    code, out, err = run(
        capsys, "verify", "--trusted-keys", str(files["trusted"]), *flags, str(plans)
    )
    line = one_error_line(code, out, err)
    assert "PLANCACHE_SIGSTORE_TRUSTED_ROOT" in line
    assert ("larger than" if kind == "huge" else "not a regular file") in line


@pytest.mark.parametrize("what", ["config", "root-flag", "root-variable"])
def test_a_fifo_for_the_trust_config_or_root_never_blocks(
    stack: SigstoreStack,
    files: dict[str, Path],
    hostile: dict[str, Path],
    plans: Path,
    tmp_path: Path,
    what: str,
) -> None:
    fifo = str(hostile["fifo"])
    if what == "config":
        env = {"SIGSTORE_ID_TOKEN": stack.token(IDENTITY), "PLANCACHE_SIGSTORE_TRUST_CONFIG": fifo}
        argv = ["sign", "--key", "sigstore", str(plans)]
    else:
        env = {"PLANCACHE_SIGSTORE_TRUSTED_ROOT": fifo} if what == "root-variable" else {}
        flags = ["--trusted-root", fifo] if what == "root-flag" else []
        argv = ["verify", "--trusted-keys", str(files["trusted"]), *flags, str(plans)]
    line = one_error_line(*child(argv, env, tmp_path))
    assert "not a regular file" in line


def test_a_token_variable_over_the_cap_is_refused(
    stack: SigstoreStack, files: dict[str, Path]
) -> None:
    huge = jwt.encode(
        {"iss": stack.issuer, "sub": IDENTITY, "aud": "sigstore", "pad": "x" * 100_000},
        ec.generate_private_key(ec.SECP256R1()),
        algorithm="ES256",
    )
    env = {"SIGSTORE_ID_TOKEN": huge, "PLANCACHE_SIGSTORE_TRUST_CONFIG": str(files["config"])}
    with pytest.raises(ConfigError) as caught:
        load_signer("sigstore", env)
    assert "larger than" in caught.value.detail and "x" * 100 not in caught.value.detail
