"""Key formats, the trusted-keys file format, keygen, and the private-key permission check."""

from __future__ import annotations

import base64
import binascii
import os
import re
import stat
import string
import struct
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_signer
from plancache.keys.keyfile import generate_keypair, load_keyring
from plancache.keys.schemes import load_signer
from plancache.pipeline.trust_config import keys_source, load_trusted_keys
from plancache.trust.display import safe_text
from plancache.trust.errors import ConfigError, PlanCacheError, Reason
from plancache.trust.keyring import allowed_signers, trusted_keys_file
from plancache.trust.keyring.keyformat import (
    canonical_keyid,
    key_id,
    openssh_line,
    parse_openssh_public,
)
from plancache.trust.keyring.keys import Keyring
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys


def config_error(func, *args, **kwargs) -> str:
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
    assert "--force" in config_error(generate_keypair, tmp_path / "k", False, "", env={})
    assert load_signer(str(tmp_path / "k"), env={}).keyid == first.keyid
    second = generate_keypair(tmp_path / "k", force=True, comment="", env={})
    assert (
        second.keyid != first.keyid
        and load_signer(str(tmp_path / "k"), env={}).keyid == second.keyid
    )


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
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    assert load_signer(str(path), env={}).keyid == key_id(private.public_key())


def test_missing_and_non_ed25519_keys(tmp_path: Path) -> None:
    assert "does not exist" in config_error(load_signer, str(tmp_path / "nope"), {})
    from cryptography.hazmat.primitives.asymmetric import ec

    other = ec.generate_private_key(ec.SECP256R1())
    path = tmp_path / "ec"
    path.write_bytes(
        other.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    assert "Ed25519" in config_error(load_signer, str(path), {})
    assert "unsupported" in config_error(load_signer, "kms://projects/x", {})


def test_public_keys_from_pem_openssh_and_directory(tmp_path: Path) -> None:
    a, b, c = make_signer(), make_signer(), make_signer()
    pem = a.public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "a.pub").write_bytes(pem)
    (tmp_path / "keys" / "b.pub").write_text(openssh_line(b.public, "bee") + "\n")
    (tmp_path / "keys" / "notes.txt").write_text("ignored")
    keyring = load_keyring(tmp_path / "keys")
    assert set(keyring.keys) == {a.keyid, b.keyid}
    assert keyring.keys[b.keyid].name == "bee"
    source = keys_source(None, {"PLANCACHE_TRUSTED_KEYS": str(tmp_path / "keys")})
    assert source is not None and set(load_trusted_keys(source).keys) == {a.keyid, b.keyid}
    assert keys_source(None, {}) is None
    assert c.keyid not in keyring.keys


