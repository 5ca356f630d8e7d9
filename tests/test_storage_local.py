"""vLLM's plan directory: resolution as vLLM does it, capped reads, atomic writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FP, plan_bytes
from plancache.storage.local.files import read_capped, write_atomic
from plancache.storage.local.localdir import LocalPlanDir, default_plan_dir
from plancache.trust.errors import PlanCacheError, Reason
from plancache.trust.plans import plan
from plancache.trust.plans.plan import plan_name, sig_name


def test_plan_dir_resolution_follows_vllm() -> None:
    assert default_plan_dir({"VLLM_CACHE_ROOT": "/x/cache"}) == Path("/x/cache/startup_plan")
    assert default_plan_dir({"XDG_CACHE_HOME": "/xdg"}) == Path("/xdg/vllm/startup_plan")
    assert default_plan_dir({}) == Path(os.path.expanduser("~/.cache/vllm/startup_plan"))
    assert default_plan_dir({"VLLM_CACHE_ROOT": "~/c"}) == Path(
        os.path.expanduser("~/c/startup_plan")
    )


def test_write_then_read_and_listing_ignores_other_names(plan_dir: Path) -> None:
    local = LocalPlanDir(plan_dir)
    local.write(FP, plan_bytes(), b"sig\n")
    for junk in (
        "startup_plan_XYZ.json",
        "startup_plan_0123456789abcdef.json.tmp",
        "notes.txt",
        ".startup_plan_0123456789abcdef.json.1.tmp",
    ):
        (plan_dir / junk).write_text("x")
    assert local.fingerprints() == [FP]
    assert local.read(FP) == (plan_bytes(), b"sig\n")
    assert LocalPlanDir(plan_dir / "missing").fingerprints() == []
    assert LocalPlanDir(plan_dir).read("fedcba9876543210") == (None, None)


def test_read_finds_the_sidecar_write_wrote_by_the_one_name_rule(
    plan_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sidecar's name has one rule (plan.sidecar_of, which sig_name applies): were it to
    change, what ``write`` writes is still what ``read`` reads (``read`` spelt the rule again as
    ``plan_path + SIG_SUFFIX``, a suffix imported by value)."""
    monkeypatch.setattr(plan, "SIG_SUFFIX", ".sidecar")
    local = LocalPlanDir(plan_dir)
    local.write(FP, plan_bytes(), b"sig\n")
    assert sorted(os.listdir(plan_dir)) == [plan_name(FP), plan_name(FP) + ".sidecar"]
    assert local.read(FP) == (plan_bytes(), b"sig\n")


def test_no_temp_files_are_left_behind(plan_dir: Path) -> None:
    LocalPlanDir(plan_dir).write(FP, plan_bytes(), b"sig")
    assert sorted(os.listdir(plan_dir)) == [plan_name(FP), sig_name(FP)]
    assert oct(os.stat(plan_dir / plan_name(FP)).st_mode & 0o777) == oct(0o644)


def test_read_only_directory_is_reported_and_left_empty() -> None:
    """Root ignores directory modes, so as root the write runs in a forked child as nobody."""
    import tempfile

    target = Path(tempfile.mkdtemp(prefix="plancache-ro-"))  # directly in /tmp: nobody can reach it
    target.chmod(0o555)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop to an unprivileged user, try the write, report, exit
        code = 1
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            try:
                LocalPlanDir(target).write(FP, plan_bytes(), b"sig")
            except PlanCacheError as exc:
                os.write(write_fd, f"{exc.reason.value} {exc.detail}".encode())
                code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    message = os.read(read_fd, 4096).decode()
    os.close(read_fd)
    assert os.waitstatus_to_exitcode(status) == 0, message
    assert message.startswith("store-error") and "Permission denied" in message
    assert os.listdir(target) == []
    target.rmdir()


