"""The boot notes of issue 49 against what a node really has: read-only plan directories, other
users' files in a shared one, notes that do not parse, a state directory someone else can write.

The notes only ever turn an apply into a profile; the findings here are about a good plan lost:
plans shipped read-only (an image layer, a ConfigMap) must still apply with crash-loop protection
(the note goes to the node's state directory), and nobody but this user can hold a plan back.
Root for ``chown`` and ``unshare -m`` (a tmpfs remounted read-only); the boot path through vLLM's
real worker is tests/test_vllm_plugin.py's.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mount_namespaces import interpreter_reachable
from plancache.cli.main import main as cli
from plancache.storage.local.state_dir import state_dir_for
from plancache.trust.errors import Reason
from plancache.trust.plans.gate import Decision, Verdict
from plancache.vllm_plugin.plan_health import node_memory, notes
from plancache.vllm_plugin.worker_boot import Boot

FP = "0123456789abcdef"
SHA = "a" * 64
KV = 40 << 30
OTHER_UID = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown, mounts)")


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A node: its cache root (the state directory's base) and vLLM's plan directory in it."""
    monkeypatch.delenv("PLANCACHE_STATE_DIR", raising=False)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    plans = tmp_path / "cache" / "startup_plan"
    plans.mkdir(parents=True)
    return plans


def _boot() -> Boot:
    boot = Boot.__new__(Boot)  # only the fields the notes read and write
    boot.plan_sha256, boot.note_path, boot.unfinished, boot.held_alert = SHA, None, None, None
    boot.note_fd = None
    return boot


def _apply(plans: Path, boot: Boot | None = None, *, dies: bool = True) -> Decision:
    """A boot's decision; it then dies (``dies``): its locked note is closed, as by the kernel."""
    boot = boot or _boot()
    decision = node_memory.before_vote(boot, plans, Decision(True, Verdict.APPLIED, "", KV, FP))
    if dies and boot.note_fd is not None:
        os.close(boot.note_fd)
        boot.note_fd = None
    return decision


def _plant(path: Path, body: object, uid: int = OTHER_UID) -> None:
    path.write_text(json.dumps(body))
    os.chown(path, uid, uid)


def test_another_users_notes_in_a_shared_plan_directory_hold_nothing_back(node: Path) -> None:
    """A co-tenant of a group-writable plan directory plants a hold-back and an unfinished-boot
    note naming the very plan: this user's boot applies it all the same (red team 49: the old
    notes held a good plan back until an operator ran ``plancache release``)."""
    node.chmod(0o1777)
    body = {"plan_sha256": SHA, "profiled_kv_cache_memory_bytes": 1}
    _plant(notes.held_path(node, FP), body)
    _plant(notes.applying_path(node, FP), body)
    assert _apply(node).applied
    assert notes.held_fingerprints(node) == []
    assert cli(["release", FP, "--dir", str(node)]) == 1  # not ours to remove
    assert notes.held_path(node, FP).exists()


