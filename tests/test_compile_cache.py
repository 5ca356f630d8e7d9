"""The compile-cache manifest, walker, archive and flows on a synthetic cache (no vLLM: fast).

The real-compile-path tests, with payloads, are in test_compile_cache_vllm.py; these cover each
rule on its own: the closed world, the verify order, hostile archives, the store round trip.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from conftest import NOW, keyring_of, make_signer
from plancache.cli.main import main
from plancache.pipeline.compile_cache import flows as cc
from plancache.pipeline.compile_cache import load as cl
from plancache.pipeline.compile_cache.local_caches import CacheRoot, verify_cache
from plancache.storage.compile_cache import archive_format, archives, cachedir
from plancache.storage.store import open_store
from plancache.trust.compile_cache import manifest as mf
from plancache.trust.compile_cache.manifest_signature import verify_manifest
from plancache.trust.errors import Reason, Rejected

SUBJECT = "torch_aot_compile/" + "ab" * 32


@pytest.fixture
def root(tmp_path: Path) -> CacheRoot:
    """A cache shaped like vLLM's AOT layout, signed by ``signer``."""
    d = tmp_path / "vllm" / "torch_compile_cache" / SUBJECT
    (d / "rank_0_0").mkdir(parents=True)
    (d / "rank_0_0" / "model").write_bytes(b"\x80\x04model-pickle" * 100)
    (d / "inductor_cache" / "aotautograd" / "akey").mkdir(parents=True)
    (d / "inductor_cache" / "aotautograd" / "akey" / "entry").write_bytes(b"entry")
    (d / "inductor_cache" / "bn").mkdir()
    (d / "inductor_cache" / "bn" / "cbn.py").write_text("x = 1\n")
    (d / "inductor_cache" / "locks").mkdir()
    (d / "inductor_cache" / "locks" / "cbn.lock").write_bytes(b"")
    return CacheRoot(tmp_path / "vllm")


def into(root: CacheRoot) -> Path:
    """A fresh path for the guard's private copy (beside the root, as the plugin's boot dir is)."""
    return root.root.parent / f"private-{len(os.listdir(root.root.parent))}"


SIGNER = make_signer()
KEYRING = keyring_of(SIGNER)


@pytest.fixture
def signed(root: CacheRoot) -> CacheRoot:
    assert cc.sign_cache(root, SUBJECT, SIGNER, NOW).action == "signed"
    return root


def test_signed_cache_verifies_and_binds_every_file(signed: CacheRoot) -> None:
    outcome = verify_cache(signed, SUBJECT, KEYRING, NOW)
    assert outcome.action == "verified" and outcome.files == 4
    sig = cachedir.sidecar_path(signed.directory(SUBJECT)).read_bytes()
    m = verify_manifest(SUBJECT, sig, KEYRING, NOW).manifest
    assert [f.path for f in m.files] == [
        "inductor_cache/aotautograd/akey/entry",
        "inductor_cache/bn/cbn.py",
        "inductor_cache/locks/cbn.lock",
        "rank_0_0/model",
    ]
    assert "inductor_cache/aotautograd/akey" in m.dirs


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        (lambda d: (d / "inductor_cache" / "triton").mkdir(), "digest-mismatch"),
        (
            lambda d: (d / "inductor_cache" / "aotautograd" / "akey" / "zz").write_bytes(b"x"),
            "digest-mismatch",
        ),
        (lambda d: (d / "inductor_cache" / "fxgraph").mkdir(), "digest-mismatch"),
        (
            lambda d: (d / "inductor_cache" / "bn" / "cbn.py").write_text("x = 2\n"),
            "digest-mismatch",
        ),
        (lambda d: (d / "rank_0_0" / "model").unlink(), "digest-mismatch"),
        (lambda d: os.mkfifo(d / "inductor_cache" / "bn" / "fifo"), "malformed"),
        (lambda d: (d / "inductor_cache" / "bn" / "link").symlink_to("/etc/passwd"), "malformed"),
        (lambda d: cachedir.sidecar_path(d).unlink(), "unsigned"),
        (
            lambda d: cachedir.sidecar_path(d).write_bytes(
                cachedir.sidecar_path(d).read_bytes().replace(b'"sig":"', b'"sig":"A', 1)
            ),
            "malformed",
        ),
    ],
)
def test_guard_quarantines_every_deviation(signed: CacheRoot, tamper, reason: str) -> None:
    directory = signed.directory(SUBJECT)
    tamper(directory)
    outcome = cl.guard(signed, SUBJECT, KEYRING, NOW, into(signed))
    assert (outcome.action, outcome.reason) == ("quarantined", reason), outcome
    assert not directory.exists() and not cachedir.sidecar_path(directory).exists()
    assert (
        Path(outcome.quarantined_to).parent == signed.quarantine_root
        and Path(outcome.quarantined_to).is_dir()
    )


