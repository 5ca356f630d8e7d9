"""Capped reads and atomic writes of small files: the two primitives every local writer uses.

Every file plancache reads may be hostile (a cache directory, an image layer, a key someone
handed over), so reads never follow a symlink at the final component, never block on a FIFO
or device, and stop at a cap instead of reading "the whole file". Writes go to a temp file in
the same directory (created ``O_EXCL | O_NOFOLLOW`` under an unpredictable name, in a
directory opened without following a link), are fsynced, then renamed over the final name and
the directory fsynced: a reader sees the old file or the new one, never a mix, and a crash
leaves no partial file under a final name. A rename replaces a symlink rather than writing
through it, so a planted link cannot redirect a write outside the directory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ...trust.errors import ConfigError, PlanCacheError, Reason, Rejected, StoreError
from .dirfds import DIR_FLAGS, write_new


def read_capped(
    path: str | os.PathLike[str], cap: int, follow_symlinks: bool = False
) -> bytes | None:
    """The file's bytes, None if it does not exist; ``TOO_LARGE`` beyond ``cap`` bytes.

    ``follow_symlinks`` is for operator-supplied configuration such as key files, which
    Kubernetes mounts as symlinks; data directories are read without following links.

    Raises:
        Rejected: not a regular file (reason ``malformed``), or larger than ``cap``
            (``too-large``).
        StoreError: the file cannot be opened or read (a link, unless followed; reason
            ``store-error``).
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Rejected(Reason.MALFORMED, f"{path} is not a regular file")
        chunks: list[bytes] = []
        remaining = cap + 1
        while remaining > 0:
            asked = min(remaining, 1 << 16)
            chunk = os.read(fd, asked)
            chunks.append(chunk)
            remaining -= len(chunk)
            if len(chunk) < asked:
                break  # a regular file reads short only at its end: no second read to see EOF
        data = b"".join(chunks)
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > cap:
        raise Rejected(Reason.TOO_LARGE, f"{path} is larger than {cap} bytes")
    return data


def read_config_file(path: Path | str, cap: int, what: str, *, explicit: bool) -> bytes | None:
    """An operator's configuration file (registry credentials, a mirror configuration, a CA
    bundle), read as :func:`read_capped` reads it with links followed (Kubernetes mounts such
    files as symlinks): a regular file only, never blocking on a FIFO, capped; None if absent.
    One reader for all of them, so each refuses the same files in the same words, ``what``
    naming the kind (the path as given: never an excerpt, a file may hold secrets).

    Raises:
        ConfigError: unreadable, not a regular file or larger than ``cap`` (``"{what}: …"``),
            or absent when ``explicit`` (``"{what} {path} does not exist"``).
    """
    try:
        raw = read_capped(Path(path), cap, follow_symlinks=True)
    except PlanCacheError as exc:
        raise ConfigError(f"{what}: {exc.detail}") from None
    if raw is None and explicit:
        raise ConfigError(f"{what} {path} does not exist")
    return raw


def fsync_dir(directory: Path) -> None:
    """Make the renames in ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # some filesystems do not allow opening directories; the rename still happened
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644, sync_dir: bool = True) -> None:
    """Write ``data`` to ``path`` atomically; on failure nothing is left under any final name.

    The directory is opened without following a link at its last component, and the file is
    written through :func:`~plancache.storage.local.dirfds.write_new` (an unpredictable ``O_EXCL |
    O_NOFOLLOW`` temporary renamed over the name). ``sync_dir=False`` leaves the directory
    fsync to the caller, who writes many files and then calls :func:`fsync_dir` once: each
    file is still complete before its rename.

    Raises:
        StoreError: the directory cannot be made or opened, or the write fails (reason
            ``store-error``).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.parent, DIR_FLAGS)
        try:
            write_new(fd, path.name, data, mode=mode, sync_dir=sync_dir)
        finally:
            os.close(fd)
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None
