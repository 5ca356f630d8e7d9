"""A vLLM compile-cache directory on disk: walked, hashed, archived, extracted, moved aside.

Moves bytes and decides nothing (the manifest decides, :mod:`plancache.trust.compile_cache.manifest`). The
directory may be hostile, so the walk never follows a link, never opens a FIFO or device
(anything but a regular file or a directory is an error, named), and stops at the caps
before hashing a byte. Files are hashed through a descriptor opened with ``O_NOFOLLOW |
O_NONBLOCK`` and checked to be the regular file of the size the walk saw.

Archives are plain tar (ustar, PAX headers only where a name needs them) written in one
deterministic form (sorted entries, mode 0755/0644, owner 0, mtime 0), so the signer can sign
the archive's sha256 and ``push`` rebuild the identical bytes. Extraction never calls
``extractall``: each member must be a directory or regular file named exactly as the
verified manifest lists it, in order, at its signed size; it is written with ``O_EXCL``
under a fresh temporary directory, and nothing else of the member (mode, owner, links) is used.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import os
import secrets
import shutil
import stat
import tarfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

from ...settings import BULK_TIMEOUT
from ...trust.compile_cache.manifest import (
    MAX_DEPTH,
    MAX_DIRS,
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_TOTAL_BYTES,
    FileEntry,
    Listing,
    Manifest,
)
from ...trust.errors import Reason, Rejected, StoreError, StoreTimeout
from ..local import dirfds

CHUNK = 1 << 20
COMPILE_SUBDIR = "torch_compile_cache"
QUARANTINE_SUBDIR = "plancache-quarantine"
SIDECAR_SUFFIX = ".plancache.sig"
"""The manifest sidecar sits beside the directory (``<hash>.plancache.sig``), not inside it, so
the directory holds exactly vLLM's files and the archive exactly the directory."""


def sidecar_path(directory: Path) -> Path:
    return directory.with_name(directory.name + SIDECAR_SUFFIX)


def walk(root: Path) -> dict[str, int | None]:
    """Every entry under ``root``: relative path -> size (regular file) or None (directory).

    Raises ``Rejected`` for a link, FIFO, socket or device (without opening it), for more
    than the manifest caps allow, and ``StoreError`` if ``root`` cannot be read.
    """
    found: dict[str, int | None] = {}
    total = 0
    files = 0
    stack: list[tuple[str, int]] = [("", 0)]
    while stack:
        rel, depth = stack.pop()
        try:
            with os.scandir(root / rel if rel else root) as entries:
                items = list(entries)
        except OSError as exc:
            raise StoreError(f"cannot read {root / rel}: {exc.strerror or exc}") from None
        for item in items:
            path = f"{rel}/{item.name}" if rel else item.name
            st = item.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 >= MAX_DEPTH or len(found) - files >= MAX_DIRS:
                    raise Rejected(
                        Reason.TOO_LARGE,
                        f"'{path}': the cache nests too deep or holds too many directories",
                    )
                found[path] = None
                stack.append((path, depth + 1))
            elif stat.S_ISREG(st.st_mode):
                files += 1
                total += st.st_size
                if files > MAX_FILES or st.st_size > MAX_FILE_BYTES or total > MAX_TOTAL_BYTES:
                    raise Rejected(
                        Reason.TOO_LARGE,
                        f"'{path}': the cache exceeds the caps ({MAX_FILES} files, "
                        f"{MAX_FILE_BYTES} bytes a file, {MAX_TOTAL_BYTES} in all)",
                    )
                found[path] = st.st_size
            else:
                kind = (
                    "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file or directory"
                )
                raise Rejected(Reason.MALFORMED, f"'{path}' is {kind}")
    return found


