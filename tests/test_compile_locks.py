"""The node lock of a compile cache: every wait bounded, a lock never taken unsafely (no vLLM:
fast).

Real parts throughout: the holder is another process holding ``flock``, the foreign user is
uid 1000 through a setuid child, the read-only filesystem a read-only bind mount. Each case
stops with a clear reason (``timeout``, ``unsafe-directory``, ``lock-unavailable``,
``local-error``) and nothing is signed, pulled or published unlocked; only reading a cache on a
read-only filesystem goes on without a lock (nobody can write there through that mount).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import NOW, keyring_of, make_signer
from plancache.cli.main import main
from plancache.pipeline.compile_cache import flows as cc
from plancache.pipeline.compile_cache import load as cl
from plancache.pipeline.compile_cache.local_caches import CacheRoot
from plancache.storage.compile_cache import cachedir
from plancache.storage.local import directory_lock
from plancache.storage.store import open_store
from plancache.trust.errors import Reason, StoreError, StoreTimeout
from plancache.vllm_plugin.compile_cache import publish as compile_publish

SUBJECT = "torch_aot_compile/" + "ef" * 32
SIGNER = make_signer()
KEYRING = keyring_of(SIGNER)
SLACK = 20.0
"""Generous: the machine is shared; the point is a bounded wait, not a fast one."""
HOLD = (
    "import fcntl, os, sys\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)


def make_cache(base: Path) -> CacheRoot:
    directory = base / "vllm" / "torch_compile_cache" / SUBJECT
    (directory / "rank_0_0").mkdir(parents=True)
    (directory / "rank_0_0" / "model").write_bytes(b"\x80\x04model" * 100)
    (directory / "inductor_cache").mkdir()
    (directory / "inductor_cache" / "cbn.py").write_text("x = 1\n")
    return CacheRoot(base / "vllm")


@pytest.fixture
def root(tmp_path: Path) -> CacheRoot:
    return make_cache(tmp_path)


def lock_of(root: CacheRoot) -> Path:
    return directory_lock.lock_path(root.directory(SUBJECT))


@contextlib.contextmanager
def held(lock: Path) -> Iterator[None]:
    """Another process holds ``lock`` (``flock``, exclusive) until the block ends."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        yield
    finally:
        child.kill()
        child.wait()


def keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    assert main(["keygen", str(tmp_path / "k")]) == 0
    capsys.readouterr()
    return str(tmp_path / "k"), str(tmp_path / "k.pub")


