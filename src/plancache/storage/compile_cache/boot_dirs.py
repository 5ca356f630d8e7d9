"""Where a worker process keeps its private copies: owned, reached without links, alive by lock.

The guard hands vLLM copies of verified caches, and those copies are only as safe as the place
they live in. On a real node that place is shared in every way a test machine is not: several
pods mount one cache root (hostPath, RWX volume, NFS) from their own PID namespaces, vLLM
creates the root with the process umask (often group-writable), containers run as other users
on read-only roots with a ``noexec`` tmpfs on ``/tmp``, and vLLM forks its workers after the
plugin was loaded. So a *private root* (the directory holding every boot directory of one user)
is used only when all of this holds, checked at each boot:

- every directory from ``/`` down to the private root's parent belongs to root or this user and
  is closed to group and world writes unless it is sticky (``/tmp``): nobody else can rename a
  directory on the way and put another tree under the same path;
- the private root is reached from that parent without following a link, is this user's and
  mode 0700 (:func:`plancache.storage.local.dirfds.require_owned`);
- its filesystem is writable and not mounted ``noexec``: the copies hold shared objects that
  torch maps with ``dlopen``, so a copy where code cannot be mapped would say ``load`` and fail.

The candidates, first usable wins: ``$PLANCACHE_PRIVATE_DIR`` (the operator's choice for
read-only roots), ``$VLLM_CACHE_ROOT/plancache-private`` (the cache's own filesystem: compiled
``.so`` files load where vLLM already loads them), then a *fresh* root made by this process in a
temporary directory (``<tempdir>``, ``/tmp``, ``/var/tmp``, ``/dev/shm``, the first whose whole
path passes): ``plancache-private-<uid>-<16 random hex>``, made with ``mkdir`` (which never
takes an existing name) mode 0700 and checked through its descriptor. Never a fixed name there:
any local user can create a fixed name in a shared ``/tmp`` first, and the worker would then
have no private place (or, before the owner check, someone else's). A fresh root lives as long
as its one boot; the dead ones of this user are swept by the next fresh one (by their locks).
None usable is :class:`~plancache.trust.errors.StoreError` ``no-private-dir`` naming each
candidate and what is wrong with it: the guard then makes vLLM compile cold, never read a cache
unchecked.

Each process gets its own ``boot-<random>`` directory (mode 0700) and holds an exclusive
``flock`` on ``boot-<random>.lock`` beside it for as long as it runs. A sweep removes the boot
directory of a lock it can take: its process is gone. ``flock`` is held by the kernel's open
file, not by a pid, so this holds across PID namespaces on one host (a pid from another pod's
namespace says nothing here), and a forked child that inherits the descriptor keeps its parent's
directory alive, never the reverse. Over NFS, Linux maps ``flock`` to NFS byte-range locks
(NLM or NFSv4), which other hosts see while the lock holder's lease lives. A boot directory
without a lock file (an older plancache's) is never removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

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

__all__ = ["PRIVATE_DIR_ENV", "PRIVATE_SUBDIR", "BootDir", "private_root", "sweep"]

T = TypeVar("T")


@dataclass(frozen=True)
class BootDir:
    """One process's private directory, and the lock that proves the process alive."""

    path: Path
    root: Path
    """The private root holding it (and the node's precompiled headers, ``root/headers``)."""
    pid: int
    lock_fd: int
    passed_over: tuple[str, ...] = ()
    """The candidates tried before this one, each with why it was not used (for the log line)."""
    fresh: bool = False
    """Its root was made by this process for this boot alone (removed with it)."""

    def close_at_exit(self) -> None:
        """:meth:`close` when this process exits, however it exits normally: ``atexit``, and
        also ``multiprocessing``'s exit finalizers, as a worker that ``multiprocessing`` forks
        (vLLM's) ends in ``os._exit``, which runs no ``atexit`` hook (its fresh root, with
        its header, would stay in a temporary directory, often memory, until the next boot's
        sweep). Closed once, whichever runs first."""
        import atexit
        import multiprocessing.util

        closed: list[bool] = []

        def close_once() -> None:
            if not closed:
                closed.append(True)
                self.close()

        atexit.register(close_once)
        multiprocessing.util.Finalize(None, close_once, exitpriority=0)

    def close(self) -> None:
        """Remove the directory and its lock (at exit, by the process that made it only); a
        fresh root goes with them."""
        if os.getpid() != self.pid:
            return
        if self.fresh:
            with contextlib.suppress(OSError):
                parent = os.open(self.root.parent, dirfds.DIR_FLAGS)
                try:
                    shutil.rmtree(self.root.name, ignore_errors=True, dir_fd=parent)
                finally:
                    os.close(parent)
            with contextlib.suppress(OSError):
                os.close(self.lock_fd)
            return
        with (
            contextlib.suppress(OSError),
            dirfds.opened_dir(self.root.parent, self.root, create=False) as fd,
        ):
            shutil.rmtree(self.path.name, ignore_errors=True, dir_fd=fd)
            os.unlink(self.path.name + LOCK_SUFFIX, dir_fd=fd)
        with contextlib.suppress(OSError):
            os.close(self.lock_fd)


