"""Directories opened, and files created, without ever following a link.

Every name plancache creates under a cache root (sidecars, their temporaries, locks, quarantine
entries, private copies) may already be taken by a planted symlink or hard link, and any
directory on the way may be swapped for a link between a check and a write. So a path is never
checked and then used: each component below a trusted base (the operator's ``VLLM_CACHE_ROOT``
or ROOT, followed as given) is opened relative to its parent's descriptor with ``O_NOFOLLOW |
O_DIRECTORY``, and every file is created relative to that descriptor with ``O_EXCL |
O_NOFOLLOW`` under an unpredictable name, then renamed (or, for a name that must never be
replaced, hard-linked) into place. A link anywhere below the base is an error, never followed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from ...trust.errors import Reason, StoreError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def relative_parts(base: Path, directory: Path) -> tuple[str, ...]:
    """``directory``'s components below ``base`` (both made absolute without resolving links).

    Raises:
        StoreError: ``directory`` is not under ``base`` (reason ``store-error``).
    """
    inner, outer = os.path.abspath(directory), os.path.abspath(base)
    if not inner.startswith("//") and not outer.startswith("//"):
        # the common case as strings (both normalized: no ".", "..", "//" or trailing "/" left),
        # without pathlib's parsing on a boot's critical path; "//" roots are pathlib's to judge
        if inner == outer:
            return ()
        prefix = outer if outer == "/" else outer + "/"
        if not inner.startswith(prefix):
            raise StoreError(f"{directory} is not under {base}")
        return tuple(inner[len(prefix) :].split("/"))
    try:
        rel = PurePosixPath(inner).relative_to(outer)
    except ValueError:
        raise StoreError(f"{directory} is not under {base}") from None
    if ".." in rel.parts:
        raise StoreError(f"{directory} is not under {base}")
    return rel.parts


def open_dir(base: Path, directory: Path, *, create: bool = True, mode: int = 0o755) -> int:
    """A descriptor of ``directory``, reached from ``base`` one component at a time without
    following a link (missing components are made, with ``mode``, when ``create``). ``base``
    itself is the operator's (followed as given, made when missing and ``create``).

    Raises:
        StoreError: ``directory`` is not under ``base`` (reason ``store-error``), or a
            component is a link or not a directory, named (``unsafe-directory``; one that
            cannot be opened otherwise: ``local-error``).
        FileNotFoundError: a component is absent and not ``create``.
        OSError: ``base`` cannot be made or opened.
    """
    if create:
        os.makedirs(base, exist_ok=True)
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in relative_parts(base, directory):
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, mode, dir_fd=fd)
                child = _open_child(fd, part, directory)
            except OSError as exc:
                raise _not_a_dir(directory, part, exc) from None
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_child(fd: int, part: str, directory: Path) -> int:
    try:
        return os.open(part, DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        raise _not_a_dir(directory, part, exc) from None


def _not_a_dir(directory: Path, part: str, exc: OSError) -> StoreError:
    """A link or a non-directory where a directory must be is a local layout no one should
    trust (``unsafe-directory``: a symlinked ``torch_compile_cache/`` is one); any other
    failure to open one (a permission) is ``local-error``. Neither is a store's problem."""
    unsafe = exc.errno in (errno.ELOOP, errno.ENOTDIR)
    return StoreError(
        f"'{part}' in {directory} is a link or not a directory ({exc.strerror or exc}); "
        "not followed",
        reason=Reason.UNSAFE_DIRECTORY if unsafe else Reason.LOCAL_ERROR,
    )


def require_owned(fd: int, where: Path | str, *, private: bool = False) -> None:
    """The directory or file open at ``fd`` belongs to this process's user and is closed to
    group and world writes (``private``: to any group or world access). Anyone else who can
    write it can swap what lies inside between a check and a use, so it is never used.

    Raises:
        StoreError: another user's, or open to others, naming ``where`` and what is wrong
            (reason ``unsafe-directory``).
    """
    st = os.fstat(fd)
    mask = 0o077 if private else 0o022
    if st.st_uid != os.geteuid():
        problem = f"owned by uid {st.st_uid}, not this user's (uid {os.geteuid()})"
    elif st.st_mode & mask:
        problem = f"mode {stat.S_IMODE(st.st_mode):04o} lets others {'in' if private else 'write'}"
    else:
        return
    raise StoreError(f"{where} is {problem}; not used", reason=Reason.UNSAFE_DIRECTORY)


@contextlib.contextmanager
def opened_dir(
    base: Path, directory: Path, *, create: bool = True, mode: int = 0o755
) -> Iterator[int]:
    """:func:`open_dir` (its errors) as a context: the descriptor is closed at its end."""
    fd = open_dir(base, directory, create=create, mode=mode)
    try:
        yield fd
    finally:
        os.close(fd)


_OWNER = re.compile(r"boot-[0-9a-f]{16}")
_TOKEN = re.compile(r"[0-9a-f]{16}")
"""A temporary's random part (:func:`temp_name`: ``secrets.token_hex(8)``)."""
"""A boot directory's name (:func:`plancache.storage.compile_cache.boot_dirs.new_boot_dir`)."""


def temp_name(name: str, owner: str = "") -> str:
    """An unpredictable temporary name for ``name`` (``.<name>.[<owner>.]<16 hex>.tmp``).

    ``owner`` is the boot directory (``boot-<16 hex>``) of the process that makes the temporary,
    passed by the caller that knows it (the plugin's per-boot state: a forked worker has its
    own), so a sweep can tell a dead process's leftovers from a live one's (:func:`temp_owner`).
    No module state holds it: a fork would carry the parent's into the child.

    Raises:
        ValueError: ``owner`` is neither empty nor a boot directory's name.
    """
    if owner and not _OWNER.fullmatch(owner):
        raise ValueError(f"not a boot directory's name: {owner!r}")
    tag = f"{owner}." if owner else ""
    return f".{name}.{tag}{secrets.token_hex(8)}.tmp"


