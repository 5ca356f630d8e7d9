"""Private per-boot copies: vLLM and torch load the bytes that were hashed, not a path.

A path checked is not a file loaded: whoever can write a cache directory (or owns an inode
hard-linked into it) can change a file after it was hashed and before torch opens it. So the
guard never hands vLLM the cache directory itself. It copies every listed file, through one
``O_NOFOLLOW | O_NONBLOCK`` descriptor read once, into a fresh directory that only this process's
user can write (``mkdtemp``: mode 0700, an unpredictable name), hashing exactly the bytes it
writes; a file whose bytes differ from the manifest fails the whole copy. Whatever a local
writer does to the original afterwards (rewrite, rename, relink) cannot reach the copy, and
whatever vLLM and torch write after the load lands in the copy, never in the signed directory.

Copies live under ``$VLLM_CACHE_ROOT/plancache-private/boot-<pid>-<random>/`` (the cache's
filesystem, so compiled ``.so`` files load where vLLM already loads them, and a ``noexec`` /tmp
never matters), are removed at exit, and a later boot sweeps those of processes that are gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...trust.errors import Reason, Rejected, StoreError
from ...trust.compile_cache.manifest import FileEntry, Manifest
from ..local import dirfds

CHUNK = 1 << 20
COPY_THREADS = 4
"""hashlib and file IO release the GIL: copying files in threads uses every core."""
PRIVATE_SUBDIR = "plancache-private"
BOOT_PREFIX = "boot-"


def new_boot_dir(cache_root: Path) -> Path:
    """A fresh private directory for this process under ``cache_root/plancache-private``
    (or, where that cannot be written, under the system temporary directory: still 0700 and
    unpredictable, never the shared ``torchinductor_<user>``)."""
    prefix = f"{BOOT_PREFIX}{os.getpid()}-"
    try:
        parent = cache_root / PRIVATE_SUBDIR
        cache_root.mkdir(parents=True, exist_ok=True)
        os.close(dirfds.open_dir(cache_root, parent, True, 0o700))
        sweep(parent)
        return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    except (OSError, StoreError):
        return Path(tempfile.mkdtemp(prefix=f"plancache-{prefix}"))


def sweep(parent: Path) -> None:
    """Remove the boot directories of processes that no longer run (a worker killed before its
    exit hook); a live process's copy, another rank's included, is never touched."""
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            pid = name[len(BOOT_PREFIX):].partition("-")[0]
            if name.startswith(BOOT_PREFIX) and pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(parent / name, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def copy_verified(src: Path, dest: Path, manifest: Manifest) -> None:
    """Copy the manifest's directories and files from ``src`` into ``dest`` (a directory this
    creates, inside a private boot directory), each file hashed as it is written. Raises
    ``Rejected`` (``digest-mismatch``, ``malformed``) if any file is not the signed bytes; the
    partial copy is then removed, and nothing of it is ever handed to vLLM."""
    try:
        os.mkdir(dest, 0o700)
        for d in sorted(manifest.dirs, key=lambda p: p.count("/")):
            os.mkdir(dest / d, 0o700)
        shares = [manifest.files[i::COPY_THREADS] for i in range(COPY_THREADS)]
        with ThreadPoolExecutor(max_workers=COPY_THREADS) as pool:
            for _ in pool.map(lambda share: [_copy_one(src, dest, entry) for entry in share], shares):
                pass
    except OSError as exc:  # disk full, a directory vLLM made meanwhile: nothing is handed over
        shutil.rmtree(dest, ignore_errors=True)
        raise StoreError(f"cannot copy the cache into {dest}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def _copy_one(src: Path, dest: Path, entry: FileEntry) -> None:
    try:
        fd = os.open(src / entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise Rejected(Reason.MALFORMED, f"cannot open '{entry.path}' as a plain file ({exc.strerror})") from None
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
        raise Rejected(Reason.DIGEST_MISMATCH, f"'{entry.path}' is not the signed content (sha256 or size differs)")


def copy_into(src: Path, base: Path, dest: Path) -> int:
    """Copy the files of a private tree ``src`` (written by this process) into ``dest`` below
    ``base``, where absent: directories opened without following links, each file written
    through an unpredictable temporary and renamed into place (:func:`..local.dirfds.write_new`).
    Returns the number of files copied. What ``dest`` already holds is left as it is."""
    copied = 0
    for folder, _, names in os.walk(src):
        rel = Path(folder).relative_to(src)
        with dirfds.opened_dir(base, dest / rel) as fd:
            for name in names:
                try:
                    os.stat(name, dir_fd=fd, follow_symlinks=False)
                    continue
                except FileNotFoundError:
                    pass
                dirfds.write_new(fd, name, (Path(folder) / name).read_bytes(), mode=0o644, sync_dir=False)
                copied += 1
            with contextlib.suppress(OSError):
                os.fsync(fd)
    return copied