def test_trusted_keys_file_options_and_revocation() -> None:
    a, b, c, d = (make_signer() for _ in range(4))
    text = "\n".join(
        [
            "# fleet signers",
            "",
            "name=ci-2026,valid-after=2026-01-01T00:00:00Z,valid-before=2027-01-01T00:00:00Z "
            f"{openssh_line(a.public)}",
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


_KEY = make_signer()
_UNUSED_BIT = (
    _KEY.keyid[:-1]
    + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".index(_KEY.keyid[-1]) ^ 1
    ]
)


@pytest.mark.parametrize(
    "line",
    [
        "ssh-rsa AAAAB3NzaC1yc2E bob",
        "ssh-ed25519 not-base64!",
        "ssh-ed25519",
        "colour=blue ssh-ed25519 AAAA",
        "@revoked",
        "@revoked bogus",
        "@revoked SHA256:tooshort",
        "@revoked SHA256:" + "!" * 43,
        f"@revoked {_KEY.keyid}==",
        f"@revoked {_UNUSED_BIT}",
        "@revoked ssh-ed25519 not-base64!",
        f"valid-after=2026-13-01T00:00:00Z {openssh_line(_KEY.public)}",
        "valid-after=2027-01-01T00:00:00Z,valid-before=2026-01-01T00:00:00Z "
        f"{openssh_line(_KEY.public)}",
        "-----BEGIN PUBLIC KEY-----",
        "-----BEGIN PRIVATE KEY-----",
    ],
    ids=lambda line: re.sub(r"AAAAC3\S+|SHA256:\S{40,}", "<key>", line),  # stable across runs
)
def test_bad_trusted_key_lines_are_config_errors_naming_the_line(line: str) -> None:
    """Every entry must parse: an ignored line is a key not revoked or a key not trusted."""
    detail = config_error(parse_trusted_keys, f"# header\n{line}\n", "keys.txt")
    assert detail.startswith("keys.txt:2: ") and "\n" not in detail, detail


def test_canonical_key_ids() -> None:
    kid = _KEY.keyid
    assert canonical_keyid(kid) == kid and canonical_keyid(kid + "=") == kid
    for bogus in (
        kid + "==",
        kid[:-1],
        _UNUSED_BIT,
        "sha256:" + kid[7:],
        "MD5:" + kid[7:],
        kid + "\n",
        None,
        7,
    ):
        assert canonical_keyid(bogus) is None, bogus
    with pytest.raises(ConfigError):
        Keyring(revoked=frozenset({kid + "="}))


def test_revoked_ids_with_padding_or_a_comment_revoke() -> None:
    a, b = make_signer(), make_signer()
    text = (
        f"{openssh_line(a.public)}\n{openssh_line(b.public)}\n"
        f"@revoked {a.keyid}=\n@revoked {b.keyid} lost laptop\n"
    )
    keyring = parse_trusted_keys(text, "k")
    assert keyring.keys == {} and keyring.revoked == {a.keyid, b.keyid}


def test_a_file_that_starts_with_a_pem_key_parses_the_rest() -> None:
    a, b, c = make_signer(), make_signer(), make_signer()
    pem = a.public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    keyring = parse_trusted_keys(f"{pem}{openssh_line(b.public, 'bee')}\n@revoked {c.keyid}\n", "k")
    assert set(keyring.keys) == {a.keyid, b.keyid} and keyring.revoked == {c.keyid}
    detail = config_error(parse_trusted_keys, f"{pem}not a key line\n", "k")
    assert detail.startswith("k:4: ")
    assert config_error(parse_trusted_keys, f"{pem}{pem}", "k").startswith("k:4: ")  # listed twice


def test_a_key_listed_twice_is_a_config_error(tmp_path: Path) -> None:
    a = make_signer()
    text = (
        f"name=first {openssh_line(a.public)}\n# later\n"
        f"valid-before=2027-01-01T00:00:00Z {openssh_line(a.public)}\n"
    )
    assert (
        config_error(parse_trusted_keys, text, "k")
        == f"k:3: key {a.keyid} is already listed at line 1"
    )
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "a.pub").write_text(openssh_line(a.public) + "\n")
    (tmp_path / "keys" / "b.pub").write_text(openssh_line(a.public, "again") + "\n")
    assert "already listed" in config_error(load_keyring, tmp_path / "keys")


def test_a_keyring_of_revocations_only_is_valid_only_where_asked_for(tmp_path: Path) -> None:
    a = make_signer()
    (tmp_path / "revoked").write_text(f"@revoked {a.keyid}\n")
    assert "no usable key" in config_error(load_keyring, tmp_path / "revoked")
    keyring = load_keyring(tmp_path / "revoked", allow_revocations_only=True)
    assert keyring.keys == {} and keyring.revoked == {a.keyid}
    ring = load_trusted_keys(str(tmp_path / "revoked"), revocations_only=True)
    assert ring.revoked == {a.keyid}
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "old.pub").write_text(f"{openssh_line(a.public)}\n@revoked {a.keyid}\n")
    assert "no usable key" in config_error(load_keyring, tmp_path / "dir")  # a directory too
    assert load_keyring(tmp_path / "dir", allow_revocations_only=True).revoked == {a.keyid}
    (tmp_path / "empty").write_text("# nothing\n")
    config_error(load_keyring, tmp_path / "empty", allow_revocations_only=True)


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


_K = make_signer()


