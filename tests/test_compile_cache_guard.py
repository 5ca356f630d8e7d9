"""The guard's load-only-copies rules on a synthetic cache (no vLLM: fast; issue 17).

What vLLM would read is the private copy, so each test asserts on the copy: exactly the
verified bytes whatever happens to the original afterwards, or an empty directory. Then the
writes plancache makes under a root, each against a planted link; quarantine on a cache of its
own mount (a real tmpfs: tests run as root) and when no move is possible; a lock held beyond the
budget; a rollback offered by the store; a store object that fails verification.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from conftest import NOW
from plancache.clock import Deadline
from plancache.pipeline.compile_cache import flows as cc
from plancache.pipeline.compile_cache import load as cl
from plancache.pipeline.compile_cache.local_caches import CacheRoot, verify_cache
from plancache.storage.compile_cache import archives, boot_dirs, cachedir
from plancache.storage.local import directory_lock
from plancache.storage.local.files import write_atomic
from plancache.storage.store import open_store
from plancache.trust.errors import StoreError
from plancache.vllm_plugin.compile_cache import guard_settings
from test_compile_cache import (
    KEYRING,
    SIGNER,
    SUBJECT,
    into,
    root,  # noqa: F401 - a fixture, named as a parameter
    signed,  # noqa: F401 - a fixture, named as a parameter
)


def _files(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def test_load_hands_over_a_private_copy_of_exactly_the_verified_bytes(
    signed: CacheRoot, tmp_path: Path
) -> None:
    directory = signed.directory(SUBJECT)
    model = directory / "rank_0_0" / "model"
    outside = tmp_path / "outside"
    outside.write_bytes(model.read_bytes())
    model.unlink()
    os.link(outside, model)  # a hard link to a file its owner can rewrite at any moment
    before = _files(directory)
    copy = into(signed)
    outcome = cl.guard(signed, SUBJECT, KEYRING, NOW, copy)
    assert outcome.action == "load" and _files(copy) == before
    assert os.stat(copy).st_mode & 0o777 == 0o700
    # nothing shared with the original
    assert all(os.stat(p).st_nlink == 1 for p in copy.rglob("*") if p.is_file())
    with open(outside, "r+b") as f:  # the owner rewrites the shared inode after the check
        f.write(b"PAYLOAD")
    assert _files(copy) == before and _files(directory) != before
    assert verify_cache(signed, SUBJECT, KEYRING, NOW).reason == "digest-mismatch"


def test_a_file_changed_at_the_same_size_is_quarantined_and_nothing_is_handed_over(
    signed: CacheRoot,
) -> None:
    model = signed.directory(SUBJECT) / "rank_0_0" / "model"
    data = model.read_bytes()
    model.unlink()
    model.write_bytes(data[:-1] + b"!")
    copy = into(signed)
    outcome = cl.guard(signed, SUBJECT, KEYRING, NOW, copy)
    assert (outcome.action, outcome.reason) == ("quarantined", "digest-mismatch")
    assert copy.is_dir() and list(copy.iterdir()) == []


def test_vllms_debug_directory_alone_is_no_cache(tmp_path: Path) -> None:
    root = CacheRoot(tmp_path / "vllm")
    debug = root.directory("41179440fa") / "rank_0_0" / "backbone"
    debug.mkdir(parents=True)
    (debug / "computation_graph.py").write_text("# for people\n")
    (debug / "cache_key_factors.json").write_text("{}")
    outcome = cl.guard(root, "41179440fa", KEYRING, NOW, into(root))
    assert (outcome.action, outcome.reason) == ("compile", "no-cache") and debug.exists()
    (debug / "vllm_compile_cache.py").write_text("{}")  # something vLLM reads: a cache, unsigned
    assert cl.guard(root, "41179440fa", KEYRING, NOW, into(root)).reason == "unsigned"


@pytest.fixture
def tmpfs(root: CacheRoot) -> Iterator[Path]:
    """``root``'s ``torch_compile_cache/`` moved onto a tmpfs of its own."""
    mount = root.compile_root
    os.rename(mount, mount.with_name("on-disk"))
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        shutil.copytree(mount.with_name("on-disk"), mount, dirs_exist_ok=True)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_quarantine_stays_on_a_cache_volume_of_its_own(root: CacheRoot, tmpfs: Path) -> None:
    assert cc.sign_cache(root, SUBJECT, SIGNER, NOW).action == "signed"
    (root.directory(SUBJECT) / "inductor_cache" / "planted.py").write_text("x = 1\n")
    outcome = cl.guard(root, SUBJECT, KEYRING, NOW, into(root))
    assert (outcome.action, outcome.reason) == ("quarantined", "digest-mismatch")
    assert (
        Path(outcome.quarantined_to).parent == tmpfs / "torch_aot_compile" / "plancache-quarantine"
    )
    assert (
        os.stat(outcome.quarantined_to).st_dev == os.stat(tmpfs).st_dev
        and not root.quarantine_root.exists()
    )


