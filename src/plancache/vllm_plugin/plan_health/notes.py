"""No crash loop on a plan: a durable note while a plan is being tried, and a hold-back after it.

Why: a node that applies a bad signed plan (too large for what its workload needs at start-up)
dies in its warm-up, restarts, finds the same verified plan, applies it again, and dies again,
for ever. So, beside the plan directory (one node's plans, one node's notes):

- ``plancache-applying-<fp>.json`` is written (atomically, locked before it is visible, durable
  before vLLM sizes the KV cache: :mod:`..deferred`) *before* a worker applies the plan for
  ``fp``, naming the plan's sha256; it is removed when the boot's start-up ends
  (``compile_or_warm_up_model`` returned). A boot that finds it, for the very plan it is about to
  apply, does not apply it (``unfinished-boot``): it profiles, and at its save compares what it
  profiled with the plan (:func:`plancache.trust.plans.gate.exceeds_profile`).
- ``plancache-held-<fp>.json`` is written when the plan exceeded that fresh profile by more than
  the margin: later boots profile (``plan-exceeds-profile``) until a *different* signed plan for
  ``fp`` arrives (another sha256) or the operator runs ``plancache release``.

Where the plan directory cannot hold a note (plans baked into a read-only image layer, a
read-only ConfigMap or volume mount), the note goes to the node's state directory for that plan
directory (:mod:`plancache.storage.local.state_dir`: ``$PLANCACHE_STATE_DIR``, else
``$VLLM_CACHE_ROOT``, ``/plancache-state/plans-<hash>/``, this user's, 0700), and both places
are read at every boot: the plan still applies, and a crash after it is still caught. Only when
neither place takes the note does the worker not apply the plan (``local-error``): a crash
after it could loop.

Two boots of one configuration on one node (two instances sharing a device, a rolling restart)
share the fingerprint and so the note's name. A boot holds an exclusive ``flock`` on its note from
before the note is visible until its start-up ends; the kernel drops it when the process dies
(SIGKILL included, across PID namespaces). A note whose lock is held belongs to a boot still
running: it is not an unfinished boot (the other boot applies the plan too, and never clears
or compares against it), and a boot removes the note at its end only if it is still its own.
A process the worker forks (a compile pool started with ``fork``) shares the locked note and
would keep its lock past the worker's death: every forked child lets go of it at once
(:attr:`plancache.vllm_plugin.plugin_state.PluginState.held`).

The notes decide nothing about trust: they only ever turn an "apply" into a "profile". Every
byte read back is hostile. A note counts only as a regular file of this process's user, read
without following a link and capped: another user's file (a co-tenant of a group-writable plan
directory) is never this node's memory, so it can neither hold a good plan back nor make a node
profile. An unfinished-boot note of this user that does not parse counts as present (profile
once more, then it is compared and cleared: the safe side); a hold-back must name the very
plan's sha256, since it lasts until an operator acts: one that does not is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from ...clock import REAL_CLOCK
from ...storage.local.dirfds import NEW_FILE, read_only, temp_name
from ...storage.local.state_dir import open_state_dir, state_dir_for
from ...trust.errors import PlanCacheError, StoreError
from ...trust.plans.plan import is_fingerprint
from .. import plugin_state

_ENCODE = json.JSONEncoder(sort_keys=True).encode
"""``json.dumps(..., sort_keys=True)`` without a new encoder made at each call (a boot's
critical path writes a note)."""
APPLYING = "plancache-applying-{fp}.json"
HELD = "plancache-held-{fp}.json"
MAX_NOTE_BYTES = 4096


def applying_path(directory: Path, fp: str) -> Path:
    return directory / APPLYING.format(fp=fp)


def held_path(directory: Path, fp: str) -> Path:
    return directory / HELD.format(fp=fp)


def _places(directory: Path) -> Iterator[int]:
    """A descriptor of each place this node's notes for ``directory`` may be in: the plan
    directory (unless mounted read-only: no boot of this node wrote what an image layer or a
    ConfigMap brought, and a note there could never be removed), then its state directory (only
    when it exists and is safe)."""
    for opener in (
        lambda: os.open(directory, os.O_RDONLY | os.O_DIRECTORY),
        lambda: open_state_dir(directory, create=False),
    ):
        try:
            fd = opener()
        except (OSError, PlanCacheError):
            continue
        try:
            if not read_only(fd):
                yield fd
        finally:
            os.close(fd)


def _read(dir_fd: int, name: str) -> dict[str, Any] | None:
    """The note ``name`` in ``dir_fd``: None if absent or not this user's regular file; ``{}``
    if this user's but unreadable or not a JSON object (still a note)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError:  # a link (never followed) is no note of ours: we only ever rename files
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or _alive(fd):
            return None
        if os.fstat(fd).st_nlink == 0:  # its boot removed it, then let go of its lock: it ended
            return None
        data = b""
        while len(data) <= MAX_NOTE_BYTES:
            chunk = os.read(fd, MAX_NOTE_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        return {}
    finally:
        os.close(fd)
    if len(data) > MAX_NOTE_BYTES:
        return {}
    try:
        obj = json.loads(data)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def _unlink(dir_fd: int, name: str) -> bool:
    try:
        os.unlink(name, dir_fd=dir_fd)
        return True
    except OSError:
        return False


def _alive(fd: int) -> bool:
    """Whether a running boot holds the note open at ``fd`` (its exclusive lock); a filesystem
    without ``flock`` tells nothing (False: as if no boot held it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _write_at(dir_fd: int, name: str, data: bytes, *, hold: bool, sync: bool) -> int | None:
    """``data`` under ``name`` in ``dir_fd``: an unpredictable ``O_EXCL | O_NOFOLLOW`` temporary,
    locked (``hold``) before anything is in it, written, renamed over ``name``; durably with
    ``sync`` (the file fsynced before the rename, the directory after it), else the caller makes
    it durable later (:func:`make_durable`). With ``hold`` the open, locked note is returned (the
    caller keeps it for the boot).

    Never made under its own name, even when the name is free: a note is visible only locked
    and whole. Another instance of the configuration reading the node meanwhile would otherwise
    find it unlocked and empty, an unfinished boot (it profiles beside this one and may hold the
    good plan back), and its lock probe (``LOCK_SH``) at that instant makes this boot's
    ``LOCK_EX | LOCK_NB`` fail, leaving the note unlocked for the whole start-up (red team 7b).
    Without ``sync``, a node reset before :func:`make_durable` may leave the name with no bytes:
    that counts as present (the safe side), and the plan's memory was not in use yet."""
    tmp = temp_name(name)
    fd = os.open(tmp, NEW_FILE, 0o644, dir_fd=dir_fd)
    held = plugin_state.current().held
    try:
        if hold:
            held.add(fd)  # a child forked from now on lets go of it (plugin_state._forked)
            with contextlib.suppress(OSError):  # no flock here: the note still says it all
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        tmp = ""
        if sync:
            with contextlib.suppress(OSError):  # a filesystem that cannot sync directories
                os.fsync(dir_fd)
    except BaseException:
        if tmp:
            _unlink_own(tmp, fd, dir_fd)
        held.discard(fd)
        os.close(fd)
        raise
    if hold:
        return fd
    os.close(fd)
    return None


def _unlink_own(name: str | Path, fd: int, dir_fd: int | None = None) -> None:
    """Remove ``name`` only while it is still the file open at ``fd`` (what this boot made):
    another boot of the same fingerprint may have put its own note there since."""
    with contextlib.suppress(OSError):
        mine, there = os.fstat(fd), os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
            os.unlink(name, dir_fd=dir_fd)


def _write(
    directory: Path, name: str, data: bytes, *, hold: bool = False, sync: bool = True
) -> tuple[Path, int | None]:
    """Write a note durably in the plan directory, else in its state directory; where it went
    (and, ``hold``, the note kept open and locked).

    Raises:
        StoreError: neither place took it, naming both failures (``store-error``).
    """
    try:
        try:
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:  # vLLM makes it at its first save: none yet on a fresh node
            directory.mkdir(parents=True, exist_ok=True)
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            return directory / name, _write_at(dir_fd, name, data, hold=hold, sync=sync)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        first = f"cannot write {directory / name}: {exc.strerror or exc}"
    where = state_dir_for(directory)
    try:
        dir_fd = open_state_dir(directory, create=True)
    except (OSError, PlanCacheError) as exc:
        detail = exc.detail if isinstance(exc, PlanCacheError) else (exc.strerror or str(exc))
        raise StoreError(f"{first}; nor in {where}: {detail}") from None
    try:
        return where / name, _write_at(dir_fd, name, data, hold=hold, sync=sync)
    except OSError as exc:
        raise StoreError(f"{first}; nor in {where}: {exc.strerror or exc}") from None
    finally:
        os.close(dir_fd)


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(REAL_CLOCK.wall()))


