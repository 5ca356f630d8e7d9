"""An exclusive lock beside one directory, shared by every process of the node that uses it.

One rank of a node pulls, verifies, quarantines or installs a compile cache, or fetches a plan
set, while the others wait: ``<name>.plancache.lock`` beside the directory, reached through
descriptors (:mod:`.dirfds`: no link followed, this user's, closed to others' writes), taken
with a non-blocking ``flock`` polled until a bounded wait runs out, so a holder that never lets
go costs a bounded wait, never a hang.

It sits apart from the compile cache's modules because it locks any directory: the compile
caches (:mod:`..compile_cache.cachedir`) and the plan sets a node reads
(:mod:`plancache.pipeline.plan_sets.node_plans`) take the same lock, and neither feature owns it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from ...clock import REAL_CLOCK, Clock, Deadline
from ...settings import BULK_TIMEOUT
from ...trust.errors import Reason, StoreError, StoreTimeout
from . import dirfds

LOCK_SUFFIX = ".plancache.lock"
LOCK_WAIT = BULK_TIMEOUT
""":func:`locked`'s wait when the caller names none (the whole-store budget): no wait is
endless."""


def lock_path(directory: Path) -> Path:
    """The lock file of ``directory``: ``<name>.plancache.lock`` beside it."""
    return directory.with_name(directory.name + LOCK_SUFFIX)


@contextlib.contextmanager
def locked(
    base: Path,
    directory: Path,
    *,
    wait: float | None = None,
    write: bool = False,
    clock: Clock = REAL_CLOCK,
) -> Iterator[bool]:
    """An exclusive lock on ``directory`` (reached from ``base``), shared by every rank on the
    node: one of them works on the directory while the others wait (``<name>.plancache.lock``
    beside it, opened without following a link, this user's and closed to others' writes).

    ``wait`` bounds the wait in seconds (None: :data:`LOCK_WAIT`). Yields True with the lock
    held; False only on a read-only filesystem (``ST_RDONLY``): nobody writes through this
    mount, so the caller may read. ``write`` (sign, publish, pull) makes that an error at once.
    ``clock``: what the wait is measured and polled on (a caller's deadline's).

    Raises:
        StoreTimeout: the lock is still held by another process after ``wait`` (reason
            ``timeout``), naming the lock.
        StoreError: the lock file is another user's or open to others' writes (reason
            ``unsafe-directory``); this user cannot open or make it, or the filesystem cannot
            lock it (``ENOLCK``: ``lock-unavailable``), or
            cannot reach the directory (``local-error``): the caller stops, never works
            unlocked. With ``write``, a read-only filesystem (``local-error``).
    """
    lock = lock_path(directory)
    fd = _open_lock(base, directory, lock)
    if fd is None:
        if write:
            raise StoreError(
                f"{directory.parent} is on a read-only filesystem; nothing can be written there",
                reason=Reason.LOCAL_ERROR,
            )
        yield False
        return
    try:
        _acquire(fd, lock, LOCK_WAIT if wait is None else wait, clock)
        yield True
    finally:
        os.close(fd)


def _open_lock(base: Path, directory: Path, lock: Path) -> int | None:
    """The lock file's descriptor; None on a read-only filesystem (no lock can be made there)."""
    try:
        with dirfds.opened_dir(base, directory.parent) as parent:
            try:
                return dirfds.open_shared_file(parent, lock.name)
            except OSError:  # re-raised only when the lock's own filesystem is read-only
                return None
    except StoreError as exc:
        raise StoreError(f"the lock {lock} is not taken: {exc.detail}", reason=exc.reason) from None
    except OSError as exc:  # reaching the directory: a missing one cannot be made
        if exc.errno == errno.EROFS:
            return None
        reason = (
            Reason.LOCK_UNAVAILABLE
            if exc.errno in (errno.EACCES, errno.EPERM)
            else Reason.LOCAL_ERROR
        )
        raise StoreError(
            f"cannot lock {directory} ({lock}: {exc.strerror or exc})", reason=reason
        ) from None


def _acquire(fd: int, lock: Path, wait: float, clock: Clock) -> None:
    """``flock`` without blocking, polled until ``wait`` runs out: a blocking ``flock`` cannot
    be bounded, and a holder that never lets go must cost a bounded wait, never a hang. A
    filesystem that cannot lock at all (``ENOLCK``: NFS without lockd) is ``lock-unavailable``:
    the caller stops, never works unlocked."""
    deadline = Deadline.after(max(wait, 0.0), clock)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            left = deadline.remaining()
            if left <= 0:
                raise StoreTimeout(
                    f"another process has held the lock {lock} for over {wait:g} s; nothing done"
                ) from None
            clock.sleep(min(0.05, left))
        except OSError as exc:  # ENOLCK (NFS without lockd), EINVAL, ...: no lock to be had here
            raise StoreError(
                f"cannot lock {lock}: flock fails on this filesystem ({exc.strerror or exc}); "
                "nothing done. Put VLLM_CACHE_ROOT on a filesystem with working flock (a local "
                "disk, an emptyDir; on NFS run lockd or mount with local_lock=flock)",
                reason=Reason.LOCK_UNAVAILABLE,
            ) from None
