"""Where a private root may be, and whether the boots in one are alive (:mod:`.boot_dirs`
explains why each rule holds; this is the part that reads the filesystem to decide).

A *named* root (``$PLANCACHE_PRIVATE_DIR``, ``$VLLM_CACHE_ROOT/plancache-private``) is opened,
made if missing, and used only if its whole path is safe; a *fresh* root is made by this process
in a temporary directory under a name nobody could have guessed. A boot is alive while its lock
is held; a sweep removes what a dead one left.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ...trust.errors import Reason, StoreError
from ..local import dirfds
from .header_files import HEADERS_SUBDIR

PRIVATE_SUBDIR = "plancache-private"
COLD_SUBDIR = "plancache-cold"
TEMP_PARENTS = ("/tmp", "/var/tmp", "/dev/shm")
"""Where a fresh root may be made after ``<tempdir>`` (a ``TMPDIR`` on a shared volume fails
the whole-path check; these are sticky or root's on a usual node)."""
PRIVATE_DIR_ENV = "PLANCACHE_PRIVATE_DIR"
BOOT_PREFIX = "boot-"
LOCK_SUFFIX = ".lock"


def candidates(cache_root: Path, environ: Mapping[str, str] = os.environ) -> list[Path]:
    """The named private roots to try, in order (see the module); after them, a fresh root in
    one of :func:`temp_parents`."""
    found = [Path(environ[PRIVATE_DIR_ENV])] if environ.get(PRIVATE_DIR_ENV, "").strip() else []
    found.append(cache_root / PRIVATE_SUBDIR)
    return found


def temp_parents() -> list[Path]:
    """Where a fresh root may be made, in order: ``<tempdir>``, then :data:`TEMP_PARENTS`.

    ``<tempdir>`` only when Python finds one: ``tempfile.gettempdir()`` raises when it can
    write to none of its candidates (a co-tenant filled ``/tmp``, ``TMPDIR`` unset, the
    working directory read-only), and that must end in ``no-private-dir`` like every other
    unusable place, never escape the guard (which then pinned none of torch's caches)."""
    try:
        first = [tempfile.gettempdir()]
    except OSError:
        first = []
    found: list[Path] = []
    for parent in (*first, *TEMP_PARENTS):
        path = Path(os.path.abspath(parent))
        if path not in found:
            found.append(path)
    return found


def check_chain(directory: Path) -> Path:
    """``directory`` with its links resolved, once every directory from ``/`` down to it is
    root's or this user's and closed to group and world writes (or sticky).

    Raises:
        StoreError: naming the first directory that is not (reason ``unsafe-directory``).
        OSError: a directory on the way cannot be looked up.
    """
    real = Path(os.path.realpath(directory))
    me = os.geteuid()
    for step in [real, *real.parents][::-1]:
        st = os.lstat(step)
        loose = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
        if st.st_uid not in (0, me) or loose:
            owner = (
                f"uid {st.st_uid}'s"
                if st.st_uid not in (0, me)
                else f"mode {stat.S_IMODE(st.st_mode):04o}"
            )
            raise StoreError(
                f"{step} ({owner}) lets another user replace what lies below it",
                reason=Reason.UNSAFE_DIRECTORY,
            )
    return real


def open_private_root(private_root: Path, *, need_exec: bool = True) -> tuple[Path, int]:
    """(the private root's resolved path, a descriptor of it), made 0700 if missing, once its
    parent's chain, its owner and mode, and its filesystem pass (see the module).

    Raises:
        StoreError: an unsafe directory on the way or the root itself another user's or open to
            others (reason ``unsafe-directory``); a link on the way (``store-error``); a
            read-only or, with ``need_exec``, ``noexec`` filesystem (``no-private-dir``).
        OSError: the root or its parent cannot be made or opened.
    """
    parent = private_root.parent
    with contextlib.suppress(FileExistsError):
        os.makedirs(parent, exist_ok=True)
    real_parent = check_chain(parent)
    fd = dirfds.open_dir(real_parent, real_parent / private_root.name, create=True, mode=0o700)
    try:
        where = real_parent / private_root.name
        _require_usable(fd, where, need_exec)
        return where, fd
    except BaseException:
        os.close(fd)
        raise


def open_fresh_root(parent: Path, kind: str, *, need_exec: bool = True) -> tuple[Path, int]:
    """(a root this process just made in ``parent``, a descriptor of it): named
    ``<kind>-<uid>-<16 random hex>`` by ``mkdir`` mode 0700 (which fails on any existing name,
    a planted link included), opened through ``parent``'s descriptor without following a link
    and checked as :func:`open_private_root` checks a named root, once ``parent``'s whole path
    passes :func:`check_chain`. The dead fresh roots of this user beside it are swept first.

    Raises:
        StoreError: as :func:`open_private_root`.
        OSError: ``parent`` cannot be opened or written.
    """
    real_parent = check_chain(parent)
    parent_fd = os.open(real_parent, dirfds.DIR_FLAGS)
    try:
        prefix = f"{kind}-{os.geteuid()}-"
        _sweep_fresh(parent_fd, prefix)
        for _ in range(8):
            name = prefix + secrets.token_hex(8)
            try:
                os.mkdir(name, 0o700, dir_fd=parent_fd)
                break
            except FileExistsError:
                continue
        else:
            raise StoreError(f"{real_parent}: no fresh name free", reason=Reason.NO_PRIVATE_DIR)
        where = real_parent / name
        try:
            fd = os.open(name, dirfds.DIR_FLAGS, dir_fd=parent_fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=parent_fd)
            raise
        try:
            _require_usable(fd, where, need_exec)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=parent_fd)
            raise
        return where, fd
    finally:
        os.close(parent_fd)