@pytest.mark.parametrize(
    "line",
    [
        f"@revoke {openssh_line(_K.public)} leaked-laptop",
        f"@REVOKED {openssh_line(_K.public)}",
        f"@Revoked {_K.keyid}",
        f"@revoked: {openssh_line(_K.public)}",
        f"@cert-authority {openssh_line(_K.public)}",
        # an allowed_signers principal spelled like the marker
        f"revoked {openssh_line(_K.public)}",
        f"REVOKE {openssh_line(_K.public)}",
        f'"alice,revoked" {openssh_line(_K.public)}',
        f'ci@acme,!Revoked namespaces="plancache" {openssh_line(_K.public)}',
        f"{openssh_line(_K.public)} revoked",  # a key named like it by its comment
        f"{openssh_line(_K.public)} old laptop, REVOKED 2026-05",
        f"name=@revoked {openssh_line(_K.public)}",
    ],
    ids=lambda line: re.sub(r"AAAAC3\S+|SHA256:\S{40,}", "<key>", line),
)
def test_a_misspelled_revocation_is_a_config_error_not_a_trusted_key(
    line: str, tmp_path: Path
) -> None:
    """Each of these once *trusted* the key its author meant to revoke (named '@revoke' & co.)."""
    text = f"{openssh_line(make_signer().public, 'ci')}\n{line}\n"
    detail = config_error(parse_trusted_keys, text, "trusted-keys")
    assert detail.startswith("trusted-keys:2: ") and "\n" not in detail, detail
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "ci.pub").write_text(text)  # in a directory of .pub files alike
    assert config_error(load_keyring, tmp_path / "keys").startswith(
        f"{tmp_path / 'keys' / 'ci.pub'}:2: "
    )


def test_revocation_works_the_same_in_every_key_line_format() -> None:
    keys = [make_signer() for _ in range(5)]
    lines = [openssh_line(k.public, f"k{i}") for i, k in enumerate(keys)]
    revocations = [
        f"@revoked {keys[0].keyid}",
        f"@revoked {openssh_line(keys[1].public)}",
        f"@revoked name=ci-2026,valid-before=2027-01-01T00:00:00Z {openssh_line(keys[2].public)}",
        f'@revoked ci@acme namespaces="plancache" {openssh_line(keys[3].public)} laptop',
        # any namespace: the key is void
        f'@revoked\tgit@acme namespaces="git" {openssh_line(keys[4].public)}',
    ]
    keyring = parse_trusted_keys("\n".join(lines + revocations) + "\n", "k")
    assert keyring.keys == {} and keyring.revoked == {k.keyid for k in keys}
    fine = parse_trusted_keys(f"{openssh_line(keys[0].public, 'revoked-certs-tester')}\n", "k")
    # a name merely containing the word in a longer one is fine
    assert list(fine.keys) == [keys[0].keyid]