def test_failed_write_leaves_nothing_under_a_final_name(
    plan_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk (ENOSPC on fsync) must not leave a plan or a temp file behind."""

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(PlanCacheError) as info:
        LocalPlanDir(plan_dir).write(FP, plan_bytes(), b"sig")
    assert info.value.reason is Reason.STORE_ERROR and "No space left" in info.value.detail
    assert os.listdir(plan_dir) == []


def test_unwritable_location_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(PlanCacheError) as info:
        LocalPlanDir(blocker / "startup_plan").write(FP, plan_bytes(), None)
    assert info.value.reason is Reason.STORE_ERROR


def test_planted_symlink_is_replaced_not_followed(plan_dir: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (plan_dir / plan_name(FP)).symlink_to(victim)
    LocalPlanDir(plan_dir).write(FP, plan_bytes(), None)
    assert victim.read_text() == "precious"
    assert not (plan_dir / plan_name(FP)).is_symlink()


def test_reads_are_capped_and_refuse_links_and_fifos(plan_dir: Path, tmp_path: Path) -> None:
    big = plan_dir / plan_name(FP)
    big.write_bytes(b"x" * 100_000)
    with pytest.raises(PlanCacheError) as info:
        LocalPlanDir(plan_dir).read(FP)
    assert info.value.reason is Reason.TOO_LARGE
    big.unlink()
    big.symlink_to("/dev/zero")
    with pytest.raises(PlanCacheError):
        LocalPlanDir(plan_dir).read(FP)
    big.unlink()
    os.mkfifo(big)  # a FIFO with no writer would block a naive open() forever
    with pytest.raises(PlanCacheError) as info:
        read_capped(big, 100)
    assert info.value.reason is Reason.MALFORMED


def test_write_atomic_sets_mode(tmp_path: Path) -> None:
    write_atomic(tmp_path / "secret", b"k", mode=0o600)
    assert os.stat(tmp_path / "secret").st_mode & 0o777 == 0o600


_KILLED_RECORD_WRITER = """
import os, signal, sys
from pathlib import Path
from plancache.storage.local import records
os.rename = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)  # killed before it
records.write(Path(sys.argv[1]), sys.argv[2], b"{}")
"""


def test_what_killed_writers_leave_of_boot_records_goes_with_the_oldest_records(
    tmp_path: Path,
) -> None:
    """Red team 8a: a worker killed between its record's temporary and the rename (the OOM
    killer in a crash loop, the deferred write racing vLLM's profile pass) left the temporary
    for ever: only record names were pruned, so a crash loop could fill the disk after all.
    They count with their records against the bound."""
    import signal

    from plancache.storage.local import records

    def name(minute: int) -> str:
        return f"20261206T17{minute:02d}00Z-{100 + minute}-r0-0000000{minute % 10}.json"

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for minute in (1, 2, 3):
        killed = subprocess.run(
            [sys.executable, "-c", _KILLED_RECORD_WRITER, str(tmp_path), name(minute)],
            env=env,
            capture_output=True,
            timeout=60,
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr
    directory = records.directory(tmp_path)
    assert len([n for n in os.listdir(directory) if n.endswith(".tmp")]) == 3
    records.write(tmp_path, name(4), b"{}", keep=2)
    records.write(tmp_path, name(5), b"{}", keep=2)
    assert sorted(os.listdir(directory)) == [name(4), name(5)]


@pytest.mark.parametrize("owner", ["", "boot-0123456789abcdef"])
@pytest.mark.parametrize("name", ["20261206T120000Z-1-r0-0123abcd.json", "x.json.sig", "a.b.c"])
def test_a_temporary_names_what_it_was_made_for(owner: str, name: str) -> None:
    """``temp_target`` reads back the name ``temp_name`` made a temporary for, with or without
    an owner, and nothing from names that are not such temporaries: the one reading of the
    format, by which records prune what killed writers left."""
    from plancache.storage.local.dirfds import temp_name, temp_target

    temporary = temp_name(name, owner)
    assert temp_target(temporary) == name
    for other in (
        name,
        temporary[1:],
        temporary[:-4],
        temporary.replace(".tmp", ".tmq"),
        f".{name}.0123.tmp",
        f".{name}.{'g' * 16}.tmp",
        f".{'0' * 16}.tmp",
    ):
        assert temp_target(other) is None, other