def test_guard_accepts_verified_and_leaves_an_empty_cache_alone(
    signed: CacheRoot, tmp_path: Path
) -> None:
    assert cl.guard(signed, SUBJECT, KEYRING, NOW, into(signed)).action == "load"
    empty = CacheRoot(tmp_path / "empty")
    # what vLLM creates before it looks
    (empty.directory(SUBJECT) / "inductor_cache").mkdir(parents=True)
    assert cl.guard(empty, SUBJECT, KEYRING, NOW, into(empty)).reason == "no-cache"


def test_other_keys_wrong_name_and_unusable_keys_are_refused(signed: CacheRoot) -> None:
    assert verify_cache(signed, SUBJECT, keyring_of(make_signer()), NOW).reason == "untrusted-key"
    sig = cachedir.sidecar_path(signed.directory(SUBJECT)).read_bytes()
    with pytest.raises(Rejected) as info:
        verify_manifest("torch_aot_compile/" + "cd" * 32, sig, KEYRING, NOW)
    assert info.value.reason is Reason.NAME_MISMATCH
    with pytest.raises(Rejected) as info:
        verify_manifest(SUBJECT, sig, KEYRING, NOW - timedelta(days=1))
    assert info.value.reason is Reason.NOT_YET_VALID
    outcome = cl.guard(signed, SUBJECT, None, NOW, into(signed), problem="keys file missing")
    assert (outcome.action, outcome.reason) == ("quarantined", "config-error")


@pytest.mark.parametrize(
    "path", ["../x", "/abs", "a/../b", "a//b", ".hidden", "a\\b", "a/\x00", ""]
)
def test_manifest_paths_are_plain_relative_names(path: str) -> None:
    with pytest.raises(Rejected):
        mf.check_relpath(path)


def test_manifest_needs_listed_parents_and_sorted_entries() -> None:
    entry = mf.FileEntry("a/b", 1, "0" * 64)
    base = mf.Manifest(SUBJECT, (entry,), ("a",), "0" * 64, 10, NOW)
    mf.check_manifest(base)
    for bad in (
        replace(base, dirs=()),
        replace(base, files=(entry, entry)),
        replace(base, subject="x" * 64),
    ):
        with pytest.raises(Rejected):
            mf.check_manifest(bad)


def test_walk_caps_the_directory(root: CacheRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cachedir, "MAX_FILE_BYTES", 100)
    with pytest.raises(Rejected) as info:
        cachedir.walk(root.directory(SUBJECT))
    assert info.value.reason is Reason.TOO_LARGE
    monkeypatch.setattr(cachedir, "MAX_FILE_BYTES", 2**30)
    monkeypatch.setattr(cachedir, "MAX_FILES", 2)
    with pytest.raises(Rejected):
        cachedir.walk(root.directory(SUBJECT))


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


