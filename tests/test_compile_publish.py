"""A build node signs what it compiled, and nothing stray blocks a cache (issue 39 items 1 and 7).

No vLLM: a private copy is laid out as vLLM writes one (``rank_0_0/model``, ``inductor_cache/…``)
in a 0700 directory, and ``publish_cache`` runs on it for real, with a real second thread as the
local writer who renames a same-size pickle into the shared ``rank_0_0/model``. The signature
must cover the private bytes only; vLLM's debug files in the shared ``<10 hex>`` directory are
never signed and never block a verified load; a sidecar without its cache is moved aside and the
cache pulled, compiled or published as if missing; a killed pull's or publish's staging directory
is swept by the next one of the same subject, another subject's left alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest

from conftest import NOW
from plancache.cli.main import main
from plancache.clock import Deadline
from plancache.pipeline.compile_cache import flows as cc
from plancache.pipeline.compile_cache import load as cl
from plancache.pipeline.compile_cache.local_caches import CacheRoot, verify_cache
from plancache.storage.compile_cache import archive_format, cachedir
from plancache.storage.store import open_store
from plancache.trust.compile_cache import manifest as mf
from plancache.trust.compile_cache.manifest_signature import sign_manifest, verify_manifest
from plancache.trust.errors import PlanCacheError
from test_compile_cache import (
    KEYRING,
    SIGNER,
    SUBJECT,
    into,
    root,  # noqa: F401 - a fixture, named as a parameter
    signed,  # noqa: F401 - a fixture, named as a parameter
)

MODEL = b"\x80\x04compiled-by-this-boot" * 200
PLANTED = b"\x80\x04planted-by-a-writer!!" * 200
SHORT = "0123456789"
FACTORS = {"config_hash": "abcdef0123", "code_hash": "1" * 64}
assert len(MODEL) == len(PLANTED)


def private_copy(tmp_path: Path, name: str = "boot") -> Path:
    """What vLLM compiled into the guard's empty private copy (this process's, mode 0700)."""
    private = tmp_path / name
    private.mkdir(mode=0o700)
    (private / "rank_0_0").mkdir()
    (private / "rank_0_0" / "model").write_bytes(MODEL)
    (private / "inductor_cache" / "bn").mkdir(parents=True)
    for i in range(30):
        (private / "inductor_cache" / "bn" / f"c{i:02}.py").write_bytes(b"x = %d\n" % i * 200)
    return private


def signed_manifest(root: CacheRoot, subject: str) -> mf.Manifest:
    sig = cachedir.sidecar_path(root.directory(subject)).read_bytes()
    return verify_manifest(subject, sig, KEYRING, NOW).manifest


def digest_of(manifest: mf.Manifest, path: str) -> str:
    return next(f.sha256 for f in manifest.files if f.path == path)


def quarantined(root: CacheRoot) -> list[str]:
    return sorted(os.listdir(root.quarantine_root)) if root.quarantine_root.exists() else []


def test_a_writer_racing_the_publish_never_gets_its_bytes_signed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real thread renames a same-size pickle into the shared ``rank_0_0/model`` as soon as that
    directory exists, in a loop; the publish's every hash waits until it did so once. The old
    publish copied into the shared directory and hashed there: it signed the planted bytes."""
    root = CacheRoot(tmp_path / "vllm")
    directory = root.directory(SUBJECT)
    private = private_copy(tmp_path)
    stop, planted = threading.Event(), threading.Event()

    def writer() -> None:
        n = 0
        while not stop.is_set():
            if not (directory / "rank_0_0").is_dir():
                time.sleep(0.0005)
                continue
            spare = tmp_path / f"spare-{n}"
            spare.write_bytes(PLANTED)
            try:
                os.rename(spare, directory / "rank_0_0" / "model")
                planted.set()
            except OSError:
                spare.unlink(missing_ok=True)
            n += 1

    real_digests = cachedir.digests

    def digests(where: Path, listing: dict[str, int | None]) -> dict[str, str]:
        # the shared directory exists: let the writer in first
        if (directory / "rank_0_0").is_dir():
            planted.wait(10)
        return real_digests(where, listing)

    monkeypatch.setattr(cachedir, "digests", digests)
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        try:
            outcome = cc.publish_cache(root, SUBJECT, private, SIGNER, NOW)
        except PlanCacheError:  # the writer got in the way of the install: nothing signed, fine
            outcome = None
        assert planted.wait(10)
    finally:
        stop.set()
        thread.join()
    monkeypatch.setattr(cachedir, "digests", real_digests)
    assert outcome is not None and outcome.action == "signed", outcome
    manifest = signed_manifest(root, SUBJECT)
    assert digest_of(manifest, "rank_0_0/model") == hashlib.sha256(MODEL).hexdigest()
    assert hashlib.sha256(PLANTED).hexdigest() not in {f.sha256 for f in manifest.files}
    # the writer's last word, unsigned
    assert (directory / "rank_0_0" / "model").read_bytes() == PLANTED
    assert verify_cache(root, SUBJECT, KEYRING, NOW).reason == "digest-mismatch"
    copy = into(root)
    guarded = cl.guard(root, SUBJECT, KEYRING, NOW, copy)
    assert (guarded.action, guarded.reason) == ("quarantined", "digest-mismatch") and list(
        copy.iterdir()
    ) == []