def test_a_cache_that_cannot_be_moved_aside_is_not_loaded_and_the_boot_goes_on(
    signed: CacheRoot,
) -> None:
    directory = signed.directory(SUBJECT)
    (directory / "inductor_cache" / "planted.py").write_text("x = 1\n")
    signed.quarantine_root.write_text("not a directory")
    (directory.parent / "plancache-quarantine").write_text("not a directory either")
    copy = into(signed)
    outcome = cl.guard(signed, SUBJECT, KEYRING, NOW, copy)
    assert (outcome.action, outcome.reason) == (
        "quarantined",
        "digest-mismatch",
    ) and not outcome.quarantined_to
    assert (
        "not moved aside, not loaded" in outcome.detail
        and list(copy.iterdir()) == []
        and directory.exists()
    )


def test_no_write_follows_a_planted_link(signed: CacheRoot, tmp_path: Path) -> None:
    victim, outside = tmp_path / "victim", tmp_path / "outside"
    victim.write_bytes(b"victim")
    outside.mkdir()
    directory = signed.directory(SUBJECT)
    sidecar = cachedir.sidecar_path(directory)
    sidecar.unlink()
    sidecar.symlink_to(victim)  # the sidecar's name: replaced by the rename, never written through
    assert cc.sign_cache(signed, SUBJECT, SIGNER, NOW).action == "signed"
    assert not sidecar.is_symlink() and victim.read_bytes() == b"victim"
    # the quarantine root: not followed, beside it instead
    signed.quarantine_root.symlink_to(outside)
    (directory / "inductor_cache" / "planted.py").write_text("x = 1\n")
    outcome = cl.guard(signed, SUBJECT, KEYRING, NOW, into(signed))
    assert outcome.action == "quarantined" and list(outside.iterdir()) == []
    assert Path(outcome.quarantined_to).parent == directory.parent / "plancache-quarantine"
    lock = directory.with_name(directory.name + ".plancache.lock")
    lock.unlink()
    lock.symlink_to(victim)  # the lock: refused, so nothing is verified, loaded or signed
    outcome = cl.guard(signed, SUBJECT, KEYRING, NOW, into(signed))
    assert (outcome.action, outcome.reason) == (  # red team: once store-error, the store's blame
        "compile",
        "unsafe-directory",
    ) and victim.read_bytes() == b"victim"
    with pytest.raises(StoreError):
        cc.sign_cache(signed, SUBJECT, SIGNER, NOW)
    (tmp_path / "plans").symlink_to(outside)  # write_atomic: a linked directory is refused
    with pytest.raises(StoreError):
        write_atomic(tmp_path / "plans" / "x.json", b"{}")
    assert boot_dirs.new_boot_dir(tmp_path / "linked-root").path.parent.name == "plancache-private"
    (tmp_path / "root2").mkdir()
    (tmp_path / "root2" / "plancache-private").symlink_to(outside)
    assert (
        not str(boot_dirs.new_boot_dir(tmp_path / "root2").path).startswith(str(outside))
        and list(outside.iterdir()) == []
    )