def one_error_line(err: str, lock: Path, reason: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and str(lock) in lines[0] and reason in lines[0], err


@pytest.mark.parametrize("command", ["sign", "push", "pull"])
def test_cli_waits_for_a_held_lock_at_most_its_timeout(
    root: CacheRoot, tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    key, pub = keys(tmp_path, capsys)
    store = f"file://{tmp_path}/store"
    assert main(["compile-cache", "sign", "--key", key, str(root.root)]) == 0
    assert main(["compile-cache", "push", "--trusted-keys", pub, str(root.root), store]) == 0
    fresh = CacheRoot(tmp_path / "fresh")
    argv = {
        "sign": ["sign", "--key", key, str(root.root)],
        "push": ["push", "--json", "--trusted-keys", pub, str(root.root), store],
        "pull": ["pull", "--trusted-keys", pub, store, str(fresh.root)],
    }[command]
    lock = lock_of(fresh if command == "pull" else root)
    sidecar = cachedir.sidecar_path(root.directory(SUBJECT)).read_bytes()
    capsys.readouterr()
    with held(lock):
        started = time.monotonic()
        assert main(["compile-cache", *argv, "--timeout", "1"]) == 2
        assert time.monotonic() - started < SLACK
    out, err = capsys.readouterr()
    one_error_line(err, lock, "timeout")
    assert "Traceback" not in out + err
    if command == "push":  # --json: the row says why, as for any other error
        assert json.loads(out)["caches"][0] | {"detail": None} == {
            "cache": SUBJECT,
            "action": "error",
            "ok": False,
            "reason": "timeout",
            "detail": None,
            "files": 0,
            "bytes": 0,
            "signers": [],
            "signed_by": [],
            "keyless": [],
        }
    assert not os.path.lexists(fresh.directory(SUBJECT) / "rank_0_0")  # nothing pulled
    # nothing signed anew
    assert cachedir.sidecar_path(root.directory(SUBJECT)).read_bytes() == sidecar


def test_publish_and_sign_with_a_short_wait_raise_a_timeout_naming_the_lock(
    root: CacheRoot, tmp_path: Path
) -> None:
    private = tmp_path / "private"
    shutil.copytree(root.directory(SUBJECT), private)
    shutil.rmtree(root.directory(SUBJECT))
    root.directory(SUBJECT).mkdir()
    with held(lock_of(root)):
        started = time.monotonic()
        with pytest.raises(StoreTimeout) as info:
            cc.publish_cache(root, SUBJECT, private, SIGNER, NOW, wait=0.3)
        with pytest.raises(StoreTimeout):
            cc.sign_cache(root, SUBJECT, SIGNER, NOW, wait=0.3)
        assert time.monotonic() - started < SLACK
    assert info.value.reason is Reason.TIMEOUT and str(lock_of(root)) in info.value.detail
    assert not cachedir.sidecar_path(root.directory(SUBJECT)).exists() and not os.listdir(
        root.directory(SUBJECT)
    )


@pytest.mark.parametrize("loose", ["another user's", "mode 0666"])
def test_a_foreign_or_loose_lock_file_is_never_used(
    root: CacheRoot, tmp_path: Path, loose: str
) -> None:
    lock = lock_of(root)
    lock.touch(mode=0o600)
    if loose == "another user's":
        os.chown(lock, 1000, 1000)
    else:
        os.chmod(lock, 0o666)
    with pytest.raises(StoreError) as info:
        cc.sign_cache(root, SUBJECT, SIGNER, NOW, wait=1)
    assert info.value.reason is Reason.UNSAFE_DIRECTORY and str(lock) in info.value.detail
    assert not cachedir.sidecar_path(root.directory(SUBJECT)).exists()  # nothing signed
    signed = make_cache(tmp_path / "build")
    cc.sign_cache(signed, SUBJECT, SIGNER, NOW)
    store = open_store(f"file://{tmp_path}/store")
    cc.push_cache(store, signed, SUBJECT, KEYRING, NOW)
    fresh = CacheRoot(tmp_path / "fresh")
    fresh.directory(SUBJECT).parent.mkdir(parents=True)
    shutil.copy2(lock, lock_of(fresh))
    os.chown(lock_of(fresh), os.stat(lock).st_uid, os.stat(lock).st_gid)
    with pytest.raises(StoreError) as info:
        cc.pull_cache(store, fresh, SUBJECT, KEYRING, NOW, wait=1)
    # nothing pulled
    assert info.value.reason is Reason.UNSAFE_DIRECTORY and not fresh.directory(SUBJECT).exists()
    shutil.copy2(lock, lock_of(signed))
    os.chown(lock_of(signed), os.stat(lock).st_uid, os.stat(lock).st_gid)
    outcome = cl.guard(signed, SUBJECT, KEYRING, NOW, tmp_path / "into", wait=1)
    assert (outcome.action, outcome.reason) == ("compile", "unsafe-directory") and not os.listdir(
        tmp_path / "into"
    )


def test_a_lock_file_this_user_cannot_open_stops_the_cli(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """uid 1000 owns the whole cache but not its lock (root's, 0600): it may not go on unlocked."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    base = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        root = make_cache(base)
        key, _ = keys(base, capsys)
        for path in [root.root, *root.root.rglob("*"), Path(key), Path(key + ".pub")]:
            os.chown(path, 1000, 1000)
        lock = lock_of(root)
        lock.touch(mode=0o600)  # root's
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(base),
            "LANG": "C.UTF-8",
            **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
        }
        started = time.monotonic()
        done = subprocess.run(
            [
                "setpriv",
                "--reuid",
                "1000",
                "--regid",
                "1000",
                "--clear-groups",
                sys.executable,
                "-m",
                "plancache.cli.main",
                "compile-cache",
                "sign",
                "--key",
                key,
                "--timeout",
                "1",
                str(root.root),
            ],
            env=env,
            cwd=str(base),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert time.monotonic() - started < 120
        assert done.returncode == 2, done.stdout + done.stderr
        one_error_line(done.stderr, lock, "lock-unavailable")
        assert "Traceback" not in done.stdout + done.stderr
        assert not cachedir.sidecar_path(root.directory(SUBJECT)).exists()  # not signed unlocked
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def read_only_view(source: Path, target: Path) -> Iterator[Path]:
    """``source`` bind-mounted read-only at ``target`` (skips where mounting is not allowed)."""
    target.mkdir()
    if (
        subprocess.run(
            ["mount", "--bind", str(source), str(target)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("cannot bind-mount here")
    try:
        if (
            subprocess.run(
                ["mount", "-o", "remount,bind,ro", str(target)], capture_output=True
            ).returncode
            != 0
        ):
            pytest.skip("cannot remount read-only here")
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


def test_a_read_only_filesystem_is_read_without_a_lock_and_never_written(
    root: CacheRoot, tmp_path: Path
) -> None:
    cc.sign_cache(root, SUBJECT, SIGNER, NOW)
    store = open_store(f"file://{tmp_path}/store")
    cc.push_cache(store, root, SUBJECT, KEYRING, NOW)
    with read_only_view(root.root, tmp_path / "ro") as view, held(lock_of(root)):
        ro = CacheRoot(view)
        started = time.monotonic()
        # the lock is held: not taken
        outcome = cl.guard(ro, SUBJECT, KEYRING, NOW, tmp_path / "into", wait=5)
        assert outcome.action == "load", outcome
        assert time.monotonic() - started < 5  # never waited for the holder
        assert sorted(p.name for p in (tmp_path / "into").rglob("*")) == [
            "cbn.py",
            "inductor_cache",
            "model",
            "rank_0_0",
        ]
        with directory_lock.locked(ro.root, ro.directory(SUBJECT), wait=0) as holding:
            assert holding is False
        for write in (
            lambda: cc.sign_cache(ro, SUBJECT, SIGNER, NOW, wait=0),
            lambda: cc.pull_cache(store, ro, SUBJECT, KEYRING, NOW, wait=0),
        ):
            with pytest.raises(StoreError) as info:
                write()
            assert (
                info.value.reason is Reason.LOCAL_ERROR
                and "read-only filesystem" in info.value.detail
            )
        # reads only
        assert cc.push_cache(store, ro, SUBJECT, KEYRING, NOW, wait=0).action == "pushed"


def test_the_plugins_publish_inside_vllms_save_costs_at_most_the_budget(
    root: CacheRoot,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    private = tmp_path / "private"
    shutil.copytree(root.directory(SUBJECT), private)
    shutil.rmtree(root.directory(SUBJECT))
    root.directory(SUBJECT).mkdir()
    config = compile_publish.Settings(KEYRING, "", "key", None, {}, 0.2)
    monkeypatch.setattr(compile_publish, "settings", lambda: config)
    monkeypatch.setattr(compile_publish, "signer", lambda: SIGNER)
    monkeypatch.setattr(compile_publish, "LOCK_WAIT_EXTRA", 0.3)
    with held(lock_of(root)), caplog.at_level(logging.INFO, "vllm.plancache"):
        worker = threading.Thread(
            target=compile_publish.publish, args=(root.directory(SUBJECT), private), daemon=True
        )
        worker.start()
        worker.join(SLACK)
        assert not worker.is_alive(), "publish hung on a held lock"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(
        f"plancache: compile cache {SUBJECT} not signed: "
    )
    assert str(lock_of(root)) in warnings[0] and "0.5 s" in warnings[0]
    assert not cachedir.sidecar_path(root.directory(SUBJECT)).exists()