def new_boot_dir(cache_root: Path, environ: Mapping[str, str] = os.environ) -> BootDir:
    """A fresh boot directory in the first usable private root (with the candidates passed over
    before it, and why): raises :func:`private_root`'s ``StoreError`` (``no-private-dir``)
    naming every candidate and why it was not used."""
    problems: list[str] = []

    def make(opened: tuple[Path, int], fresh: bool) -> BootDir:
        boot = _boot_in(*opened)
        return dataclasses.replace(boot, passed_over=tuple(problems), fresh=fresh)

    return _first_usable(
        [*candidates(cache_root, environ), *temp_parents()],
        len(candidates(cache_root, environ)),
        make,
        problems,
    )


def private_root(cache_root: Path, environ: Mapping[str, str] = os.environ) -> Path:
    """The private root a worker of this user would use on this node (the CLI installs the
    node's precompiled headers into its ``headers/``).

    Only the named candidates: a fresh root lives for one boot, so nothing installed into one
    would ever be used again.

    Raises:
        StoreError: no named candidate is usable, each named with why (``no-private-dir``).
    """

    def resolved(opened: tuple[Path, int], fresh: bool) -> Path:
        os.close(opened[1])
        return opened[0]

    named = candidates(cache_root, environ)
    return _first_usable(named, len(named), resolved, [])


def _first_usable(
    places: list[Path],
    named: int,
    use: Callable[[tuple[Path, int], bool], T],
    problems: list[str],
    *,
    need_exec: bool = True,
    kind: str = PRIVATE_SUBDIR,
) -> T:
    """``use`` of the first usable place: the first ``named`` are private roots themselves
    (:func:`open_private_root`), the rest parents to make a fresh root in
    (:func:`open_fresh_root`). ``problems`` collects why each earlier one was not used."""
    for index, place in enumerate(places):
        try:
            if index < named:
                opened = open_private_root(place, need_exec=need_exec)
            else:
                opened = open_fresh_root(place, kind, need_exec=need_exec)
        except StoreError as exc:
            problems.append(exc.detail)
            continue
        except OSError as exc:
            problems.append(f"{place}: {exc.strerror or exc}")
            continue
        try:
            return use(opened, index >= named)
        except (StoreError, OSError) as exc:
            problems.append(
                exc.detail if isinstance(exc, StoreError) else f"{place}: {exc.strerror or exc}"
            )
            if index >= named:  # the fresh root made for it, empty
                with contextlib.suppress(OSError):
                    os.rmdir(opened[0])
    raise StoreError(
        "no private directory for compile-cache copies: "
        + "; ".join(problems)
        + f"; set {PRIVATE_DIR_ENV} to a directory of this user's on an exec-capable filesystem",
        reason=Reason.NO_PRIVATE_DIR,
    )


def new_scratch_dir() -> BootDir:
    """Where vLLM compiles cold when no private root is usable: a boot directory in a fresh
    ``plancache-cold-<uid>-<random>`` this process makes in one of :func:`temp_parents` (never
    a fixed name), removed with the boot and swept like a fresh private root. Never on a
    ``noexec`` filesystem: nothing verified is handed over from it, but the cold compile itself
    ``dlopen``s the shared objects it builds there (a ``noexec`` scratch fails the boot).

    Raises:
        StoreError: even that cannot be had (reason ``no-private-dir``, naming each place).
    """
    problems: list[str] = []
    try:
        return _first_usable(
            temp_parents(),
            0,
            lambda opened, fresh: dataclasses.replace(_boot_in(*opened), fresh=True),
            problems,
            kind=COLD_SUBDIR,
        )
    except StoreError:
        raise StoreError(
            "no scratch directory: " + "; ".join(problems), reason=Reason.NO_PRIVATE_DIR
        ) from None


def _boot_in(where: Path, fd: int) -> BootDir:
    """A new boot directory in the private root open at ``fd`` (closed here)."""
    try:
        sweep_fd(fd)
        name = f"{BOOT_PREFIX}{secrets.token_hex(8)}"
        lock_fd = _locked_file(fd, name + LOCK_SUFFIX)
        try:
            os.mkdir(name, 0o700, dir_fd=fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(name + LOCK_SUFFIX, dir_fd=fd)
            os.close(lock_fd)
            raise
        return BootDir(where / name, where, os.getpid(), lock_fd)
    finally:
        os.close(fd)


def _locked_file(dir_fd: int, name: str) -> int:
    """``name`` made and locked before it is visible: created under a temporary name, locked,
    then linked into place, so no sweep ever sees it unlocked."""
    tmp = dirfds.temp_name(name)
    fd = os.open(tmp, dirfds.NEW_FILE, 0o600, dir_fd=dir_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    except BaseException:
        os.close(fd)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
    return fd


def sweep(private_root: Path) -> list[str]:
    """:func:`sweep_fd` of a private root given by path (opened as :func:`open_private_root`
    does, with its errors)."""
    _, fd = open_private_root(private_root)
    try:
        return sweep_fd(fd)
    finally:
        os.close(fd)


# The roots: where one may be (a named one checked whole-path, a fresh one made unguessable),
# and whether a boot in one is alive (its lock held); a sweep removes what a dead one left.


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