def _member(
    name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"x", target: str = ""
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, len(data) if kind == tarfile.REGTYPE else 0, target
    return info, data


@pytest.mark.parametrize(
    "members",
    [
        [_member("a", tarfile.SYMTYPE, target="/etc/passwd")],
        [_member("a", tarfile.LNKTYPE, target="/etc/passwd")],
        [_member("../a")],
        [_member("/tmp/a")],
        [_member("a", tarfile.CHRTYPE)],
        [_member("a", tarfile.FIFOTYPE)],
        [_member("a", data=b"xx")],
        [_member("a"), _member("b")],
        [],
    ],
)
def test_extraction_takes_only_the_signed_regular_files(tmp_path: Path, members: list) -> None:
    manifest = mf.Manifest(SUBJECT, (mf.FileEntry("a", 1, "0" * 64),), (), "0" * 64, 1, NOW)
    with pytest.raises(Rejected):
        archive_format.extract_archive(_tar(*members), manifest, tmp_path / "dest")
    assert not (tmp_path / "a").exists() and not Path("/tmp/a").exists()


def test_push_pull_round_trip_and_a_tampered_archive(signed: CacheRoot, tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    assert cc.push_cache(store, signed, SUBJECT, KEYRING, NOW).action == "pushed"
    assert archives.list_subjects(store) == [SUBJECT]
    fresh = CacheRoot(tmp_path / "fresh")
    assert cc.pull_cache(store, fresh, SUBJECT, KEYRING, NOW).action == "pulled"
    assert verify_cache(fresh, SUBJECT, KEYRING, NOW).action == "verified"
    archive = tmp_path / "store" / archives.archive_name(SUBJECT)
    data = archive.read_bytes()
    archive.write_bytes(data.replace(b"x = 1", b"x = 9"))
    other = CacheRoot(tmp_path / "other")
    with pytest.raises(Rejected) as info:
        cc.pull_cache(store, other, SUBJECT, KEYRING, NOW)
    assert (
        info.value.reason is Reason.DIGEST_MISMATCH and not other.compile_root.exists()
    ) or not any(other.compile_root.rglob("*.py"))
    with pytest.raises(Rejected) as info:
        cc.pull_cache(store, other, SUBJECT, keyring_of(make_signer()), NOW)
    assert info.value.reason is Reason.UNTRUSTED_KEY


def test_pull_replaces_vllms_empty_dirs_silently_and_quarantines_anything_else(
    signed: CacheRoot, tmp_path: Path
) -> None:
    store = open_store(f"file://{tmp_path}/store")
    cc.push_cache(store, signed, SUBJECT, KEYRING, NOW)
    empty, stray = CacheRoot(tmp_path / "empty"), CacheRoot(tmp_path / "stray")
    # what vLLM creates before its first read
    (empty.directory(SUBJECT) / "inductor_cache").mkdir(parents=True)
    (stray.directory(SUBJECT) / "inductor_cache").mkdir(parents=True)
    (stray.directory(SUBJECT) / "inductor_cache" / "planted.py").write_text("x = 1\n")
    for root in (empty, stray):
        assert cc.pull_cache(store, root, SUBJECT, KEYRING, NOW).action == "pulled"
        assert verify_cache(root, SUBJECT, KEYRING, NOW).action == "verified"
    assert not empty.quarantine_root.exists()
    assert [p.name.endswith("-replaced-by-pull") for p in stray.quarantine_root.iterdir()] == [True]


def test_cli_sign_verify_ls_json_and_exit_codes(
    root: CacheRoot, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keygen", str(tmp_path / "k")]) == 0
    capsys.readouterr()
    assert (
        main(
            [
                "compile-cache",
                "verify",
                "--json",
                "--trusted-keys",
                str(tmp_path / "k.pub"),
                str(root.root),
            ]
        )
        == 1
    )
    assert json.loads(capsys.readouterr().out)["caches"][0]["reason"] == "unsigned"
    assert (
        main(["compile-cache", "sign", "--json", "--key", str(tmp_path / "k"), str(root.root)]) == 0
    )
    assert json.loads(capsys.readouterr().out)["caches"][0]["action"] == "signed"
    assert (
        main(
            [
                "compile-cache",
                "verify",
                "--json",
                "--trusted-keys",
                str(tmp_path / "k.pub"),
                str(root.root),
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["caches"][0]["files"] == 4
    assert main(["compile-cache", "ls", "--json", str(root.root)]) == 0
    assert json.loads(capsys.readouterr().out)["caches"][0]["action"] == "unverified"
    # no trusted keys: one line, exit 2
    assert main(["compile-cache", "verify", str(root.root)]) == 2
    assert "no trusted keys" in capsys.readouterr().err
