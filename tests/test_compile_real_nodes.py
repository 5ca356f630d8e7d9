"""The compile guard on a real node (issue 39): forked workers, pods in their own PID namespaces
sharing one cache root, other users, full disks, read-only roots and ``noexec`` temp directories.

Every scenario runs the plugin's own guard (``private_for``, as vLLM's first read asks for it) in
a real process (tests/node_worker.py): forked from one that installed the guard on vLLM 0.33's
modules, started with ``unshare -p`` (a PID namespace of its own), as uid 1000 or 1001 through
setuid children, on a size-limited tmpfs, under a read-only bind mount. The tests run as root,
which these machines allow: what needs a mount or another user skips elsewhere, and fails under
``CI=true``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import NOW
from mount_namespaces import interpreter_reachable, keep_reachable
from plancache.keys.keyfile import file_signer, generate_keypair
from plancache.pipeline.compile_cache import flows as cc
from plancache.pipeline.compile_cache.local_caches import CacheRoot, verify_cache
from plancache.storage.compile_cache import boot_dirs
from plancache.storage.compile_cache.header_files import HEADERS_SUBDIR
from plancache.storage.local import dirfds

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
WORKER = str(TESTS / "node_worker.py")
SUBJECT = "torch_aot_compile/" + "cd" * 32
USER, STRANGER = 1000, 1001
MODEL = b"\x80\x04model-pickle" * 20_000  # 300 KB: more than the small tmpfs below holds


def _needs_root_and_mounts() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("these tests need root, mounts and unshare (they run as root in CI)")
        pytest.skip("needs root, mounts and unshare")


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory every test user can reach (pytest's tmp_path is root's, mode 0700)."""
    _needs_root_and_mounts()
    interpreter_reachable()
    top = Path(tempfile.mkdtemp(prefix="plancache-node-", dir="/tmp"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        for mount in sorted(
            (
                line.split()[1]
                for line in Path("/proc/mounts").read_text().splitlines()
                if line.split()[1].startswith(str(top))
            ),
            reverse=True,
        ):
            subprocess.run(["umount", "-l", mount], check=False)
        shutil.rmtree(top, ignore_errors=True)


def _signed_root(top: Path, owner: int = 0) -> CacheRoot:
    """A signed AOT-layout cache under ``top/vllm-cache``, with the key pair in ``top/keys``."""
    (top / "keys").mkdir(mode=0o755)
    generate_keypair(top / "keys" / "ci", force=False, comment="ci", env={})
    (top / "keys" / "ci.pub").chmod(0o644)
    root = CacheRoot(top / "vllm-cache")
    directory = root.directory(SUBJECT)
    (directory / "rank_0_0").mkdir(parents=True)
    (directory / "rank_0_0" / "model").write_bytes(MODEL)
    (directory / "inductor_cache" / "ab").mkdir(parents=True)
    (directory / "inductor_cache" / "ab" / "kernel.py").write_text("x = 1\n")
    assert (
        cc.sign_cache(root, SUBJECT, file_signer(top / "keys" / "ci", {}, None), NOW).action
        == "signed"
    )
    if owner:
        for path in [root.root, *root.root.rglob("*")]:
            os.chown(path, owner, owner, follow_symlinks=False)
    return root


def _env(top: Path, root: CacheRoot, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PLANCACHE_", "VLLM_", "TORCHINDUCTOR_", "TRITON_"))
    }
    env.update(
        PYTHONPATH=f"{SRC}{os.pathsep}{TESTS}",
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        VLLM_CACHE_ROOT=str(root.root),
        PLANCACHE_COMPILE_CACHE="1",
        PLANCACHE_TRUSTED_KEYS=str(top / "keys" / "ci.pub"),
    )
    env.update(extra)
    return env


def _run(
    argv: list[str], env: dict[str, str], user: int | None = None, prefix: tuple[str, ...] = ()
) -> Any:
    home = Path(env.get("HOME_FOR_TEST", "/tmp"))
    kwargs: dict[str, Any] = (
        {"user": user, "group": user, "extra_groups": []} if user is not None else {}
    )
    result = subprocess.run(
        [*prefix, sys.executable, WORKER, *argv],
        env={**env, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
        **kwargs,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("NODE ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    return json.loads(lines[0][len("NODE ") :])


def _home(top: Path, user: int) -> Path:
    home = top / f"home-{user}"
    home.mkdir(mode=0o700, exist_ok=True)
    os.chown(home, user, user)
    return home


def _quarantine(root: CacheRoot) -> list[str]:
    return sorted(os.listdir(root.quarantine_root)) if root.quarantine_root.exists() else []


def test_forked_workers_each_copy_into_their_own_directory_and_never_touch_each_other(
    base: Path,
) -> None:
    root = _signed_root(base)
    reports = _run(["fork", str(root.directory(SUBJECT))], _env(base, root))
    assert [r["action"] for r in reports] == ["load", "load"], reports
    boots = {r["boot"] for r in reports}
    assert len(boots) == 2 and reports[0]["parent_boot"] not in boots  # one each, none the engine's
    for report in reports:  # torch's caches too: the worker's own directory, not the engine's
        assert all(d.startswith(report["boot"] + "/") for d in report["torch_dirs"]), report[
            "torch_dirs"
        ]
    (first,) = [r for r in reports if "digest_after_other" in r]
    assert (
        first["digest_after_other"]
        == first["digest"]
        == reports[0]["digest"]
        == reports[1]["digest"]
        is not None
    )
    assert _quarantine(root) == []


def _hold(top: Path, root: CacheRoot) -> tuple[subprocess.Popen[str], Path]:
    """A pod's live worker: its own PID namespace (``unshare -p``), where the worker's pid (12,
    after ten short-lived processes) is one no process has in the other pod's namespace."""
    script = f'for i in 1 2 3 4 5 6 7 8 9 10; do true & done; wait; "$0" {WORKER} hold; :'
    command = ["unshare", "-p", "-f", "sh", "-c", script, sys.executable]
    held = subprocess.Popen(
        command,
        env={**_env(top, root), "HOME": "/tmp"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert held.stdout is not None
    line = held.stdout.readline()
    assert line.startswith("NODE "), line
    return held, Path(json.loads(line[5:])["boot"])


def test_a_pod_in_another_pid_namespace_never_sweeps_a_live_boot_and_a_dead_one_is_swept(
    base: Path,
) -> None:
    root = _signed_root(base)
    held, boot = _hold(base, root)
    try:
        (boot / "copy").write_bytes(b"in use")
        other = _run(
            ["guard", str(root.directory(SUBJECT))],
            _env(base, root),
            prefix=("unshare", "-p", "-f"),
        )
        assert other["action"] == "load" and Path(other["boot"]).parent == boot.parent != Path(
            other["boot"]
        )
        assert (boot / "copy").read_bytes() == b"in use"  # the old pid check removed it
    finally:
        subprocess.run(["pkill", "-KILL", "-f", f"{WORKER} hold"], check=False)  # no exit hook runs
        held.kill()
        held.wait()
    _until_unlocked(boot)
    later = _run(["guard", str(root.directory(SUBJECT))], _env(base, root))
    assert (
        later["action"] == "load"
        and not boot.exists()
        and not boot.with_name(boot.name + ".lock").exists()
    )


def _until_unlocked(boot: Path) -> None:
    import fcntl
    import time

    fd = os.open(boot.with_name(boot.name + ".lock"), os.O_RDONLY)
    try:
        for _ in range(500):
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                time.sleep(0.02)
        pytest.fail("the killed worker's lock is still held")
    finally:
        os.close(fd)


def test_a_plancache_private_of_another_user_or_a_group_writable_root_is_never_used(
    base: Path,
) -> None:
    root = _signed_root(base, owner=USER)
    home = _home(base, USER)
    foreign = root.root / boot_dirs.PRIVATE_SUBDIR
    foreign.mkdir(mode=0o777)
    os.chown(foreign, STRANGER, STRANGER)
    tmp = base / "tmp-1000"
    tmp.mkdir(mode=0o700)
    os.chown(tmp, USER, USER)
    env = _env(base, root, TMPDIR=str(tmp), HOME_FOR_TEST=str(home))
    report = _run(["guard", str(root.directory(SUBJECT))], env, user=USER)
    fresh = Path(report["boot"]).parent  # a root made by this boot, never a fixed name
    assert report["action"] == "load" and fresh.parent == tmp, report
    assert re.fullmatch(rf"plancache-private-{USER}-[0-9a-f]{{16}}", fresh.name)
    assert not fresh.exists()  # it lived for that boot alone
    assert os.listdir(foreign) == []  # nothing of the worker's in the stranger's directory
    said = [line for line in report["lines"] if "compile-cache private directory=" in line]
    assert said and str(foreign) in said[0] and f"uid {STRANGER}" in said[0], report["lines"]
    shutil.rmtree(foreign)
    root.root.chmod(0o777)  # vLLM made the root with a umask of 0 (or 002 and a shared group)
    report = _run(["guard", str(root.directory(SUBJECT))], env, user=USER)
    assert report["action"] == "load" and not report["boot"].startswith(str(root.root))
    assert not foreign.exists()


def test_a_full_disk_is_no_verdict_and_a_later_boot_with_room_loads_verified(base: Path) -> None:
    root = _signed_root(base)
    small = base / "small"
    small.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(small)], check=True
    )
    full = _run(
        ["guard", str(root.directory(SUBJECT))],
        _env(base, root, PLANCACHE_PRIVATE_DIR=str(small / "p")),
    )
    assert (full["action"], full["reason"]) == ("compile", "local-error"), full
    # the old code quarantined it
    assert "No space left" in full["detail"] and _quarantine(root) == []
    assert verify_cache(root, SUBJECT, boot_dirs_keyring(base), NOW).action == "verified"
    later = _run(["guard", str(root.directory(SUBJECT))], _env(base, root))
    assert later["action"] == "load" and later["digest"] is not None


def boot_dirs_keyring(top: Path) -> Any:
    from plancache.pipeline.trust_config import worker_policy

    return worker_policy(str(top / "keys" / "ci.pub"), 1).keyring


def test_a_read_only_root_with_a_noexec_tmp_compiles_cold_and_says_why(base: Path) -> None:
    root = _signed_root(base)
    subprocess.run(["mount", "--bind", str(root.root), str(root.root)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(root.root)], check=True)
    tmp = base / "tmp"
    tmp.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,noexec,mode=1777", "tmpfs", str(tmp)], check=True
    )
    # every temporary directory of the node noexec too (as on such a pod), not just TMPDIR
    keep_before, keep_after = keep_reachable(("/tmp", "/var/tmp", "/dev/shm"))
    noexec_temps = (
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        keep_before + "mount --bind /tmp /tmp && mount -o remount,bind,noexec /tmp && "
        "for d in /var/tmp /dev/shm; do mount -t tmpfs -o noexec,mode=1777 tmpfs $d || exit 1; "
        "done; " + keep_after + 'exec "$@"',
        "sh",
    )
    cold = _run(
        ["installed", str(root.directory(SUBJECT))],
        _env(base, root, TMPDIR=str(tmp)),
        prefix=noexec_temps,
    )
    # the old code: load verified
    assert (cold["action"], cold["reason"]) == ("compile", "no-private-dir"), cold
    assert cold["installed"] and any("vLLM compiles cold" in line for line in cold["lines"]), cold[
        "lines"
    ]
    # every place tried, each with why (elided in the middle now that the temporary
    # directories are tried too: the read-only root's reason falls in the elision)
    assert str(root.root) in cold["detail"] and "noexec" in cold["detail"]
    assert "PLANCACHE_PRIVATE_DIR" in cold["detail"]
    # nothing of the cache handed over
    assert cold["digest"] is None or cold["digest"] == _empty_digest()
    exec_place = base / "private"
    configured = _run(
        ["guard", str(root.directory(SUBJECT))],
        _env(base, root, TMPDIR=str(tmp), PLANCACHE_PRIVATE_DIR=str(exec_place)),
    )
    assert configured["action"] == "load" and Path(configured["boot"]).parent == exec_place


def _empty_digest() -> str:
    import hashlib

    return hashlib.sha256().hexdigest()


def test_a_header_temporary_of_a_dead_boot_is_swept_and_a_live_ones_kept(base: Path) -> None:
    private = base / "root" / boot_dirs.PRIVATE_SUBDIR
    (base / "root").mkdir()
    live = boot_dirs.new_boot_dir(base / "root")
    dead_name = "boot-" + "0" * 16
    headers = private / HEADERS_SUBDIR
    headers.mkdir(mode=0o700)
    mine = headers / dirfds.temp_name("c1.h.gch", live.path.name)
    stale = headers / dirfds.temp_name("c1.h.gch", dead_name)
    mine.write_bytes(b"live")
    stale.write_bytes(b"dead")
    (private / (dead_name + ".lock")).write_bytes(b"")
    (private / dead_name).mkdir()
    removed = boot_dirs.sweep(private)
    assert (
        sorted(removed) == sorted([dead_name, f"headers/{stale.name}"])
        and mine.exists()
        and live.path.exists()
    )
    live.close()
    assert not live.path.exists()


def test_a_quarantine_directory_of_another_user_is_never_used(base: Path) -> None:
    root = _signed_root(base)
    # same size, other bytes
    (root.directory(SUBJECT) / "rank_0_0" / "model").write_bytes(MODEL[::-1])
    root.quarantine_root.mkdir(mode=0o777)
    os.chown(root.quarantine_root, STRANGER, STRANGER)
    report = _run(["guard", str(root.directory(SUBJECT))], _env(base, root))
    assert (report["action"], report["reason"]) == ("quarantined", "digest-mismatch"), report
    assert report["digest"] in (None, _empty_digest())  # nothing of it handed to vLLM
    # the old code moved the evidence into the stranger's directory
    assert os.listdir(root.quarantine_root) == []
    beside = root.directory(SUBJECT).parent / "plancache-quarantine"
    assert report["quarantined_to"].startswith(f"{beside}/"), report["quarantined_to"]


FRESH_BOOT = """
import os, signal, sys
from pathlib import Path
from plancache.storage.compile_cache import boot_dirs
boot = boot_dirs.new_boot_dir(Path(sys.argv[1]))
print(boot.root, flush=True)
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.read()  # alive until the test closes stdin
boot.close()  # the plugin's exit hook
"""


def test_a_fresh_root_of_a_killed_boot_is_swept_by_the_next_and_a_live_ones_kept(
    base: Path,
) -> None:
    """The fallback root is made fresh per boot in a temporary directory (never a fixed name):
    a boot killed before its exit hook leaves one, which the next fresh root sweeps by its lock;
    a live boot's (another pod's, say) stays."""
    shared = base / "shared-root"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # group/world-writable: its plancache-private is refused
    tmp = base / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    env = {**os.environ, "PYTHONPATH": str(SRC), "TMPDIR": str(tmp)}
    argv = [sys.executable, "-c", FRESH_BOOT, str(shared / "vllm-cache")]
    killed = subprocess.run([*argv, "kill"], env=env, capture_output=True, text=True, check=False)
    dead = Path(killed.stdout.strip())
    assert dead.parent == tmp and dead.is_dir(), killed.stderr
    live = subprocess.Popen(
        [*argv, "wait"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert live.stdout is not None
        alive = Path(live.stdout.readline().strip())
        assert alive.parent == tmp and alive != dead
        assert not dead.exists()  # the old code: a fixed name, never swept as a root
        assert alive.is_dir() and stat.S_IMODE(alive.stat().st_mode) == 0o700
        third = subprocess.run(
            [*argv, "kill"], env=env, capture_output=True, text=True, check=False
        )
        assert alive.is_dir() and Path(third.stdout.strip()) not in (alive, dead)
    finally:
        live.communicate("")
    assert not alive.exists()  # removed at its exit


NO_TEMPDIR_BOOT = """
import sys
from pathlib import Path
from plancache.storage.compile_cache import boot_dirs
from plancache.trust.errors import StoreError
try:
    boot_dirs.new_boot_dir(Path(sys.argv[1]))
except StoreError as exc:
    print("REFUSED", exc.reason.value, exc.detail)
"""


def test_no_usable_temporary_directory_at_all_is_no_private_dir_not_a_crash(base: Path) -> None:
    """A co-tenant fills every shared temporary directory, ``TMPDIR`` is unset and the working
    directory read-only: Python's ``tempfile.gettempdir()`` itself raises. That is one more
    unusable place (``no-private-dir``, each named), never an exception out of the guard, which
    then left torch's cache directories unpinned (the first cut)."""
    shared = Path(tempfile.mkdtemp(prefix="plancache-shared-", dir="/srv"))
    try:
        shared.chmod(0o777)  # its plancache-private refused
        fill = " ".join(
            f"i=0; while touch {d}/f\\$i 2>/dev/null; do i=\\$((i+1)); done;"  # for the inner sh
            for d in ("/tmp", "/var/tmp", "/dev/shm")
        )
        before, after = keep_reachable(("/tmp", "/var/tmp", "/dev/shm"))
        script = (
            before + "for d in /tmp /var/tmp /dev/shm; do "
            "mount -t tmpfs -o mode=1777,nr_inodes=16 tmpfs $d || exit 1; done; "
            f"{after}setpriv --reuid={STRANGER} --regid={STRANGER} --clear-groups -- "
            f'sh -c "{fill}"; cd / && exec setpriv --reuid={USER} --regid={USER} --clear-groups '
            '-- "$@"'
        )
        env = {k: v for k, v in os.environ.items() if k != "TMPDIR"}
        result = subprocess.run(
            [
                *("unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh"),
                *(sys.executable, "-c", NO_TEMPDIR_BOOT, str(shared / "vllm-cache")),
            ],
            env={**env, "PYTHONPATH": str(SRC)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]  # the first cut: FileNotFoundError
        assert result.stdout.startswith("REFUSED no-private-dir"), result.stdout
        for place in ("/tmp", "/var/tmp", "/dev/shm", str(shared)):
            assert place in result.stdout, result.stdout
    finally:
        shutil.rmtree(shared, ignore_errors=True)