def _require_usable(fd: int, where: Path, need_exec: bool) -> None:
    """The root open at ``fd`` is this user's, mode 0700, on a writable (and, with
    ``need_exec``, exec-capable) filesystem."""
    dirfds.require_owned(fd, where, private=True)
    flags = os.fstatvfs(fd).f_flag
    if flags & os.ST_RDONLY:
        raise StoreError(f"{where}: read-only filesystem", reason=Reason.NO_PRIVATE_DIR)
    if flags & os.ST_NOEXEC and need_exec:
        raise StoreError(
            f"{where}: noexec filesystem (compiled shared objects cannot be mapped there)",
            reason=Reason.NO_PRIVATE_DIR,
        )


def _sweep_fresh(parent_fd: int, prefix: str) -> None:
    """Remove this user's fresh roots (``prefix``) in the parent whose boots are gone: swept by
    their locks (:func:`sweep_fd`), then removed whole once nothing but their headers is left.
    A root of another user, open to others, or a link is left alone; so is one without a
    finished boot in it (it may be another process's, just made)."""
    for name in os.listdir(parent_fd):
        if not name.startswith(prefix):
            continue
        try:
            fd = os.open(name, dirfds.DIR_FLAGS, dir_fd=parent_fd)
        except OSError:
            continue
        try:
            dirfds.require_owned(fd, name, private=True)
            if not any(removed.startswith(BOOT_PREFIX) for removed in sweep_fd(fd)):
                continue
            if set(os.listdir(fd)) <= {HEADERS_SUBDIR}:
                shutil.rmtree(name, ignore_errors=True, dir_fd=parent_fd)
        except (StoreError, OSError):
            continue
        finally:
            os.close(fd)


def is_alive(dir_fd: int, boot_name: str, *, missing: bool = True) -> bool:
    """Whether the process that made ``boot_name`` in the private root ``dir_fd`` still runs:
    its lock is held. A lock file that cannot be opened counts as alive (never remove what might
    be in use), and so does a missing one unless ``missing`` is False: a temporary's name carries
    a boot only once that boot's lock exists, so there a missing lock means a finished boot."""
    try:
        fd = os.open(
            boot_name + LOCK_SUFFIX, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd
        )
    except FileNotFoundError:
        return missing
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:  # held (EWOULDBLOCK), or a lock this filesystem cannot give: alive
        return True
    finally:
        os.close(fd)


def sweep_fd(dir_fd: int) -> list[str]:
    """Remove the boot directories (and their locks) of processes that are gone, and the
    temporaries they left in ``headers/``; returns the names removed. Each is removed while
    its lock is held by the sweep, so a process can never come back to a half-removed one."""
    removed = []
    for name in sorted(os.listdir(dir_fd)):
        if not (name.startswith(BOOT_PREFIX) and name.endswith(LOCK_SUFFIX)):
            continue
        boot = name[: -len(LOCK_SUFFIX)]
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: its process runs (in this PID namespace or another)
            shutil.rmtree(boot, ignore_errors=True, dir_fd=dir_fd)
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
            removed.append(boot)
        finally:
            os.close(fd)
    removed += _sweep_header_temporaries(dir_fd)
    return removed


def _sweep_header_temporaries(dir_fd: int) -> list[str]:
    """Temporaries a header fetch left in ``headers/`` when its process died: their names carry
    the boot that wrote them (:func:`plancache.storage.local.dirfds.temp_name`)."""
    removed = []
    with contextlib.suppress(OSError), dirfds.opened_dir_at(dir_fd, HEADERS_SUBDIR) as headers:
        for name in os.listdir(headers):
            boot = dirfds.temp_owner(name)
            if boot and not is_alive(dir_fd, boot, missing=False):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=headers)
                    removed.append(f"{HEADERS_SUBDIR}/{name}")
    return removed
