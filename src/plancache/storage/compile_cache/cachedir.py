"""A vLLM compile-cache directory on disk: walked, hashed, put in place, moved aside.

Moves bytes and decides nothing (the manifest decides,
:mod:`plancache.trust.compile_cache.manifest`). The directory may be hostile, so the walk never
follows a link, never opens a FIFO or device (anything but a regular file or a directory is an
error, named), and stops at the caps before hashing a byte. Files are hashed through a
descriptor opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked to be the regular file of the
size the walk saw.

The directory travels as one archive (:mod:`.archive_format`: written deterministically,
extracted entry by entry), and every rank of a node works on it under one lock
(:mod:`..local.directory_lock`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...clock import REAL_CLOCK
from ...trust.compile_cache.closed_world import Listing
from ...trust.compile_cache.manifest import (
    MAX_DEPTH,
    MAX_DIRS,
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_TOTAL_BYTES,
)
from ...trust.errors import Reason, Rejected, StoreError
from ..local import dirfds

CHUNK = 1 << 20
COMPILE_SUBDIR = "torch_compile_cache"
QUARANTINE_SUBDIR = "plancache-quarantine"
SIDECAR_SUFFIX = ".plancache.sig"
"""The manifest sidecar sits beside the directory (``<hash>.plancache.sig``), not inside it, so
the directory holds exactly vLLM's files and the archive exactly the directory."""


def sidecar_path(directory: Path) -> Path:
    """The manifest sidecar of ``directory``: ``<name>.plancache.sig`` beside it."""
    return directory.with_name(directory.name + SIDECAR_SUFFIX)


def walk(root: Path) -> dict[str, int | None]:
    """Every entry under ``root``: relative path -> size (regular file) or None (directory).

    Raises:
        Rejected: a link, FIFO, socket or device, found without opening it (reason
            ``malformed``); more entries, depth or bytes than the manifest caps allow
            (``too-large``).
        StoreError: ``root`` or a directory under it cannot be read (reason ``local-error``: a
            co-tenant's directory of mode 0700 at a cache's name once said ``store-error``).
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
            raise StoreError(  # a directory another user keeps closed: this node's, no store's
                f"cannot read {root / rel}: {exc.strerror or exc}", reason=Reason.LOCAL_ERROR
            ) from None
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
    """sha256 of the regular file at ``path``, which must still be ``size`` bytes long.

    Raises:
        Rejected: ``path`` cannot be opened as a plain file (a link, gone: reason
            ``malformed``), or is no longer a regular file of ``size`` bytes
            (``digest-mismatch``).
    """
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
    file would cost more than hashing a small one); :func:`sha256_file`'s errors pass through."""
    files = sorted((path, size) for path, size in listing.items() if size is not None)
    shares = [files[i::HASH_THREADS] for i in range(HASH_THREADS)]
    with ThreadPoolExecutor(max_workers=HASH_THREADS) as pool:
        done = pool.map(
            lambda share: [(p, sha256_file(root / p, size)) for p, size in share], shares
        )
        return dict(pair for share in done for pair in share)


def install(
    base: Path,
    staged: Path,
    directory: Path,
    sig_bytes: bytes,
    quarantine_root: Path,
    *,
    reason: str = "replaced-by-pull",
) -> None:
    """Put a verified staging directory (``staged``, inside a staging directory beside
    ``directory``) into place with its sidecar, so that a boot never sees the cache without it.

    Two names cannot change in one step, so the order makes every state in between one a boot
    already handles without an alert: (1) the sidecar is written whole inside the staging
    directory (a full disk or quota fails here, before anything visible changed); (2) an
    existing directory is moved aside (``reason``) with its old sidecar, or removed if it
    holds only what vLLM leaves itself (:func:`leftovers_only`); (3) the new sidecar is renamed
    beside it; (4) the directory is renamed into place. Killed after (2): no cache (pulled
    again); after (3): a sidecar without its cache, which proves nothing and is set aside
    under the lock like any other (:func:`.placement.set_aside_lone_sidecar`: no verdict);
    after (4): the new cache, signed. A cache never stands without its sidecar (the old order
    made that an ``unsigned`` quarantine of a good cache). Should (4) fail, the sidecar of (3)
    is taken back. Every step goes through descriptors (:mod:`..local.dirfds`).

    Raises:
        StoreError: a link on the way (reason ``unsafe-directory``); the existing directory
            cannot be moved aside (:func:`quarantine`), or a write or rename fails (a full disk,
            a quota, a permission: reason ``local-error``).
    """
    sidecar = sidecar_path(directory).name
    try:
        with dirfds.opened_dir(base, staged.parent, create=False) as stage:
            dirfds.write_new(stage, SIDECAR_STAGED, sig_bytes)
            if directory.is_symlink() or (directory.exists() and not _remove_empty_tree(directory)):
                quarantine(base, directory, quarantine_root, reason)
            with dirfds.opened_dir(base, directory.parent) as parent:
                os.rename(SIDECAR_STAGED, sidecar, src_dir_fd=stage, dst_dir_fd=parent)
                _sync(parent)
                try:
                    os.rename(staged.name, directory.name, src_dir_fd=stage, dst_dir_fd=parent)
                except OSError:
                    with contextlib.suppress(OSError):  # no cache: nor any sidecar claiming one
                        os.unlink(sidecar, dir_fd=parent)
                    raise
                _sync(parent)
    except OSError as exc:
        raise StoreError(
            f"cannot install {directory}: {exc.strerror or exc}", reason=Reason.LOCAL_ERROR
        ) from None


