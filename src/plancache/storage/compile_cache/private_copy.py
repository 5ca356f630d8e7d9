"""Private per-boot copies: vLLM and torch load the bytes that were hashed, not a path.

A path checked is not a file loaded: whoever can write a cache directory (or owns an inode
hard-linked into it) can change a file after it was hashed and before torch opens it. So the
guard never hands vLLM the cache directory itself. It copies every listed file, through one
``O_NOFOLLOW | O_NONBLOCK`` descriptor read once, into a fresh directory that only this process's
user can write (``mkdtemp``: mode 0700, an unpredictable name), hashing exactly the bytes it
writes; a file whose bytes differ from the manifest fails the whole copy. Whatever a local
writer does to the original afterwards (rewrite, rename, relink) cannot reach the copy, and
whatever vLLM and torch write after the load lands in the copy, never in the signed directory.

Copies live in the process's own boot directory (:mod:`.boot_dirs`: owned, reached without
links, on a filesystem where shared objects can be mapped), removed at exit, swept by a later
boot once the process is gone. A copy that fails for a local reason (a full disk, a permission,
a name taken) is a ``StoreError`` ``local-error``: never a verdict on the signed cache, which
stays in place for a later boot with room.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...trust.compile_cache.manifest import FileEntry, Manifest
from ...trust.errors import Reason, Rejected, StoreError
from ..local import dirfds

CHUNK = 1 << 20
COPY_THREADS = 4
"""hashlib and file IO release the GIL: copying files in threads uses every core."""


def copy_verified(src: Path, dest: Path, manifest: Manifest) -> None:
    """Copy the manifest's directories and files from ``src`` into ``dest`` (a directory this
    creates, inside a private boot directory), each file hashed as it is written. On any
    failure the partial copy is removed, and nothing of it is ever handed to vLLM.

    Raises:
        Rejected: a file is not the signed bytes (reason ``digest-mismatch``) or cannot be
            opened as a plain file (``malformed``).
        StoreError: the copy fails for a local reason (a full disk, a name taken: reason
            ``local-error``), never a verdict on the cache.
    """
    try:
        os.mkdir(dest, 0o700)
        for d in sorted(manifest.dirs, key=lambda p: p.count("/")):
            os.mkdir(dest / d, 0o700)
        shares = [manifest.files[i::COPY_THREADS] for i in range(COPY_THREADS)]
        with ThreadPoolExecutor(max_workers=COPY_THREADS) as pool:
            for _ in pool.map(lambda share: _copy_share(src, dest, share), shares):
                pass
    except OSError as exc:  # disk full, a directory vLLM made meanwhile: nothing is handed over
        shutil.rmtree(dest, ignore_errors=True)
        raise StoreError(
            f"cannot copy the cache into {dest}: {exc.strerror or exc}", reason=Reason.LOCAL_ERROR
        ) from None
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def _copy_share(src: Path, dest: Path, share: tuple[FileEntry, ...]) -> None:
    """One thread's share of the files, one after the other (the first failure ends it)."""
    for entry in share:
        _copy_one(src, dest, entry)


def _copy_one(src: Path, dest: Path, entry: FileEntry) -> None:
    try:
        fd = os.open(src / entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise Rejected(
            Reason.MALFORMED, f"cannot open '{entry.path}' as a plain file ({exc.strerror})"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != entry.size:
            raise Rejected(Reason.DIGEST_MISMATCH, f"'{entry.path}' changed while it was verified")
        digest = hashlib.sha256()
        left = entry.size
        buffer = bytearray(min(CHUNK, max(entry.size, 1)))
        view = memoryview(buffer)
        out = os.open(dest / entry.path, dirfds.NEW_FILE, 0o600)
        try:
            while left >= 0:
                n = os.readv(fd, [buffer])
                if n == 0:
                    break
                digest.update(view[:n])
                written = 0
                while written < n:
                    written += os.write(out, view[written:n])
                left -= n
        finally:
            os.close(out)
    finally:
        os.close(fd)
    if left != 0 or digest.hexdigest() != entry.sha256:
        raise Rejected(
            Reason.DIGEST_MISMATCH,
            f"'{entry.path}' is not the signed content (sha256 or size differs)",
        )
