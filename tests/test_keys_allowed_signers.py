"""OpenSSH allowed_signers lines in trusted-keys files, mixed with plancache's own syntax; the same
file is checked with ssh-keygen -Y where it is installed, so "allowed_signers syntax" means what
OpenSSH means by it."""

from __future__ import annotations

import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conftest import make_signer
from plancache.trust.errors import ConfigError
from plancache.trust.keyring.allowed_signers import matches_pattern_list
from plancache.trust.keyring.keyformat import openssh_line
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_trusted_keys(text, "allowed")
    return info.value.detail


def test_allowed_signers_lines_mix_with_plancache_lines() -> None:
    a, b, c, d, e = (make_signer() for _ in range(5))
    text = "\n".join(
        [
            "# OpenSSH allowed_signers, with plancache's own lines",
            f"ci@acme.example {openssh_line(a.public, 'ci key')}",
            '"alice@acme.example,bob@*" namespaces="git,plancache",valid-after="20260101Z",'
            f'valid-before="202701011230Z" {openssh_line(b.public)}',
            f'git-only@acme.example namespaces="git" {openssh_line(c.public)}',
            f'not-here@acme.example namespaces="*,!plancache" {openssh_line(d.public)}',
            f"name=legacy,valid-after=2026-01-01T00:00:00Z {openssh_line(e.public)}",
            "",
        ]
    )
    keyring = parse_trusted_keys(text, "allowed")
    # c and d are not for namespace plancache
    assert set(keyring.keys) == {a.keyid, b.keyid, e.keyid}
    assert (
        keyring.keys[a.keyid].name == "ci@acme.example"
        and keyring.keys[a.keyid].valid_after is None
    )
    assert keyring.keys[b.keyid].name == "alice@acme.example,bob@*"
    assert keyring.keys[b.keyid].valid_after == datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert keyring.keys[b.keyid].valid_before == datetime(2027, 1, 1, 12, 30, tzinfo=timezone.utc)
    assert keyring.keys[e.keyid].name == "legacy"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ("cert-authority", "cert-authority lines are not supported"),
        ('valid-after="20260101"', "has no Z: OpenSSH would read it in local time"),
        ('valid-after="2026-01-01"', "is not YYYYMMDD[HHMM[SS]]Z"),
        ('valid-after="20261301Z"', "is not a valid date"),
        ('valid-after="20270101Z",valid-before="20260101Z"', "would never count"),
        ("verify-required", "unknown or repeated allowed_signers option"),
        ('namespaces="plancache",namespaces="git"', "unknown or repeated"),
        ('namespaces="plancache', "unterminated quote"),
    ],
)
def test_bad_allowed_signers_lines_are_one_line_naming_the_line(
    options: str, expected: str
) -> None:
    detail = error_of(f"# header\nci@acme {options} {openssh_line(make_signer().public)}\n")
    assert detail.startswith("allowed:2: ") and expected in detail and "\n" not in detail, detail


def test_non_ed25519_keys_and_garbage_are_still_refused() -> None:
    assert "only ssh-ed25519" in error_of("ci@acme ssh-rsa AAAAB3NzaC1yc2E\n")
    assert error_of("not a key line\n").startswith("allowed:1: expected")


def test_namespace_pattern_lists_match_as_openssh_does() -> None:
    assert matches_pattern_list("plancache", "plancache")
    assert matches_pattern_list("plancache", "git,plan*")
    assert matches_pattern_list("plancache", "plan?ache")
    assert not matches_pattern_list("plancache", "git,file")
    assert not matches_pattern_list("plancache", "*,!plancache")
    # no character classes in OpenSSH patterns
    assert not matches_pattern_list("plancache", "[p]lancache")


@pytest.mark.skipif(
    shutil.which("ssh-keygen") is None, reason="ssh-keygen (openssh-client) is not installed"
)
def test_the_same_file_is_one_ssh_keygen_verifies_with(tmp_path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True
    )
    public_line = (tmp_path / "k.pub").read_text().strip()
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f'ci@acme namespaces="plancache",valid-after="20200101Z" {public_line}\n')
    (tmp_path / "msg").write_bytes(b"plan")
    subprocess.run(
        [
            "ssh-keygen",
            "-q",
            "-Y",
            "sign",
            "-n",
            "plancache",
            "-f",
            str(tmp_path / "k"),
            str(tmp_path / "msg"),
        ],
        check=True,
        capture_output=True,
    )
    with open(tmp_path / "msg", "rb") as message:
        ok = subprocess.run(
            [
                "ssh-keygen",
                "-Y",
                "verify",
                "-f",
                str(allowed),
                "-I",
                "ci@acme",
                "-n",
                "plancache",
                "-s",
                str(tmp_path / "msg.sig"),
            ],
            stdin=message,
            capture_output=True,
        )
    assert ok.returncode == 0, ok.stderr
    keyring = parse_trusted_keys(allowed.read_text(), str(allowed))
    (key,) = keyring.keys.values()
    assert key.name == "ci@acme" and key.valid_after == datetime(2020, 1, 1, tzinfo=timezone.utc)