SIDECAR_STAGED = "sidecar"
"""The new sidecar's name inside the staging directory until it is renamed beside the cache
(never a cache's own name: the cache is the staging directory's ``x``)."""


def _sync(dir_fd: int) -> None:
    """The directory's renames on disk in the order made (a crash keeps that order too)."""
    with contextlib.suppress(OSError):
        os.fsync(dir_fd)


DEBUG_FILES = frozenset({"computation_graph.py", "cache_key_factors.json"})
"""What vLLM's ``VllmBackend`` writes for people into the shared
``<10 hex>/rank_<r>_<dp>/<prefix>/`` and never reads back: never signed (a build node signs its
private copy), never copied to vLLM."""


def leftovers_only(directory: Path) -> bool:
    """Whether ``directory`` holds only directories and vLLM's debug files (a link, a FIFO:
    False)."""
    try:
        listing = walk(directory)
    except (Rejected, StoreError):
        return False
    return all(
        size is None or path.rpartition("/")[2] in DEBUG_FILES for path, size in listing.items()
    )


def _remove_empty_tree(directory: Path) -> bool:
    """Remove ``directory`` if :func:`leftovers_only` (shutil's descriptor-based removal follows
    no link); False when it is left as is. A file planted between the two goes too: nothing
    loads it."""
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
    """Move ``directory`` (and its sidecar) aside as evidence; nothing there is ever loaded. The
    root then keeps its newest entries within its caps (:func:`prune_quarantine`).

    A sidecar without its directory (a half-made quarantine) goes alone; the path returned is
    then its own. The entry's name is unpredictable, the rename goes through descriptors;
    ``EXDEV`` (a bind mount sharing the device) falls to the next root.

    Raises:
        StoreError: no root takes it, each root named with why (reason ``local-error``: a
            local failure, no verdict on any store).
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(REAL_CLOCK.wall()))  # a name for people
    name = f"{stamp}-{os.getpid()}-{secrets.token_hex(4)}-{directory.name}-{reason}"
    problems = []
    for target_root in quarantine_roots(base, directory, quarantine_root):
        try:
            with (
                dirfds.opened_dir(base, directory.parent, create=False) as parent,
                dirfds.opened_dir(base, target_root, create=True, mode=0o700) as target,
            ):
                dirfds.require_owned(target, target_root)  # another user's: never theirs to hold
                moved = name
                try:
                    os.rename(directory.name, name, src_dir_fd=parent, dst_dir_fd=target)
                except FileNotFoundError:  # no directory: the sidecar alone (none either: an error)
                    moved = name + SIDECAR_SUFFIX
                with contextlib.suppress(*((FileNotFoundError,) if moved == name else ())):
                    os.rename(
                        sidecar_path(directory).name,
                        name + SIDECAR_SUFFIX,
                        src_dir_fd=parent,
                        dst_dir_fd=target,
                    )
                with contextlib.suppress(OSError):
                    os.fsync(parent)
                prune_quarantine(target, keep=moved)
            return target_root / moved
        except (OSError, StoreError) as exc:
            problems.append(f"{target_root}: {_why(exc)}")
    raise StoreError(
        f"cannot move {directory} aside ({'; '.join(problems)})", reason=Reason.LOCAL_ERROR
    )


def _why(exc: OSError | StoreError) -> object:
    """What went wrong at one quarantine root, in one phrase."""
    if isinstance(exc, StoreError):
        return exc.detail or exc
    return exc.strerror or exc


# The quarantine kept bounded: at most :data:`QUARANTINE_MAX_ENTRIES` entries and
# :data:`QUARANTINE_MAX_BYTES` per quarantine root, the oldest removed first.
#
# A quarantine entry is evidence for an operator, never loaded. Without a bound, a co-tenant who
# keeps breaking a cache (or a store that keeps serving a bad one) fills the victim's disk one
# entry a boot. Entries are named ``<UTC time>-<pid>-<random>-<name>-<reason>`` (a directory, its
# sidecar beside it as ``….plancache.sig``) by :func:`quarantine`: they are ordered by
# that time, then by when they were renamed in (their change time); the entry just moved in
# (``keep``) is always kept, even alone over the byte cap, whatever the others' stamps say: a
# clock that was ahead once stamped entries in the future, and ordered by name alone they would
# outrank, and delete, the evidence of the quarantine that just happened. An entry stamped
# later than ``keep`` sorts as the oldest (its stamp cannot be right). Dot-names (temporaries,
# the fetch back-off record) are not entries. Removal goes through the root's descriptor and
# follows no link (shutil's descriptor-based ``rmtree``); what cannot be removed (another user's
# directory inside an entry) is left and tried again next time.

QUARANTINE_MAX_ENTRIES = 8
"""Entries kept per quarantine root (a cache and its sidecar are one entry)."""
QUARANTINE_MAX_BYTES = 512 << 20
"""Bytes kept per quarantine root (the newest entry is kept whatever its size)."""
_QUARANTINE_ENTRY = re.compile(r"[0-9]{8}T[0-9]{6}Z-[0-9]+-[0-9a-f]{8}-.+")


def prune_quarantine(
    root_fd: int,
    *,
    keep: str = "",
    max_entries: int = QUARANTINE_MAX_ENTRIES,
    max_bytes: int = QUARANTINE_MAX_BYTES,
) -> int:
    """Remove the oldest entries of the quarantine root open at ``root_fd`` beyond the caps,
    never ``keep`` (the entry just moved in, its sidecar's name or its own); how many entries
    were removed. Never raises: a bound not kept this time is kept next."""
    try:
        names = os.listdir(root_fd)
    except OSError:
        return 0
    entries: dict[str, list[str]] = {}
    for name in names:
        if _QUARANTINE_ENTRY.fullmatch(name):
            entries.setdefault(name.removesuffix(SIDECAR_SUFFIX), []).append(name)
    keep = keep.removesuffix(SIDECAR_SUFFIX)
    latest = keep[:16] if keep in entries else ""

    def newest_first(entry: str) -> tuple[bool, tuple[str, int]]:
        stamp, changed = _entry_age(root_fd, entry)
        future = bool(latest) and stamp > latest  # a clock that was ahead: not to be believed
        return (entry == keep, ("", changed) if future else (stamp, changed))

    kept = total = removed = 0
    for entry in sorted(entries, key=newest_first, reverse=True):
        size = sum(_entry_size(root_fd, name) for name in entries[entry])
        if entry == keep or kept == 0 or (kept < max_entries and total + size <= max_bytes):
            kept, total = kept + 1, total + size
            continue
        for name in entries[entry]:
            _remove_entry(root_fd, name)
        removed += 1
    return removed


def _entry_age(dir_fd: int, entry: str) -> tuple[str, int]:
    """The entry's time stamp (its name's, to the second), then when it was moved in (a rename
    sets the change time): oldest sorts first."""
    changed = 0
    for name in (entry, entry + SIDECAR_SUFFIX):  # a lone sidecar is an entry of its own
        with contextlib.suppress(OSError):
            changed = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_ctime_ns
            break
    return entry[:16], changed


SIZE_WALK_NAMES = MAX_FILES + MAX_DIRS
"""The most names an entry is walked for to size it: what a cache may hold at most. An entry
with more (a co-tenant's directory moved aside, holding a million of its own empty files)
counts as over the byte cap, unwalked: sizing the quarantine on the boot's path, under the
cache's lock, then costs at most this many ``stat`` calls an entry, never what was planted."""
OVERSIZED = 1 << 62


def _entry_size(dir_fd: int, name: str) -> int:
    """Bytes of the regular files under ``name`` (no link followed); :data:`OVERSIZED` beyond
    :data:`SIZE_WALK_NAMES` names."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size if stat.S_ISREG(st.st_mode) else 0
    total = names = 0
    with contextlib.suppress(OSError):
        for _, dirs, files, fd in os.fwalk(name, dir_fd=dir_fd, follow_symlinks=False):
            names += len(dirs) + len(files)
            if names > SIZE_WALK_NAMES:
                return OVERSIZED
            for file in files:
                with contextlib.suppress(OSError):
                    st = os.stat(file, dir_fd=fd, follow_symlinks=False)
                    total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


def _remove_entry(dir_fd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