def temp_target(temporary: str) -> str | None:
    """The name a temporary of :func:`temp_name` was made for (None: not such a temporary), so
    that what a killed writer left can go with what it was writing (:mod:`.records`)."""
    if not (temporary.startswith(".") and temporary.endswith(".tmp")):
        return None
    name, _, token = temporary[1:-4].rpartition(".")
    if not name or not _TOKEN.fullmatch(token):
        return None
    head, _, owner = name.rpartition(".")
    return head if head and _OWNER.fullmatch(owner) else name


def temp_owner(temporary: str) -> str:
    """The boot directory named in a temporary's name by :func:`temp_name` ("" if none)."""
    parts = temporary.rsplit(".", 3)
    if (
        len(parts) == 4
        and parts[3] == "tmp"
        and parts[0].startswith(".")
        and _OWNER.fullmatch(parts[1])
    ):
        return parts[1]
    return ""


@contextlib.contextmanager
def opened_dir_at(dir_fd: int, name: str) -> Iterator[int]:
    """A descriptor of the directory ``name`` inside ``dir_fd`` (never a link)."""
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def write_new(
    dir_fd: int,
    name: str,
    data: bytes,
    *,
    mode: int = 0o644,
    sync_dir: bool = True,
    sync_file: bool = True,
) -> None:
    """Write ``data`` under ``name`` in the directory ``dir_fd``: a fresh unpredictable
    temporary (``O_EXCL | O_NOFOLLOW``), fsynced, renamed over ``name`` (a link planted there is
    replaced, never written through), the directory fsynced. Nothing half-written remains.
    ``sync_file=False`` (diagnostics on a boot's path: boot records) skips the fsyncs; the
    rename is still atomic for every reader while the machine is up."""
    tmp = temp_name(name)
    fd = os.open(tmp, NEW_FILE, mode, dir_fd=dir_fd)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if sync_file:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        tmp = ""
        if sync_dir:
            with contextlib.suppress(OSError):
                os.fsync(dir_fd)
    finally:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)


def open_shared_file(dir_fd: int, name: str, mode: int = 0o600) -> int:
    """An existing regular file ``name`` (a lock every rank opens), or one made for it: created
    under a temporary name and hard-linked into place, so a name already taken (by a peer, or a
    planted link) is never replaced nor followed. A lock someone else can replace or hold for
    us would be no lock, so the file must be this user's and closed to group/world writes
    (:func:`require_owned`, ``StoreError`` reason ``unsafe-directory``, as for a file that is not
    regular); one that cannot be opened or made (EACCES, EPERM) is ``StoreError`` reason
    ``lock-unavailable``: the caller stops, it never goes on unlocked. Only when the directory
    lies on a read-only filesystem (``fstatvfs``, not the errno alone: EACCES is no proof) is the
    ``OSError`` re-raised, for the caller to read without a lock (nobody writes there).

    Raises:
        StoreError: a file another user's, open to others' writes, or not regular (reason
            ``unsafe-directory``); one this user cannot open or make (``lock-unavailable``); a
            link (``unsafe-directory``) or any other failure (``local-error``).
        OSError: only on a read-only filesystem, as it is.
    """
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        tmp = temp_name(name)
        try:
            os.close(os.open(tmp, NEW_FILE, mode, dir_fd=dir_fd))
        except OSError as exc:
            raise _open_failure(dir_fd, name, exc) from None
        try:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        finally:
            os.unlink(tmp, dir_fd=dir_fd)
        fd = _open_regular(dir_fd, name, flags)
    except OSError as exc:
        raise _open_failure(dir_fd, name, exc) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StoreError(
                f"'{name}' is not a regular file; not used", reason=Reason.UNSAFE_DIRECTORY
            )
        require_owned(fd, f"'{name}'")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_regular(dir_fd: int, name: str, flags: int) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise _open_failure(dir_fd, name, exc) from None


def _open_failure(dir_fd: int, name: str, exc: OSError) -> Exception:
    """What :func:`open_shared_file` raises for ``exc``: the ``OSError`` itself only on a
    read-only filesystem; ``lock-unavailable`` for a file this user may not open or make here;
    ``unsafe-directory`` for a link (never followed) or a socket planted at the name;
    ``local-error`` for anything else (ENOSPC, EDQUOT making it). None of these is the store's
    doing, so none says ``store-error`` (a planted link once did, and read like a store down)."""
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and read_only(dir_fd):
        return exc
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return StoreError(
            f"'{name}' cannot be opened or made by this user ({exc.strerror or exc}); no lock, "
            "so nothing is done",
            reason=Reason.LOCK_UNAVAILABLE,
        )
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):  # a link, a socket: planted
        return StoreError(
            f"'{name}' is a link or not a regular file ({exc.strerror or exc}); not followed",
            reason=Reason.UNSAFE_DIRECTORY,
        )
    return StoreError(  # a full disk or quota making it, an I/O error: this node's, no store's
        f"'{name}' cannot be opened or made ({exc.strerror or exc})", reason=Reason.LOCAL_ERROR
    )


def read_only(dir_fd: int) -> bool:
    """Whether the filesystem holding the directory ``dir_fd`` is mounted read-only
    (``ST_RDONLY``)."""
    try:
        return bool(os.fstatvfs(dir_fd).f_flag & os.ST_RDONLY)
    except OSError:
        return False