def test_pull_writes_its_sidecar_through_no_link(signed: CacheRoot, tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    cc.push_cache(store, signed, SUBJECT, KEYRING, NOW)
    fresh = CacheRoot(tmp_path / "fresh")
    victim = tmp_path / "victim"
    victim.write_bytes(b"victim")
    sidecar = cachedir.sidecar_path(fresh.directory(SUBJECT))
    sidecar.parent.mkdir(parents=True)
    for pid in range(os.getpid() - 2, os.getpid() + 3):  # today's predictable temporary names
        sidecar.with_name(f".{fresh.directory(SUBJECT).name}.sig.{pid}.tmp").symlink_to(victim)
    assert cc.pull_cache(store, fresh, SUBJECT, KEYRING, NOW).action == "pulled"
    assert victim.read_bytes() == b"victim" and not sidecar.is_symlink()
    assert verify_cache(fresh, SUBJECT, KEYRING, NOW).action == "verified"


def test_a_lock_held_beyond_the_budget_compiles_instead(signed: CacheRoot) -> None:
    directory = signed.directory(SUBJECT)
    with directory_lock.locked(signed.root, directory):
        fd = os.open(directory.with_name(directory.name + ".plancache.lock"), os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                # a second description conflicts, as a peer's does
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        outcome = cl.guard(signed, SUBJECT, KEYRING, NOW, into(signed), wait=0.2)
    assert (outcome.action, outcome.reason) == ("compile", "timeout")
    assert cl.guard(signed, SUBJECT, KEYRING, NOW, into(signed), wait=0.2).action == "load"


def test_a_pull_never_rolls_back_a_newer_local_cache(signed: CacheRoot, tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    older = CacheRoot(tmp_path / "older")
    (older.directory(SUBJECT) / "rank_0_0").mkdir(parents=True)
    (older.directory(SUBJECT) / "rank_0_0" / "model").write_bytes(b"an older compile")
    cc.sign_cache(older, SUBJECT, SIGNER, NOW - timedelta(days=3), expires_in=timedelta(days=30))
    # a bucket writer puts the older signed cache back
    cc.push_cache(store, older, SUBJECT, KEYRING, NOW)
    before = _files(signed.directory(SUBJECT))
    outcome = cc.pull_cache(store, signed, SUBJECT, KEYRING, NOW)
    assert outcome.action == "kept" and "not replaced by an older one" in outcome.detail
    assert _files(signed.directory(SUBJECT)) == before and not signed.quarantine_root.exists()
    newer = CacheRoot(tmp_path / "newer")  # a node holding the older one takes a newer one
    older_copy = cc.pull_cache(store, newer, SUBJECT, KEYRING, NOW)
    assert older_copy.action == "pulled"
    cc.push_cache(store, signed, SUBJECT, KEYRING, NOW)
    assert (
        cc.pull_cache(store, newer, SUBJECT, KEYRING, NOW + timedelta(hours=1)).action == "pulled"
    )


def test_a_rejected_store_object_has_its_own_reason(signed: CacheRoot, tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    cc.push_cache(store, signed, SUBJECT, KEYRING, NOW)
    archive = tmp_path / "store" / archives.archive_name(SUBJECT)
    archive.write_bytes(archive.read_bytes().replace(b"x = 1", b"x = 9"))
    empty = CacheRoot(tmp_path / "empty")
    outcome = cl.guard(
        empty, SUBJECT, KEYRING, NOW, into(empty), fetch=lambda: (store, Deadline.after(30))
    )
    assert (outcome.action, outcome.reason) == (
        "compile",
        "store-rejected",
    ) and "digest-mismatch" in outcome.detail
    nothing = open_store(f"file://{tmp_path}/nothing")
    (tmp_path / "nothing").mkdir()
    outcome = cl.guard(
        empty, SUBJECT, KEYRING, NOW, into(empty), fetch=lambda: (nothing, Deadline.after(30))
    )
    assert (outcome.action, outcome.reason) == ("compile", "no-cache")


def test_the_plugins_expiry_setting_parses_as_expires_in() -> None:
    assert guard_settings._expiry("30d") == (timedelta(days=30), "")
    # unset: no expiry; set but empty: tests/test_small_robustness.py
    assert guard_settings._expiry(None) == (None, "")
    value, problem = guard_settings._expiry("soon")
    assert value is None and problem.startswith("PLANCACHE_COMPILE_CACHE_EXPIRES_IN:")


def _fresh_root_in_a_worker(cache_root: str, roots: object) -> None:
    """A worker's boot directory, closed at exit the way the plugin closes it."""
    boot = boot_dirs.new_boot_dir(Path(cache_root))
    boot.close_at_exit()
    roots.put(str(boot.root))  # type: ignore[attr-defined]  # a Queue


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_worker_multiprocessing_starts_removes_its_fresh_root_at_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """vLLM's workers are ``multiprocessing`` processes; a forked one ends in ``os._exit``,
    which runs no ``atexit`` hook: its fresh root (the header inside it) stayed in the
    temporary directory until the next boot's sweep (the first cut)."""
    import multiprocessing

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # its plancache-private refused: a fresh root in TMPDIR
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o700)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr("tempfile.tempdir", None)
    context = multiprocessing.get_context(method)
    roots = context.Queue()
    worker = context.Process(target=_fresh_root_in_a_worker, args=(str(shared / "vc"), roots))
    worker.start()
    root = roots.get(timeout=60)
    worker.join(60)
    assert worker.exitcode == 0 and Path(root).parent == tmp
    assert not Path(root).exists(), os.listdir(tmp)


def test_a_forked_worker_names_its_temporaries_by_its_own_boot_directory(tmp_path: Path) -> None:
    """A header's temporary names the boot directory of the process writing it, so a sweep
    removes only a dead boot's (:func:`plancache.storage.local.dirfds.temp_name`). The name comes
    from the plugin's per-boot state, which a fork renews (``os.register_at_fork``): a worker
    forked from a process that has a boot directory names none until it has its own, then its
    own, never its parent's. With a module global set once in the parent (the first cut), the
    child wrote the parent's name: a dead worker's leftovers looked alive while the parent ran."""
    import gzip
    import json

    from plancache.storage.compile_cache import header_files
    from plancache.storage.local import dirfds
    from plancache.vllm_plugin import plugin_state

    root = tmp_path / "root"
    headers = tmp_path / "headers"
    root.mkdir()
    headers.mkdir()
    stream = gzip.compress(b"h" * 64)

    def temporary() -> str:
        """A header written as the fetch writes it, named by this process's boot (asked of the
        boot's state as boot_headers asks it)."""
        fd = os.open(headers, os.O_RDONLY | os.O_DIRECTORY)
        try:
            owner = plugin_state.current().place.temp_owner()
            tmp, _ = header_files.Inflater(stream).write_into(fd, "c1.h.gch", 64, owner=owner)
        finally:
            os.close(fd)
        return dirfds.temp_owner(tmp)

    state = plugin_state.start_boot()
    try:
        state.place.boot = boot_dirs.new_boot_dir(root)
        parent = state.place.boot.path.name
        assert temporary() == parent
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker: a real fork, its state renewed by the plugin's fork hook
            try:
                before = temporary()
                place = plugin_state.current().place
                place.boot = boot_dirs.new_boot_dir(root)
                seen = [before, temporary(), place.boot.path.name]
                os.write(write, json.dumps(seen).encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            before, after, own = json.loads(pipe.read())
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert before == "" and after == own and own != parent and own.startswith("boot-")
        assert temporary() == parent  # the parent's own boot is untouched by the child's
        with pytest.raises(ValueError):
            dirfds.temp_name("c1.h.gch", "../../etc")
    finally:
        if state.place.boot is not None:
            state.place.boot.close()
        plugin_state.start_boot()