def test_a_hold_back_that_names_no_plan_is_removed_not_kept_for_ever(node: Path) -> None:
    """A hold-back lasts until an operator acts, so it must name the plan's bytes: one that does
    not parse (or names none) no longer holds every plan of the fingerprint for ever."""
    for body in ("{", "[]", "{}", json.dumps({"plan_sha256": None})):
        notes.held_path(node, FP).write_text(body)
        assert _apply(node).applied, body
        assert not notes.held_path(node, FP).exists()
        notes.clear_applying(node, FP)
    notes.hold_back(node, FP, SHA, KV, KV // 2)  # this user's, naming the plan: held
    decision = _apply(node)
    assert (decision.applied, decision.reason) == (False, Verdict.PLAN_EXCEEDS_PROFILE)


def test_notes_that_are_links_fifos_or_huge_are_never_followed_nor_block(node: Path) -> None:
    target = node.parent / "elsewhere.json"
    target.write_text(json.dumps({"plan_sha256": SHA}))
    notes.held_path(node, FP).symlink_to(target)
    os.mkfifo(notes.applying_path(node, FP))
    assert _apply(node).applied  # the FIFO blocks no boot, is no note, and the note replaces it
    assert notes.applying_path(node, FP).is_file() and target.exists()
    assert notes.clear_applying(node, FP)
    notes.applying_path(node, FP).write_bytes(b" " * (1 << 20))  # ours, huge: profile once
    assert _apply(node).reason is Verdict.UNFINISHED_BOOT


RO_SCRIPT = """
import json, os, subprocess, sys
from pathlib import Path
from plancache.trust.plans.gate import Decision, Verdict
from plancache.vllm_plugin.plan_health import node_memory, notes
from plancache.vllm_plugin.worker_boot import Boot
from plancache.cli.main import main as cli
plans = Path(sys.argv[1])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(plans)], check=True)
(plans / "startup_plan_{fp}.json").write_text("{{}}")
baked = json.dumps({{"plan_sha256": {sha!r}}})  # an image made from a node mid-boot
(plans / "plancache-applying-{fp}.json").write_text(baked)
subprocess.run(["mount", "-o", "remount,ro", str(plans)], check=True)
def boot():
    b = Boot.__new__(Boot)
    b.plan_sha256, b.note_path, b.unfinished, b.held_alert = {sha!r}, None, None, None
    b.note_fd = None
    return b
def apply(b):
    d = node_memory.before_vote(b, plans, Decision(True, Verdict.APPLIED, "", {kv}, {fp!r}))
    if b.note_fd is not None:  # the boot dies in its warm-up: the kernel closes its note
        os.close(b.note_fd)
    return d
first = apply(boot())
again = boot()
second = apply(again)
node_memory.compare_after_profile(None, again, plans, {kv} // 2)  # too large: held back
third = apply(boot())
held = notes.held_fingerprints(plans)
released = cli(["release", {fp!r}, "--dir", str(plans) + "/"])
fourth = apply(boot())
print(json.dumps([first.reason.value, second.reason.value, third.reason.value, held,
                  released, fourth.reason.value, first.detail]))
"""


def _read_only_run(node: Path, env: dict[str, str]) -> list:
    script = RO_SCRIPT.format(fp=FP, sha=SHA, kv=KV)
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", script, str(node)],
        env={**os.environ, **env, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_read_only_plan_directory_still_applies_with_its_notes_kept_elsewhere(
    node: Path, tmp_path: Path
) -> None:
    """Plans on a read-only mount (a tmpfs remounted ``ro``): the note goes to the node's state
    directory, so the plan applies and a crash after it is still caught; ``plancache release``
    (``--dir`` with a trailing slash) finds the hold-back there (red team 49, the regression:
    ``local-error``, profiling on every boot). A note the read-only image brought (made from a
    node mid-boot) is no boot of this node's: it could never be removed, and made every boot
    profile."""
    env = {"VLLM_CACHE_ROOT": str(tmp_path / "cache")}
    first, second, third, held, released, fourth, _ = _read_only_run(node, env)
    assert (first, second, third) == ("applied", "unfinished-boot", "plan-exceeds-profile")
    assert (held, released, fourth) == ([FP], 0, "applied")
    state = state_dir_for(node)
    assert state.parent == tmp_path / "cache" / "plancache-state"
    assert state.stat().st_mode & 0o777 == 0o700
    assert notes.APPLYING.format(fp=FP) in os.listdir(state)


def test_no_durable_place_at_all_applies_nothing_and_says_where_it_looked(
    node: Path, tmp_path: Path
) -> None:
    """Neither the read-only plan directory nor a state directory another user owns (or one
    open to group writes) takes the note: the plan is not applied (``local-error``, as issue 49
    says: a crash could loop), and the detail names both places and the fix."""
    shared = tmp_path / "shared"
    (shared / "plancache-state").mkdir(parents=True)
    os.chown(shared / "plancache-state", OTHER_UID, OTHER_UID)
    env = {"VLLM_CACHE_ROOT": str(tmp_path / "cache"), "PLANCACHE_STATE_DIR": str(shared)}
    first, *_, detail = _read_only_run(node, env)
    assert first == Reason.LOCAL_ERROR.value
    assert "Read-only file system" in detail and "owned by uid 65534" in detail
    os.chown(shared / "plancache-state", 0, 0)
    (shared / "plancache-state").chmod(0o777)
    first, *_, detail = _read_only_run(node, env)
    assert first == Reason.LOCAL_ERROR.value and "lets others write" in detail


def test_a_boot_still_running_is_not_an_unfinished_one(node: Path) -> None:
    """Two instances of one configuration on one node share the fingerprint and the note's name
    (two pods on one device, a rolling restart). B boots while A is in its warm-up: B applies
    too (A's note is locked by a live process), B's end never removes A's note nor A's B's, and
    only a boot that really died leaves an unfinished one (red team 49: B profiled beside A,
    compared, and held the good plan back on the node until an operator released it)."""
    a, b = _boot(), _boot()
    assert _apply(node, a, dies=False).applied
    assert _apply(node, b, dies=False).applied  # A alive: no unfinished boot
    node_memory.compare_after_profile(None, b, node, KV // 2)  # nothing to compare: no-op
    assert notes.held_fingerprints(node) == []
    node_memory.finished(None, a, None, None)  # A ends: the note under the name is B's now
    assert notes.applying_path(node, FP).exists()
    assert notes.recall(node, FP, SHA).unfinished is None  # B still alive
    os.close(b.note_fd)  # B dies in its warm-up
    assert _apply(node).reason is Verdict.UNFINISHED_BOOT


_FULL_DISK_BOOT = """
import os, resource, signal, sys
from pathlib import Path
from plancache.vllm_plugin.plan_health import node_memory
from plancache.trust.plans.gate import Decision, Verdict
from plancache.vllm_plugin.worker_boot import Boot
# a write past the limit fails (EFBIG), as on a full disk
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
boot = Boot.__new__(Boot)
boot.plan_sha256, boot.note_path, boot.unfinished = "a" * 64, None, None
boot.held_alert, boot.note_fd = None, None
applied = Decision(True, Verdict.APPLIED, "", 1 << 30, "0123456789abcdef")
d = node_memory.before_vote(boot, Path(sys.argv[1]), applied)
print(d.reason.value)
print(d.detail)
"""


def test_a_note_that_cannot_be_written_leaves_nothing_that_would_read_as_an_unfinished_boot(
    node: Path,
) -> None:
    """A write of the note that fails (a full disk: here a zero file-size limit, in both places
    the note may go) removes what it made: an empty note left behind would read as an
    unfinished boot on every later boot of the node until compared."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_BOOT, str(node)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    reason, detail = done.stdout.splitlines()[:2]
    assert reason == Reason.LOCAL_ERROR.value and "File too large" in detail
    state = state_dir_for(node)
    left = [p.name for p in (*node.iterdir(), *(state.iterdir() if state.is_dir() else ()))]
    assert left == [], left


class _Interleaved:
    """``fcntl`` for the notes module, running ``step`` (another boot's move) at the first
    ``flock`` of kind ``op``: the scheduling of two processes on one node, made certain; the
    files and the locks are the real ones."""

    def __init__(self, op: int, step: Callable[[], None]) -> None:
        self._op, self._step = op, step
        self.ran = False

    def __getattr__(self, name: str) -> Any:
        return getattr(fcntl, name)

    def flock(self, fd: int, op: int) -> None:
        if op & self._op and not self.ran:
            self.ran = True
            self._step()
        fcntl.flock(fd, op)


def test_a_note_is_never_seen_before_its_boot_holds_its_lock(
    node: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B reads the node (and probes the note's lock, ``LOCK_SH``) at the instant A's note is
    created, before A locks it. A note made under its own name was visible then, unlocked and
    empty: B took it for an unfinished boot (it profiles beside A and may hold the good plan
    back), and B's probe made A's ``LOCK_EX | LOCK_NB`` fail, so every boot during A's start-up
    found A's note unlocked (red team 7b: thousands a second under a tight loop)."""
    seen: list[object] = []
    probes: list[int] = []

    def b_reads() -> None:  # B's recall, holding its lock probe as A locks
        seen.append(notes.recall(node, FP, SHA).unfinished)
        with contextlib.suppress(FileNotFoundError):
            probe = os.open(notes.applying_path(node, FP), os.O_RDONLY)
            probes.append(probe)
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)

    shim = _Interleaved(fcntl.LOCK_EX, b_reads)
    monkeypatch.setattr(notes, "fcntl", shim)
    a = _boot()
    assert _apply(node, a, dies=False).applied
    monkeypatch.undo()
    for probe in probes:
        os.close(probe)
    assert shim.ran and seen == [None]
    assert notes.recall(node, FP, SHA).unfinished is None  # A's note is locked: A is running
    node_memory.finished(None, a, None, None)
    assert not notes.applying_path(node, FP).exists()


def test_a_boot_that_ends_while_another_reads_its_note_is_not_an_unfinished_one(
    node: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B opens A's note; A's start-up ends (its note removed, its lock let go); B then finds
    the note it holds unlocked. A note removed before its lock went is one whose boot ended,
    not one that died (red team 7b: B profiled beside A; also on 89a099a)."""
    a = _boot()
    assert _apply(node, a, dies=False).applied
    shim = _Interleaved(fcntl.LOCK_SH, lambda: node_memory.finished(None, a, None, None))
    monkeypatch.setattr(notes, "fcntl", shim)
    b = _boot()
    decision = _apply(node, b, dies=False)
    monkeypatch.undo()
    assert shim.ran
    assert decision.applied, decision
    node_memory.finished(None, b, None, None)


_NO_THREAD = """
import os, resource
os.setgid(65534)
os.setuid(65534)
resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))  # no thread to be had: a pod's pids limit
from plancache.vllm_plugin import deferred
ran = []
writes = deferred.DeferredWrites([("boot note", lambda: ran.append("note")), ("x", lambda: 1 / 0)])
print(ran, [what for what, _ in deferred.wait(writes)])
"""


def test_the_deferred_writes_are_made_at_once_when_no_thread_can_be_started() -> None:
    """A worker at its pids limit cannot start the thread the note's durability and the
    decision's record go to. That was raised out of the plugin's apply after it had set the
    plan's KV bytes: the hook said vLLM profiles while the plan applied, the note was never made
    durable and nothing said so, the decision never reached the boot record (red team 7b)."""
    interpreter_reachable()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _NO_THREAD], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "['note'] ['x']", done.stdout + done.stderr


_FORKED_JOIN = """
import os, threading
from plancache.vllm_plugin import deferred
release = threading.Event()
writes = deferred.DeferredWrites([("boot note", release.wait)])
child = os.fork()
if child == 0:  # the parent's thread does not exist here: its join must not wait for it
    os._exit(0 if deferred.wait(writes) == [] else 1)
_, status = os.waitpid(child, 0)
release.set()
print(os.waitstatus_to_exitcode(status), deferred.wait(writes), deferred.wait(writes))
"""


def test_a_forked_child_never_waits_for_its_parents_deferred_writes() -> None:
    """The deferred writes are joined on a lock their thread holds until they ran: a child forked
    meanwhile holds a copy of it, held for ever (the thread is the parent's); its join returns at
    once. The parent joins as often as it asks (the hook around ``determine_available_memory``,
    then the end of start-up)."""
    interpreter_reachable()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _FORKED_JOIN],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert done.stdout.strip() == "0 [] []", done.stdout + done.stderr


def test_a_deferred_record_write_holds_the_document_of_its_decision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decision's record is encoded on the deferred thread, after apply returned: what vLLM
    does meanwhile (a compile cache used, its saving set in place) belongs to a later write, not
    to this one, whose bytes are the decision's wherever they are encoded."""
    from plancache.vllm_plugin import record

    monkeypatch.setattr(record, "_root", lambda: tmp_path)
    worker = type("Worker", (), {"rank": 0})()
    later: list[tuple[str, Callable[[], None]]] = []
    written = record.note_plan(worker, "apply", "ok", "local", FP, "", 1.0, later=later)
    written.saved_ms["compile"] = 12.5  # as note_used sets it, before its own write waits
    written.plan = {**(written.plan or {}), "determine_ms": 3.0}
    [(what, write)] = later
    write()
    [path] = (tmp_path / "plancache" / "boot").iterdir()
    document = json.loads(path.read_bytes())
    assert what == "boot record"
    assert document["saved_ms"] == {"profiling": None, "compile": None}, document
    assert "determine_ms" not in document["plan"] and document["plan"]["decision"] == "apply"


_ORPHANED_HELPER = """
import concurrent.futures, multiprocessing, os, signal, sys
from pathlib import Path
from plancache.vllm_plugin.plan_health import notes
plans, fp, sha, pids = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
# the worker: notes the plan it applies (held and locked for its start-up), then in its profile
# pass forks a helper pool (inductor's compile pool with TORCHINDUCTOR_WORKER_START=fork), and
# dies there (the OOM killer): the pool lives on, an orphan
notes.note_applying(plans, fp, sha, 1, sync=False)
pool = concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"))
list(pool.map(abs, [1, 2]))
pids.write_text(" ".join(str(pid) for pid in pool._processes))
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_helper_the_worker_forked_does_not_keep_a_dead_boots_note_alive(
    node: Path, tmp_path: Path
) -> None:
    """The note's ``flock`` belongs to its open file, which a forked child shares: a pool the
    worker forked held it after the worker was killed, so the next boot took the dead boot's
    note for a live boot's and applied the plan that killed it, and every boot after it that
    died the same way (forking its pool again) did the same: the crash loop the note is there
    to stop (red team 8a, on the real vLLM worker). A forked child lets go of the lock at once."""
    interpreter_reachable()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    pids, errors = tmp_path / "helpers", tmp_path / "stderr"
    with errors.open("wb") as stderr:  # not a pipe: the orphans would hold it open
        worker = subprocess.run(
            [sys.executable, "-c", _ORPHANED_HELPER, str(node), FP, SHA, str(pids)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            timeout=120,
        )
    helpers = [int(pid) for pid in pids.read_text().split()] if pids.exists() else []
    try:
        assert worker.returncode == -9 and len(helpers) == 2, errors.read_text()
        assert all(os.path.exists(f"/proc/{pid}") for pid in helpers)  # the orphans live on
        recalled = notes.recall(node, FP, SHA)
        assert recalled.unfinished is not None, "a dead boot's note taken for a live one's"
        assert _apply(node).reason is Verdict.UNFINISHED_BOOT
    finally:
        for pid in helpers:
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