def sha256_file(path: Path, size: int) -> str:
    """sha256 of the regular file at ``path``, which must still be ``size`` bytes long."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise Rejected(
            Reason.MALFORMED, f"cannot open '{path}' as a plain file ({exc.strerror})"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            raise Rejected(Reason.DIGEST_MISMATCH, f"'{path}' changed while it was verified")
        digest = hashlib.sha256()
        with os.fdopen(os.dup(fd), "rb", buffering=0) as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
                size -= len(chunk)
                if size < 0:
                    break
        if size != 0:
            raise Rejected(Reason.DIGEST_MISMATCH, f"'{path}' changed while it was verified")
        return digest.hexdigest()
    finally:
        os.close(fd)


HASH_THREADS = 4
"""hashlib releases the GIL on large updates: hashing files in threads uses every core."""


def digests(root: Path, listing: Listing) -> dict[str, str]:
    """sha256 of every regular file of a walk (one share of the files per thread: a future per
    file would cost more than hashing a small one)."""
    files = sorted((path, size) for path, size in listing.items() if size is not None)
    shares = [files[i::HASH_THREADS] for i in range(HASH_THREADS)]
    with ThreadPoolExecutor(max_workers=HASH_THREADS) as pool:
        done = pool.map(
            lambda share: [(p, sha256_file(root / p, size)) for p, size in share], shares
        )
        return dict(pair for share in done for pair in share)


def _info(name: str, size: int | None) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if size is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    else:
        info.type, info.mode, info.size = tarfile.REGTYPE, 0o644, size
    return info


def write_archive(
    root: Path, files: tuple[FileEntry, ...], dirs: tuple[str, ...], out: IO[bytes]
) -> None:
    """The deterministic tar of ``root``'s listed entries (directories first, then files, each sorted)."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, encoding="utf-8") as tar:
        for d in dirs:
            tar.addfile(_info(d, None))
        for entry in files:
            fd = os.open(root / entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise Rejected(Reason.MALFORMED, f"'{entry.path}' is not a regular file")
                tar.addfile(_info(entry.path, entry.size), _Exact(f, entry.size, entry.path))


class _Exact(io.RawIOBase):
    """A file read as exactly ``size`` bytes: a file that grew or shrank fails the archive."""

    def __init__(self, f: IO[bytes], size: int, name: str) -> None:
        self._f, self._left, self._name = f, size, name

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(self._left if n < 0 else min(n, self._left))
        self._left -= len(data)
        if n and not data and self._left > 0:
            raise Rejected(Reason.DIGEST_MISMATCH, f"'{self._name}' changed while it was archived")
        return data


def archive_bytes(
    root: Path, manifest_files: tuple[FileEntry, ...], dirs: tuple[str, ...]
) -> bytes:
    buffer = io.BytesIO()
    write_archive(root, manifest_files, dirs, buffer)
    return buffer.getvalue()


def extract_archive(data: bytes, manifest: Manifest, dest: Path) -> None:
    """Extract an archive whose sha256 the caller checked against ``manifest`` into ``dest``,
    a directory this creates: exactly the manifest's entries, in its order, nothing else."""
    expected: list[tuple[str, int | None]] = [(d, None) for d in manifest.dirs]
    expected += [(f.path, f.size) for f in manifest.files]
    dest.mkdir(mode=0o755)
    position = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|", encoding="utf-8") as tar:
        for member in tar:
            if position >= len(expected):
                raise Rejected(
                    Reason.MALFORMED, "the archive holds more entries than the manifest lists"
                )
            name, size = expected[position]
            position += 1
            if member.name != name:
                raise Rejected(
                    Reason.MALFORMED,
                    f"archive entry '{member.name[:120]}' is not the signed '{name}'",
                )
            target = dest / name
            if size is None:
                if not member.isdir():
                    raise Rejected(Reason.MALFORMED, f"archive entry '{name}' is not a directory")
                target.mkdir(mode=0o755)
                continue
            if not member.isreg() or member.size != size:
                raise Rejected(
                    Reason.MALFORMED,
                    f"archive entry '{name}' is not a regular file of {size} bytes",
                )
            source = tar.extractfile(member)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(source, out, CHUNK)  # type: ignore[misc]
    if position != len(expected):
        raise Rejected(
            Reason.MALFORMED, f"the archive holds {position} of the {len(expected)} signed entries"
        )


def install(
    base: Path,
    staged: Path,
    directory: Path,
    sig_bytes: bytes,
    quarantine_root: Path,
    *,
    reason: str = "replaced-by-pull",
) -> None:
    """Rename a verified staging directory (beside ``directory``) into place, then its sidecar.
    An existing directory is moved aside first (``reason``), unless it holds only what vLLM leaves
    itself (:func:`leftovers_only`: removed, no evidence, and a quarantine entry on every node that
    pulls would be noise). Every step goes through descriptors (:mod:`..local.dirfds`)."""
    if directory.is_symlink() or (directory.exists() and not _remove_empty_tree(directory)):
        quarantine(base, directory, quarantine_root, reason)
    try:
        with (
            dirfds.opened_dir(base, directory.parent) as parent,
            dirfds.opened_dir(base, staged.parent, False) as stage,
        ):
            os.rename(staged.name, directory.name, src_dir_fd=stage, dst_dir_fd=parent)
            dirfds.write_new(parent, sidecar_path(directory).name, sig_bytes)
    except OSError as exc:
        raise StoreError(f"cannot install {directory}: {exc.strerror or exc}") from None


DEBUG_FILES = frozenset({"computation_graph.py", "cache_key_factors.json"})
"""What vLLM's ``VllmBackend`` writes for people into the shared ``<10 hex>/rank_<r>_<dp>/<prefix>/``
and never reads back: never signed (a build node signs its private copy), never copied to vLLM."""


def leftovers_only(directory: Path) -> bool:
    """Whether ``directory`` holds only directories and vLLM's debug files (a link, a FIFO: False)."""
    try:
        listing = walk(directory)
    except (Rejected, StoreError):
        return False
    return all(
        size is None or path.rpartition("/")[2] in DEBUG_FILES for path, size in listing.items()
    )


def _remove_empty_tree(directory: Path) -> bool:
    """Remove ``directory`` if :func:`leftovers_only` (shutil's descriptor-based removal follows no
    link); False when it is left as is. A file planted between the two goes too: nothing loads it."""
    if not leftovers_only(directory):
        return False
    shutil.rmtree(directory, ignore_errors=True)
    return not os.path.lexists(directory)


def quarantine_roots(base: Path, directory: Path, quarantine_root: Path) -> list[Path]:
    """Where ``directory`` may be moved aside: ``$VLLM_CACHE_ROOT/plancache-quarantine`` when it
    lies on the directory's filesystem, else (a volume mounted at ``torch_compile_cache/`` or
    deeper) a ``plancache-quarantine`` beside the directory, on its own mount. A rename never
    crosses a filesystem, so the evidence moves in O(1) and never half-copies."""
    beside = directory.parent / QUARANTINE_SUBDIR
    try:
        same = os.stat(directory.parent).st_dev == os.stat(base).st_dev
    except OSError:
        same = False
    return [quarantine_root, beside] if same else [beside]


def quarantine(base: Path, directory: Path, quarantine_root: Path, reason: str) -> Path:
    """Move ``directory`` (and its sidecar) aside as evidence; nothing there is ever loaded. A
    sidecar without its directory (a half-made quarantine) goes alone; the path returned is then
    its own. The entry's name is unpredictable, the rename goes through descriptors; ``EXDEV`` (a
    bind mount sharing the device) falls to the next root. ``StoreError`` if no root takes it."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name = f"{stamp}-{os.getpid()}-{secrets.token_hex(4)}-{directory.name}-{reason}"
    problems = []
    for target_root in quarantine_roots(base, directory, quarantine_root):
        try:
            with (
                dirfds.opened_dir(base, directory.parent, False) as parent,
                dirfds.opened_dir(base, target_root, True, 0o700) as target,
            ):
                dirfds.require_owned(target, target_root)  # another user's: never theirs to hold
                moved = name
                try:
                    os.rename(directory.name, name, src_dir_fd=parent, dst_dir_fd=target)
                except FileNotFoundError:  # no directory: the sidecar alone (none either: an error)
                    moved = name + SIDECAR_SUFFIX
                with contextlib.suppress(FileNotFoundError if moved == name else ()):
                    os.rename(
                        sidecar_path(directory).name,
                        name + SIDECAR_SUFFIX,
                        src_dir_fd=parent,
                        dst_dir_fd=target,
                    )
                with contextlib.suppress(OSError):
                    os.fsync(parent)
            return target_root / moved
        except (OSError, StoreError) as exc:
            problems.append(f"{target_root}: {getattr(exc, 'detail', None) or exc.strerror or exc}")
    raise StoreError(f"cannot move {directory} aside ({'; '.join(problems)})")


LOCK_SUFFIX = ".plancache.lock"
LOCK_WAIT = BULK_TIMEOUT
""":func:`locked`'s wait when the caller names none (the whole-store budget): no wait is endless."""


def lock_path(directory: Path) -> Path:
    return directory.with_name(directory.name + LOCK_SUFFIX)


@contextlib.contextmanager
def locked(
    base: Path, directory: Path, wait: float | None = None, *, write: bool = False
) -> Iterator[bool]:
    """An exclusive lock for one cache directory, shared by every rank on the node: one of them
    pulls, verifies, quarantines or installs while the others wait (``<hash>.plancache.lock``
    beside it, opened without following a link, this user's and closed to others' writes).
    ``wait`` bounds the wait in seconds (None: :data:`LOCK_WAIT`); past it ``StoreTimeout``
    (reason ``timeout``) naming the lock. A lock file another user's or open to others' writes
    is ``StoreError`` reason ``unsafe-directory``; one this user cannot open or make,
    ``lock-unavailable``: the caller stops, never works unlocked. Yields True with the lock held;
    False only on a read-only filesystem (``ST_RDONLY``): nobody writes through this mount, so
    the caller may read. ``write`` (sign, publish, pull) makes that a ``local-error`` at once."""
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
        _acquire(fd, lock, LOCK_WAIT if wait is None else wait)
        yield True
    finally:
        os.close(fd)


def _open_lock(base: Path, directory: Path, lock: Path) -> int | None:
    """The lock file's descriptor; None on a read-only filesystem (no lock can be made there)."""
    try:
        with dirfds.opened_dir(base, directory.parent) as parent:
            try:
                return dirfds.open_shared_file(parent, lock.name)
            except OSError:
                return (
                    None  # it re-raises an OSError only when the lock's own filesystem is read-only
                )
    except StoreError as exc:
        raise StoreError(f"the lock {lock} is not taken: {exc.detail}", reason=exc.reason) from None
    except OSError as exc:  # reaching the directory: a missing one cannot be made
        if exc.errno == errno.EROFS:
            return None
        reason = (
            Reason.LOCK_UNAVAILABLE
            if exc.errno in (errno.EACCES, errno.EPERM)
            else Reason.STORE_ERROR
        )
        raise StoreError(
            f"cannot lock {directory} ({lock}: {exc.strerror or exc})", reason=reason
        ) from None


def _acquire(fd: int, lock: Path, wait: float) -> None:
    """``flock`` without blocking, polled until ``wait`` runs out: a blocking ``flock`` cannot
    be bounded, and a holder that never lets go must cost a bounded wait, never a hang."""
    deadline = time.monotonic() + max(wait, 0.0)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreTimeout(
                    f"another process has held the lock {lock} for over {wait:g} s; nothing done"
                ) from None
            time.sleep(min(0.05, left))