def note_applying(
    directory: Path, fp: str, plan_sha256: str, kv: int, *, sync: bool = True
) -> tuple[Path, int | None]:
    """Write the note before the plan is applied (the plan directory, else its state
    directory); where it went, and the note held open and locked until :func:`finish`. Raises
    what the write raises: a boot that cannot leave the note anywhere does not apply the plan
    (it could loop). Durable on return, unless ``sync`` is false: then the caller makes it so
    (:func:`make_durable`) before the plan's KV cache is sized (:mod:`..deferred`)."""
    body = {
        "fingerprint": fp,
        "plan_sha256": plan_sha256,
        "kv_cache_memory_bytes": kv,
        "pid": os.getpid(),
        "time": _stamp(),
    }
    return _write(directory, APPLYING.format(fp=fp), _ENCODE(body).encode(), hold=True, sync=sync)


def make_durable(path: Path, fd: int) -> None:
    """The note open at ``fd`` fsynced, then its directory (``path``'s parent): the name and its
    bytes survive a node reset.

    Raises:
        OSError: the note's fsync failed (the directory's, on a filesystem that cannot sync
            one, is ignored, as at a synchronous write).
    """
    os.fsync(fd)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with contextlib.suppress(OSError):  # a filesystem that cannot sync directories
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class Recalled(NamedTuple):
    """What this node remembers of one plan (:func:`recall`)."""

    held: dict[str, Any] | None
    """Its hold-back (``plan-exceeds-profile``), or None."""
    unfinished: dict[str, Any] | None
    """The note an earlier boot left while applying it (``unfinished-boot``), or None."""