def test_bytes_planted_before_the_install_are_moved_aside_not_signed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer plants while the publish hashes (after its ``kept`` check): the old publish
    hashed the shared directory and signed the planted pickle; now the planted directory is
    moved aside and the private bytes installed in its place."""
    root = CacheRoot(tmp_path / "vllm")
    directory = root.directory(SUBJECT)
    private = private_copy(tmp_path)
    real_digests = cachedir.digests

    def digests(where: Path, listing: dict[str, int | None]) -> dict[str, str]:
        (directory / "rank_0_0").mkdir(parents=True, exist_ok=True)
        (tmp_path / "spare").write_bytes(PLANTED)
        os.rename(tmp_path / "spare", directory / "rank_0_0" / "model")
        return real_digests(where, listing)

    monkeypatch.setattr(cachedir, "digests", digests)
    outcome = cc.publish_cache(root, SUBJECT, private, SIGNER, NOW)
    monkeypatch.setattr(cachedir, "digests", real_digests)
    assert outcome.action == "signed", outcome
    assert (
        digest_of(signed_manifest(root, SUBJECT), "rank_0_0/model")
        == hashlib.sha256(MODEL).hexdigest()
    )
    assert (directory / "rank_0_0" / "model").read_bytes() == MODEL
    assert verify_cache(root, SUBJECT, KEYRING, NOW).action == "verified"
    (aside,) = quarantined(root)
    assert aside.endswith("-replaced-by-publish")
    assert (root.quarantine_root / aside / "rank_0_0" / "model").read_bytes() == PLANTED
    copy = into(root)
    assert cl.guard(root, SUBJECT, KEYRING, NOW, copy).action == "load"
    assert (copy / "rank_0_0" / "model").read_bytes() == MODEL


def _debug_files(directory: Path, text: str) -> Path:
    debug = directory / "rank_0_0" / "backbone"
    debug.mkdir(parents=True, exist_ok=True)
    (debug / "computation_graph.py").write_text(f"# {text}\n")
    (debug / "cache_key_factors.json").write_text(json.dumps({**FACTORS, "note": text}))
    return debug


def test_vllms_debug_files_are_not_signed_and_never_block_a_verified_load(tmp_path: Path) -> None:
    root = CacheRoot(tmp_path / "vllm")
    directory = root.directory(SHORT)
    _debug_files(directory, "written by vLLM into the shared directory")
    private = tmp_path / "boot"
    (private / "rank_0_0" / "backbone").mkdir(parents=True, mode=0o700)
    (private / "rank_0_0" / "backbone" / "vllm_compile_cache.py").write_text(
        "{('a', 0): 'artifact'}\n"
    )
    (private / "rank_0_0" / "inductor_cache").mkdir()
    (private / "rank_0_0" / "inductor_cache" / "k.py").write_text("x = 1\n")
    outcome = cc.publish_cache(root, SHORT, private, SIGNER, NOW, key_factors=FACTORS)
    # issue 40: the digests in the clear, keyed under this salt
    salt = (outcome.key_factors or {}).get("hmac_salt")
    assert outcome.action == "signed" and outcome.key_factors == {**FACTORS, "hmac_salt": salt}, (
        outcome
    )
    manifest = signed_manifest(root, SHORT)
    assert [f.path for f in manifest.files] == [
        "rank_0_0/backbone/vllm_compile_cache.py",
        "rank_0_0/inductor_cache/k.py",
    ]
    assert quarantined(root) == []  # vLLM's leftovers were removed, not kept as evidence
    debug = _debug_files(directory, "rewritten at the next boot, other content")
    assert verify_cache(root, SHORT, KEYRING, NOW).action == "verified"
    copy = into(root)
    assert cl.guard(root, SHORT, KEYRING, NOW, copy).action == "load"
    assert sorted(p.name for p in copy.rglob("*") if p.is_file()) == [
        "k.py",
        "vllm_compile_cache.py",
    ]
    (debug / "computation_graph.py").unlink()
    # a debug file's name grants nothing else
    (debug / "computation_graph.py").symlink_to("/etc/hostname")
    assert verify_cache(root, SHORT, KEYRING, NOW).reason == "malformed"
    (debug / "computation_graph.py").unlink()

    # a node that holds only vLLM's debug dump pulls it in place
    store = open_store(f"file://{tmp_path}/store")
    assert cc.push_cache(store, root, SHORT, KEYRING, NOW).action == "pushed"
    fresh = CacheRoot(tmp_path / "fresh")
    _debug_files(fresh.directory(SHORT), "a serving node's")
    assert cc.pull_cache(store, fresh, SHORT, KEYRING, NOW).action == "pulled"
    assert (
        quarantined(fresh) == [] and verify_cache(fresh, SHORT, KEYRING, NOW).action == "verified"
    )

    old = CacheRoot(tmp_path / "old")  # an old-style signature lists the debug files: still checked
    old_dir = old.directory(SHORT)
    old_dir.parent.mkdir(parents=True)
    os.rename(private, old_dir)
    _debug_files(old_dir, "signed along by an older plancache")
    # what an older build_manifest signed: every file, vLLM's debug files too
    listing = cachedir.walk(old_dir)
    sums = cachedir.digests(old_dir, listing)
    files = tuple(mf.FileEntry(p, n, sums[p]) for p, n in sorted(listing.items()) if n is not None)
    dirs = tuple(sorted(p for p, n in listing.items() if n is None))
    data = archive_format.archive_bytes(old_dir, files, dirs)
    older = mf.Manifest(SHORT, files, dirs, hashlib.sha256(data).hexdigest(), len(data), NOW)
    cachedir.sidecar_path(old_dir).write_bytes(sign_manifest(older, SIGNER))
    assert "rank_0_0/backbone/computation_graph.py" in {
        f.path for f in signed_manifest(old, SHORT).files
    }
    _debug_files(old_dir, "signed along by an older plancache, changed")
    outcome = cl.guard(old, SHORT, KEYRING, NOW, into(old))
    assert (outcome.action, outcome.reason) == ("quarantined", "digest-mismatch"), outcome


def _half_quarantined(root: CacheRoot, keep_empty: bool = False) -> Path:
    """The directory renamed aside, its sidecar not (a quarantine killed between its renames)."""
    directory = root.directory(SUBJECT)
    os.rename(directory, root.root / f"moved-by-hand-{len(os.listdir(root.root))}")
    if keep_empty:
        (directory / "inductor_cache").mkdir(parents=True)  # what vLLM creates before it looks
    return cachedir.sidecar_path(directory)


def test_a_signature_without_its_cache_is_moved_aside_and_the_cache_pulled(
    signed: CacheRoot, tmp_path: Path
) -> None:
    store = open_store(f"file://{tmp_path}/store")
    assert cc.push_cache(store, signed, SUBJECT, KEYRING, NOW).action == "pushed"
    sidecar = _half_quarantined(signed)
    copy = into(signed)
    outcome = cl.guard(
        signed, SUBJECT, KEYRING, NOW, copy, fetch=lambda: (store, Deadline.after(30))
    )
    assert (outcome.action, outcome.reason) == ("load", ""), outcome
    assert (
        "a signature without its cache moved aside" in outcome.detail
        and "store: pulled" in outcome.detail
    )
    assert (copy / "rank_0_0" / "model").is_file()
    (aside,) = quarantined(signed)
    assert (
        aside.endswith(f"{SUBJECT.rpartition('/')[2]}-lone-sidecar.plancache.sig")
        and (signed.quarantine_root / aside).is_file()
    )

    os.rename(signed.directory(SUBJECT), tmp_path / "gone")  # no store: compile, saying why
    outcome = cl.guard(signed, SUBJECT, KEYRING, NOW, into(signed))
    assert (outcome.action, outcome.reason) == (
        "compile",
        "no-cache",
    ) and "moved aside" in outcome.detail, outcome
    assert not sidecar.exists() and len(quarantined(signed)) == 2

    cc.pull_cache(store, signed, SUBJECT, KEYRING, NOW)
    _half_quarantined(signed, keep_empty=True)  # beside vLLM's empty directories: the same
    outcome = cl.guard(signed, SUBJECT, KEYRING, NOW, into(signed))
    assert (outcome.action, outcome.reason) == (
        "compile",
        "no-cache",
    ) and "moved aside" in outcome.detail, outcome
    # the directory and its sidecar
    assert not signed.directory(SUBJECT).exists() and len(quarantined(signed)) == 4


def test_the_cli_pulls_and_a_build_node_publishes_over_a_lone_sidecar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = CacheRoot(tmp_path / "vllm")
    private = private_copy(tmp_path)
    assert main(["keygen", str(tmp_path / "k")]) == 0
    (root.directory(SUBJECT)).parent.mkdir(parents=True)
    os.rename(private, root.directory(SUBJECT))
    url = f"file://{tmp_path}/store"
    assert (
        main(
            [
                "compile-cache",
                "sign",
                "--key",
                str(tmp_path / "k"),
                "--cache",
                SUBJECT,
                str(root.root),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "compile-cache",
                "push",
                "--key",
                str(tmp_path / "k"),
                "--cache",
                SUBJECT,
                str(root.root),
                url,
            ]
        )
        == 0
    )
    capsys.readouterr()
    sidecar = _half_quarantined(root)
    code = main(
        [
            "compile-cache",
            "pull",
            "--json",
            "--trusted-keys",
            str(tmp_path / "k.pub"),
            "--cache",
            SUBJECT,
            url,
            str(root.root),
        ]
    )
    (row,) = json.loads(capsys.readouterr().out)["caches"]
    assert (
        code == 0
        and row["action"] == "pulled"
        and "a signature without its cache moved aside" in row["detail"]
    ), row
    assert (
        len(quarantined(root)) == 1
        and sidecar.is_file()
        and (root.directory(SUBJECT) / "rank_0_0" / "model").is_file()
    )

    os.rename(root.directory(SUBJECT), tmp_path / "gone")  # a build node: published, not "kept"
    outcome = cc.publish_cache(root, SUBJECT, private_copy(tmp_path, "boot2"), SIGNER, NOW)
    assert outcome.action == "signed" and "moved aside" in outcome.detail, outcome
    assert (
        len(quarantined(root)) == 2
        and verify_cache(root, SUBJECT, KEYRING, NOW).action == "verified"
    )


def test_leftover_staging_of_this_subject_is_swept_another_subjects_left_alone(
    signed: CacheRoot, tmp_path: Path
) -> None:
    store = open_store(f"file://{tmp_path}/store")
    assert cc.push_cache(store, signed, SUBJECT, KEYRING, NOW).action == "pushed"
    fresh = CacheRoot(tmp_path / "fresh")
    directory = fresh.directory(SUBJECT)
    other = "torch_aot_compile/" + "ef" * 32
    mine = [
        f".plancache-pull-{directory.name}-killed1",
        f".plancache-publish-{directory.name}-killed2",
    ]
    theirs = f".plancache-pull-{'ef' * 32}-inuse"
    for name in [*mine, theirs]:
        (directory.parent / name / "x" / "rank_0_0").mkdir(parents=True)
        (directory.parent / name / "x" / "rank_0_0" / "model").write_bytes(b"half extracted")
    assert cc.pull_cache(store, fresh, SUBJECT, KEYRING, NOW).action == "pulled"
    assert sorted(os.listdir(directory.parent)) == sorted(
        [
            theirs,
            directory.name,
            f"{directory.name}.plancache.lock",
            f"{directory.name}.plancache.sig",
        ]
    )
    assert (
        fresh.subjects() == [SUBJECT]
        and verify_cache(fresh, SUBJECT, KEYRING, NOW).action == "verified"
    )

    # a killed publish of the same subject, before the next publish
    (directory.parent / mine[1]).mkdir()
    os.rename(directory, tmp_path / "gone")
    cachedir.sidecar_path(directory).unlink()
    assert cc.publish_cache(fresh, SUBJECT, private_copy(tmp_path), SIGNER, NOW).action == "signed"
    assert not (directory.parent / mine[1]).exists() and (directory.parent / theirs).is_dir()
    assert (
        cc.publish_cache(fresh, other, private_copy(tmp_path, "boot2"), SIGNER, NOW).action
        == "signed"
    )
    # swept in its turn, by a publish of its own subject
    assert not (directory.parent / theirs).exists()