@pytest.mark.parametrize("comment", ["José", "ci 2026 (rotated)", "用户", "ops@acme"])
def test_keygen_takes_any_printable_comment_and_the_pub_reads_back(
    tmp_path: Path, comment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from plancache.cli.main import main

    assert main(["keygen", "--comment", comment, str(tmp_path / "k")]) == 0
    keyring = load_keyring(tmp_path / "k.pub")
    assert [k.name for k in keyring.keys.values()] == [comment]


@pytest.mark.parametrize(
    "comment",
    [
        "two\nlines",
        "tab\tinside",
        " padded",
        "revoked",
        "REVOKE",
        "\x1b[31mred",
        "bidi\u202e",
        "sep\u2028",
    ],
)
def test_keygen_refuses_a_comment_it_cannot_write_and_leaves_nothing(
    tmp_path: Path, comment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from plancache.cli.main import main

    assert main(["keygen", "--comment", comment, str(tmp_path / "k")]) == 2
    assert "plancache: error:" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert main(["keygen", "--comment", "fine", str(tmp_path / "k")]) == 0  # a rerun is not refused


def test_keygen_takes_any_file_name_and_cleans_up_when_the_public_line_cannot_be_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from plancache.cli.main import main

    odd = tmp_path / "ci key\x01 é"  # a blank, a control character, UTF-8
    assert main(["keygen", str(odd)]) == 0
    out = capsys.readouterr().out
    assert "\x01" not in out and "\\x01" in out
    assert [k.name for k in load_keyring(Path(f"{odd}.pub")).keys.values()] == ["ci key_ é"]
    (tmp_path / "blocked.pub").mkdir()  # the public line cannot be installed there
    assert main(["keygen", "--force", str(tmp_path / "blocked")]) == 2
    assert not (tmp_path / "blocked").exists()  # no private key left without its public line


# -- ssh-ed25519 lines without cryptography's SSH module (issue 50 item 7 (c)) --------------------


def _wire_blob(public: object) -> bytes:
    """The SSH wire blob cryptography itself writes for a public key."""
    line = public.public_bytes(  # type: ignore[attr-defined]  # any key type's public half
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return base64.b64decode(line.split()[1])


def _as_before(kind: str, blob_b64: str) -> Ed25519PublicKey:
    """``parse_openssh_public`` as it was, through cryptography's ``load_ssh_public_key``: the
    verdict the small parser must reproduce on every input."""
    if kind != "ssh-ed25519":
        raise ConfigError(f"only ssh-ed25519 keys are supported, got '{safe_text(kind, 40)}'")
    try:
        blob = base64.b64decode(blob_b64, validate=True)
        key = serialization.load_ssh_public_key(f"{kind} {blob_b64}".encode("ascii"))
    except (binascii.Error, ValueError, UnsupportedAlgorithm):
        raise ConfigError("not a valid ssh-ed25519 public key") from None
    if not isinstance(key, Ed25519PublicKey) or _wire_blob(key) != blob:
        raise ConfigError("not a valid ssh-ed25519 public key")
    return key


def _verdict(parse: object, kind: str, blob_b64: str) -> tuple[str, object]:
    try:
        key = parse(kind, blob_b64)  # type: ignore[operator]  # either parser, same call
    except ConfigError as exc:
        return "refused", exc.detail
    return "key", key.public_bytes_raw()


def _sshstr(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _b64(blob: bytes) -> str:
    return base64.b64encode(blob).decode("ascii")


def _ssh_cases() -> list[tuple[str, str]]:
    ed = [Ed25519PrivateKey.generate().public_key() for _ in range(3)]
    valid = _wire_blob(ed[0])
    rsa_blob = _wire_blob(rsa.generate_private_key(65537, 1024).public_key())
    ec_blobs = [
        _wire_blob(ec.generate_private_key(curve).public_key())
        for curve in (ec.SECP256R1(), ec.SECP384R1())
    ]
    sk_blob = _sshstr(b"sk-ssh-ed25519@openssh.com") + valid[15:] + _sshstr(b"ssh:")
    raw = valid[19:]
    blobs = [
        *(_wire_blob(k) for k in ed),
        _sshstr(b"ssh-ed25519") + _sshstr(bytes(32)),
        _sshstr(b"ssh-ed25519") + _sshstr(b"\xff" * 32),
        rsa_blob,
        *ec_blobs,
        sk_blob,
        *(valid[:n] for n in range(len(valid))),  # every truncation, the empty blob included
        valid + b"\x00",
        valid + b"\x00\x00\x00\x00",
        valid + _sshstr(b"comment"),
        _sshstr(b"ssh-ed25519") + _sshstr(raw[:31]),
        _sshstr(b"ssh-ed25519") + _sshstr(raw + b"\x00"),
        _sshstr(b"ssh-ed25519") + struct.pack(">I", 33) + raw,
        _sshstr(b"ssh-ed25519") + struct.pack(">I", 31) + raw,
        _sshstr(b"ssh-rsa") + _sshstr(raw),
        _sshstr(b"ssh-ed25519\x00") + _sshstr(raw),
        struct.pack(">I", 12) + b"ssh-ed25519" + _sshstr(raw),
        _sshstr(b"ssh-ed25519-cert-v01@openssh.com") + _sshstr(raw),
    ]
    cases = [(kind, _b64(b)) for b in blobs for kind in ("ssh-ed25519",)]
    cases += [("ssh-rsa", _b64(rsa_blob)), ("ecdsa-sha2-nistp256", _b64(ec_blobs[0]))]
    cases += [("SSH-ED25519", _b64(valid)), ("", _b64(valid)), ("ssh-ed25519\x00", _b64(valid))]
    text = _b64(valid)
    cases += [
        ("ssh-ed25519", text.rstrip("=")),  # padding missing
        ("ssh-ed25519", text + "="),
        ("ssh-ed25519", text + "=="),
        ("ssh-ed25519", text[:20] + " " + text[20:]),
        ("ssh-ed25519", text[:20] + "\n" + text[20:]),
        ("ssh-ed25519", text.replace("+", "-").replace("/", "_") if "+" in text else text + "-"),
        ("ssh-ed25519", text[:-2] + "é="),
        ("ssh-ed25519", text[:-4] + "===="),
        ("ssh-ed25519", ""),
        ("ssh-ed25519", "AAAA"),
        ("ssh-ed25519", "not-base64!"),
        ("ssh-ed25519", text + "AAAA"),
    ]
    return cases


def test_an_ssh_ed25519_key_is_judged_as_cryptographys_ssh_loader_judged_it() -> None:
    """Every valid key, other key types, truncated, trailing and mislabelled blobs, bad base64:
    the same key or the same refusal, word for word."""
    cases = _ssh_cases()
    outcomes = {_verdict(parse_openssh_public, *case)[0] for case in cases}
    assert outcomes == {"key", "refused"}
    for case in cases:
        assert _verdict(parse_openssh_public, *case) == _verdict(_as_before, *case), case


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=80).map(_b64),
        st.tuples(st.integers(0, 50), st.integers(0, 255)).map(
            lambda edit: _b64(_VALID[: edit[0]] + bytes([edit[1]]) + _VALID[edit[0] + 1 :])
        ),
        st.tuples(st.integers(0, 51), st.binary(min_size=1, max_size=4)).map(
            lambda edit: _b64(_VALID[: edit[0]] + edit[1] + _VALID[edit[0] :])
        ),
        st.text(alphabet=string.ascii_letters + string.digits + "+/=-_ \t", max_size=80),
    )
)
def test_any_blob_is_judged_as_cryptographys_ssh_loader_judged_it(blob_b64: str) -> None:
    assert _verdict(parse_openssh_public, "ssh-ed25519", blob_b64) == _verdict(
        _as_before, "ssh-ed25519", blob_b64
    )


_VALID = _wire_blob(Ed25519PrivateKey.generate().public_key())


def test_a_trusted_keys_file_reads_as_it_did_through_the_ssh_loader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whole files (comments, options, names, allowed_signers lines, revocations by line), and
    each bad line: the same keyring or the same error, with the old parser put back."""
    a, b, c, d, e = (make_signer() for _ in range(5))
    good = "\n".join(
        [
            "# fleet signers",
            "",
            f"name=ci,valid-after=2026-01-01T00:00:00Z {openssh_line(a.public)}",
            openssh_line(b.public, "laptop of bob"),
            f'ci@acme.example namespaces="plancache" {openssh_line(c.public)} comment',
            f"@revoked {openssh_line(d.public)}",
            f"@revoked ci@acme.example {openssh_line(e.public)}",
        ]
    )
    files = [good] + [
        f"{openssh_line(a.public)}\n{line}\n"
        for line in (
            f"ssh-ed25519 {_b64(_wire_blob(a.public) + b'x')} trailing",
            f"ssh-ed25519 {_b64(_wire_blob(a.public)[:-1])} truncated",
            f"name=x ssh-ed25519 {_b64(_wire_blob(a.public)).rstrip('=')}",
            f"bob@x ssh-ed25519 {_b64(_sshstr(b'ssh-rsa') + _sshstr(bytes(32)))}",
            f"@revoked ssh-ed25519 {_b64(bytes(51))}",
            "ssh-ed25519 AAAA",
        )
    ]

    def keyrings() -> list[object]:
        out: list[object] = []
        for text in files:
            try:
                ring = parse_trusted_keys(text, "keys.txt")
            except ConfigError as exc:
                out.append(exc.detail)
                continue
            out.append(
                (
                    sorted(
                        (k.keyid, k.name, k.public.public_bytes_raw(), k.valid_after)
                        for k in ring.keys.values()
                    ),
                    sorted(ring.revoked),
                )
            )
        return out

    now = keyrings()
    assert isinstance(now[0], tuple) and len(now[0][0]) == 3 and len(now[0][1]) == 2, now[0]
    assert all(isinstance(x, str) for x in now[1:]), now
    monkeypatch.setattr(trusted_keys_file, "parse_openssh_public", _as_before)
    monkeypatch.setattr(allowed_signers, "parse_openssh_public", _as_before)
    assert keyrings() == now


def test_ssh_ed25519_lines_need_no_ssh_module() -> None:
    """The reason for the small parser: a trusted-keys file of ssh-ed25519 lines, read at every
    boot, imports neither cryptography's serialization package nor bcrypt."""
    code = (
        "import sys\n"
        "from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys\n"
        f"ring = parse_trusted_keys({openssh_line(_KEY.public, 'ci')!r}, 'keys')\n"
        "assert list(ring.keys) == [" + repr(_KEY.keyid) + "]\n"
        "print(sorted(m for m in ('bcrypt', 'cryptography.hazmat.primitives.serialization', "
        "'cryptography.hazmat.primitives.serialization.ssh') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