def recall(directory: Path, fp: str, plan_sha256: str) -> Recalled:
    """This node's memory of the plan ``plan_sha256`` for ``fp``, read in one pass over the
    places notes may be in (a boot's critical path opens each place once).

    A hold-back must name this very plan: one of other bytes (a different signed plan for the
    fingerprint arrived), or of no bytes it names, is removed. An unfinished-boot note naming
    other bytes is a note for a plan since replaced (removed); one naming none (unreadable,
    partial) counts as this plan's: the safe side."""
    held_name, applying_name = HELD.format(fp=fp), APPLYING.format(fp=fp)
    held: dict[str, Any] | None = None
    left: dict[str, Any] | None = None
    for fd in _places(directory):
        note = _read(fd, held_name)
        if note is not None:
            if note.get("plan_sha256") != plan_sha256:
                _unlink(fd, held_name)
            elif held is None:
                held = note
        note = _read(fd, applying_name)
        if note is not None:
            if note.get("plan_sha256") not in (None, plan_sha256):
                _unlink(fd, applying_name)
            elif left is None:
                left = note
    return Recalled(held, left)


def hold_back(directory: Path, fp: str, plan_sha256: str, plan_kv: int, profiled_kv: int) -> None:
    """Hold this plan back on this node (written durably, where the notes go)."""
    body = {
        "fingerprint": fp,
        "plan_sha256": plan_sha256,
        "kv_cache_memory_bytes": plan_kv,
        "profiled_kv_cache_memory_bytes": profiled_kv,
        "time": _stamp(),
    }
    _write(directory, HELD.format(fp=fp), _ENCODE(body).encode())


def clear(path: Path) -> bool:
    """Remove a note (or a file) by its path; True if one was there."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def finish(path: Path, fd: int | None) -> None:
    """This boot's note is done with: removed if the name still holds this boot's note (another
    boot of the same fingerprint may have written its own since), and its lock released."""
    try:
        if fd is None:
            clear(path)
        else:
            _unlink_own(path, fd)
    finally:
        if fd is not None:
            plugin_state.current().held.discard(fd)
            os.close(fd)


def clear_applying(directory: Path, fp: str) -> bool:
    """Remove this fingerprint's unfinished-boot note wherever it is; True if one was there."""
    return _clear_everywhere(directory, APPLYING.format(fp=fp))


def release(directory: Path, fp: str) -> bool:
    """``plancache release``: remove the hold-back (and any unfinished-boot note) of ``fp``
    wherever they are; True if a hold-back was there."""
    clear_applying(directory, fp)
    return _clear_everywhere(directory, HELD.format(fp=fp))


def _clear_everywhere(directory: Path, name: str) -> bool:
    removed = False
    for fd in _places(directory):
        if _read(fd, name) is not None:  # only this user's notes: never another's file
            removed = _unlink(fd, name) or removed
    return removed


def held_fingerprints(directory: Path) -> list[str]:
    """Fingerprints this node holds back (``plancache release`` lists and clears them)."""
    prefix, suffix = HELD.split("{fp}")
    found: set[str] = set()
    for fd in _places(directory):
        with contextlib.suppress(OSError):
            for n in os.listdir(fd):
                fp = n[len(prefix) : -len(suffix)]
                named = n.startswith(prefix) and n.endswith(suffix) and is_fingerprint(fp)
                if named and _read(fd, n) is not None:  # this user's, not a co-tenant's
                    found.add(fp)
    return sorted(found)
