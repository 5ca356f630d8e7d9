"""Key formats, the trusted-keys file format, keygen, and the private-key permission check."""

from __future__ import annotations

import os
import stat
from datetime import datetime, timezone
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from conftest import make_signer
from plancache.storage.keyfiles import generate_keypair, keyring_from, load_keyring, load_signer
from plancache.trust.errors import PlanCacheError, Reason
from plancache.trust.keys import key_id, openssh_line, parse_trusted_keys


def config_error(func, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(PlanCacheError) as info:
        func(*args, **kwargs)
    assert info.value.reason is Reason.CONFIG, info.value
    return info.value.detail


def test_key_id_matches_openssh_fingerprint_format() -> None:
    signer = make_signer()
    kid = key_id(signer.public)
    assert kid.startswith("SHA256:") and len(kid) == 7 + 43 and "=" not in kid


def test_keygen_writes_0600_private_and_a_pub_that_is_a_trusted_keys_file(tmp_path: Path) -> None:
    signer = generate_keypair(tmp_path / "ci", force=False, comment="ci-signer", env={})
    assert stat.S_IMODE(os.stat(tmp_path / "ci").st_mode) == 0o600
    keyring = load_keyring(tmp_path / "ci.pub")
    assert list(keyring.keys) == [signer.keyid]
    assert keyring.keys[signer.keyid].name == "ci-signer"
    assert load_signer(str(tmp_path / "ci"), env={}).keyid == signer.keyid


def test_keygen_never_overwrites_without_force(tmp_path: Path) -> None:
    first = generate_keypair(tmp_path / "k", force=False, comment="", env={})
    assert "--force" in config_error(generate_keypair, tmp_path / "k", False, "", {})
    assert load_signer(str(tmp_path / "k"), env={}).keyid == first.keyid
    second = generate_keypair(tmp_path / "k", force=True, comment="", env={})
    assert second.keyid != first.keyid and load_signer(str(tmp_path / "k"), env={}).keyid == second.keyid


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o666])
def test_loose_private_key_permissions_are_refused(tmp_path: Path, mode: int) -> None:
    generate_keypair(tmp_path / "k", force=False, comment="", env={})
    os.chmod(tmp_path / "k", mode)
    assert "chmod 600" in config_error(load_signer, str(tmp_path / "k"), {})


def test_encrypted_keys_need_the_passphrase(tmp_path: Path) -> None:
    env = {"PLANCACHE_KEY_PASSPHRASE": "s3cret"}
    signer = generate_keypair(tmp_path / "k", force=False, comment="", env=env)
    assert b"ENCRYPTED" in (tmp_path / "k").read_bytes()
    assert load_signer(str(tmp_path / "k"), env=env).keyid == signer.keyid
    assert "PLANCACHE_KEY_PASSPHRASE" in config_error(load_signer, str(tmp_path / "k"), {})
    config_error(load_signer, str(tmp_path / "k"), {"PLANCACHE_KEY_PASSPHRASE": "wrong"})


def test_openssh_private_keys_load(tmp_path: Path) -> None:
    private = Ed25519PrivateKey.generate()
    path = tmp_path / "id_ed25519"
    path.write_bytes(
        private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    )
    path.chmod(0o600)
    assert load_signer(str(path), env={}).keyid == key_id(private.public_key())


def test_missing_and_non_ed25519_keys(tmp_path: Path) -> None:
    assert "does not exist" in config_error(load_signer, str(tmp_path / "nope"), {})
    from cryptography.hazmat.primitives.asymmetric import ec

    other = ec.generate_private_key(ec.SECP256R1())
    path = tmp_path / "ec"
    path.write_bytes(other.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    path.chmod(0o600)
    assert "Ed25519" in config_error(load_signer, str(path), {})
    assert "unsupported" in config_error(load_signer, "kms://projects/x", {})


def test_public_keys_from_pem_openssh_and_directory(tmp_path: Path) -> None:
    a, b, c = make_signer(), make_signer(), make_signer()
    pem = a.public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "a.pub").write_bytes(pem)
    (tmp_path / "keys" / "b.pub").write_text(openssh_line(b.public, "bee") + "\n")
    (tmp_path / "keys" / "notes.txt").write_text("ignored")
    keyring = load_keyring(tmp_path / "keys")
    assert set(keyring.keys) == {a.keyid, b.keyid}
    assert keyring.keys[b.keyid].name == "bee"
    env_ring = keyring_from(None, {"PLANCACHE_TRUSTED_KEYS": str(tmp_path / "keys")})
    assert env_ring is not None and set(env_ring.keys) == {a.keyid, b.keyid}
    assert keyring_from(None, {}) is None
    assert c.keyid not in keyring.keys


def test_trusted_keys_file_options_and_revocation() -> None:
    a, b, c, d = (make_signer() for _ in range(4))
    text = "\n".join(
        [
            "# fleet signers",
            "",
            f"name=ci-2026,valid-after=2026-01-01T00:00:00Z,valid-before=2027-01-01T00:00:00Z {openssh_line(a.public)}",
            openssh_line(b.public, "laptop of bob"),
            openssh_line(c.public, "old"),
            f"@revoked {openssh_line(c.public)}",
            f"@revoked {d.keyid}",
        ]
    )
    keyring = parse_trusted_keys(text, "trusted")
    assert set(keyring.keys) == {a.keyid, b.keyid}
    assert keyring.revoked == {c.keyid, d.keyid}
    ka = keyring.keys[a.keyid]
    assert ka.name == "ci-2026"
    assert ka.valid_after == datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert keyring.keys[b.keyid].name == "laptop of bob"


@pytest.mark.parametrize(
    "line",
    [
        "ssh-rsa AAAAB3NzaC1yc2E bob",
        "ssh-ed25519 not-base64!",
        "ssh-ed25519",
        "colour=blue ssh-ed25519 AAAA",
        "@revoked",
        "@revoked bogus",
    ],
)
def test_bad_trusted_key_lines_name_the_line(line: str) -> None:
    detail = config_error(parse_trusted_keys, f"# header\n{line}\n", "keys.txt")
    assert "keys.txt:2" in detail or "ssh-ed25519" in detail


def test_empty_trusted_keys_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("# nothing\n")
    assert "no usable key" in config_error(load_keyring, tmp_path / "empty")
    assert "does not exist" in config_error(load_keyring, tmp_path / "missing")


def test_key_files_mounted_as_symlinks_load(tmp_path: Path) -> None:
    """Kubernetes mounts ConfigMaps and Secrets as symlinks into ``..data/``."""
    data = tmp_path / "..data"
    data.mkdir()
    signer = generate_keypair(data / "ci", force=False, comment="ci", env={})
    mount = tmp_path / "mount"
    mount.mkdir()
    (mount / "ci.pub").symlink_to(data / "ci.pub")
    (mount / "ci").symlink_to(data / "ci")
    assert list(load_keyring(mount).keys) == [signer.keyid]
    assert load_signer(str(mount / "ci"), env={}).keyid == signer.keyid
