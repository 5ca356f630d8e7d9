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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ...trust.errors import Reason, StoreError
from ..local import dirfds
from .private_roots import (
    BOOT_PREFIX,
    COLD_SUBDIR,
    LOCK_SUFFIX,
    PRIVATE_DIR_ENV,
    PRIVATE_SUBDIR,
    candidates,
    open_fresh_root,
    open_private_root,
    sweep_fd,
    temp_parents,
)

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
