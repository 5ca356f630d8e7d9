"""Precompiled headers on disk: compressed for a store, inflated into the node's private directory.

Moves bytes and decides nothing (:mod:`plancache.trust.compile_cache.header_statement` and
:mod:`plancache.pipeline.compile_cache.header_shipping` decide). The node's headers live in
``$VLLM_CACHE_ROOT/plancache-private/headers`` (:func:`private_dir`: reached without following
links, ours, mode 0700). Several headers travel as one gzip stream (zlib, level 1: 149 MiB ->
26 MB in 3.5 s), inflated with a bound on every call's output, never more than the signed size
of the header being written plus one chunk, so a gzip bomb costs a node one chunk of memory and
time, not its disk. Each header is written, as it is inflated and hashed, into a fresh
``O_EXCL | O_NOFOLLOW`` temporary in that directory, and only linked to its name (never
replacing anything there, a planted link included) once the caller has compared the hash:
what lands is what was hashed, from this process's own descriptor, never a path read again.
A header gcc left unfinished (killed mid-build) is removed under torch's own build lock
(:func:`remove_unfinished`), so torch or the store provides it again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ...trust.errors import Reason, Rejected, StoreError
from ..local import dirfds

CHUNK = 1 << 20
FLUSH_EVERY = 16 << 20
"""Bytes of a header written between two starts of its writeback (``fdatasync`` on a thread of
its own, while inflating goes on); the final ``fsync`` before the link stays, so a header under
its name is never a partial file after a crash, but it then waits for the last piece only."""
LEVEL = 1
"""gzip -1: 5.7x on a .gch in 3.5 s; higher levels cost the build node far more for little."""
HEADERS_SUBDIR = "headers"
READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK


def open_private_dir(base: Path, directory: Path) -> int:
    """A descriptor of ``directory`` (made 0700 if missing), reached from ``base`` without
    following links.

    Raises:
        StoreError: a link or not a directory on the way (reason ``store-error``), or a
            directory that is not this user's or is open to group or world
            (``unsafe-directory``).
        OSError: the directory cannot be made or opened.
    """
    fd = dirfds.open_dir(base, directory, create=True, mode=0o700)
    try:
        dirfds.require_owned(fd, directory, private=True)
    except StoreError:
        os.close(fd)
        raise
    return fd


def private_dir(private_root: Path) -> Path | None:
    """``<private_root>/headers`` when :func:`open_private_dir` accepts it, else None."""
    headers = private_root / HEADERS_SUBDIR
    try:
        os.close(open_private_dir(private_root.parent, headers))
    except Exception:
        return None
    return headers


def present(dir_fd: int, name: str) -> str:
    """ "" if nothing is named ``name``; "file" for a regular file; else what is there (a link
    or anything else: never followed, never replaced)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return ""
    return (
        "file"
        if stat.S_ISREG(st.st_mode)
        else "link"
        if stat.S_ISLNK(st.st_mode)
        else "not a regular file"
    )


def compress(dir_fd: int, names: list[str]) -> tuple[bytes, list[tuple[str, int, str]]]:
    """One gzip stream of the named files, in order, and each file's (name, size, sha256),
    read once through an ``O_NOFOLLOW`` descriptor that must be a regular file.

    Raises:
        StoreError: a header cannot be opened (a link, gone) or is not a regular file (reason
            ``store-error``).
    """
    packer = zlib.compressobj(LEVEL, zlib.DEFLATED, 31)
    parts: list[bytes] = []
    entries = []
    for name in names:
        try:
            fd = os.open(name, READ, dir_fd=dir_fd)
        except OSError as exc:
            raise StoreError(f"cannot read the header {name}: {exc.strerror or exc}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StoreError(f"the header {name} is not a regular file")
            digest, size = hashlib.sha256(), 0
            while chunk := os.read(fd, CHUNK):
                digest.update(chunk)
                size += len(chunk)
                parts.append(packer.compress(chunk))
        finally:
            os.close(fd)
        entries.append((name, size, digest.hexdigest()))
    parts.append(packer.flush())
    return b"".join(parts), entries


class Inflater:
    """Reads one gzip stream out, a bounded piece at a time, into files of given sizes."""

    def __init__(self, data: bytes) -> None:
        self._z = zlib.decompressobj(31)
        self._data = memoryview(data)
        self._offset = 0
        self._held = b""

    def _piece(self) -> bytes:
        """The next at most CHUNK inflated bytes; b"" at the stream's end."""
        while not self._z.eof:
            source: bytes | memoryview = self._z.unconsumed_tail
            if not source:
                source = self._data[self._offset : self._offset + CHUNK]
                self._offset += len(source)
                if not source:
                    raise Rejected(Reason.MALFORMED, "the headers' gzip stream is truncated")
            out = self._z.decompress(source, CHUNK)
            if out:
                return out
        return b""

    def write_into(
        self,
        dir_fd: int,
        name: str,
        size: int,
        *,
        check: Callable[[], None] | None = None,
        owner: str = "",
    ) -> tuple[str, str]:
        """The next ``size`` inflated bytes, hashed as they are written into a new temporary in
        ``dir_fd``: (temporary name, sha256). The caller compares, then :func:`link` or
        :func:`discard`. ``check`` runs before each piece (the caller's way to stop: it raises).
        ``owner``: the writing process's boot directory, named in the temporary's name so a
        sweep removes it only once that boot is dead (:func:`..local.dirfds.temp_name`).

        Raises:
            Rejected: the stream is truncated (reason ``malformed``) or ends before ``size``
                bytes (``digest-mismatch``); the temporary is removed.
            OSError: the temporary cannot be made, written or synced; ``check``'s error as it is.
        """
        tmp = dirfds.temp_name(name, owner)
        fd = os.open(tmp, dirfds.NEW_FILE, 0o600, dir_fd=dir_fd)
        digest, remaining = hashlib.sha256(), size
        try:
            # zlib, hashlib and os.write release the GIL: one thread inflates the next piece
            # while another hashes and writes the previous one, in order (one piece in flight),
            # and a third starts the disk's writeback every FLUSH_EVERY bytes written, so the
            # fsync that must end before the header is linked finds little left to write. The
            # executors' exits wait for what is in flight, so fd is closed only after it.
            try:
                with (
                    ThreadPoolExecutor(1, "plancache-header-write") as sink,
                    ThreadPoolExecutor(1, "plancache-header-flush") as flusher,
                ):
                    pending: Future[None] | None = None
                    flushing: Future[None] | None = None
                    written = flushed = 0
                    while remaining:
                        if check is not None:
                            check()
                        piece = self._held or self._piece()
                        if not piece:
                            raise Rejected(
                                Reason.DIGEST_MISMATCH,
                                f"the headers' stream ends before {name}'s signed size",
                            )
                        part, self._held = (
                            (piece, b"")
                            if len(piece) <= remaining
                            else (piece[:remaining], piece[remaining:])
                        )
                        if pending is not None:
                            pending.result()
                            if written - flushed >= FLUSH_EVERY and (
                                flushing is None or flushing.done()
                            ):
                                if flushing is not None:
                                    # a writeback error is this file's: never left for fsync
                                    # to forget
                                    flushing.result()
                                flushing, flushed = flusher.submit(os.fdatasync, fd), written
                        pending = sink.submit(_hash_and_write, digest, fd, part)
                        remaining -= len(part)
                        written += len(part)
                    for future in (pending, flushing):
                        if future is not None:
                            future.result()
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            discard(dir_fd, tmp)
            raise
        return tmp, digest.hexdigest()

    def finish(self) -> None:
        """The stream must end exactly after the last header: more output is a bomb or a lie.

        Raises:
            Rejected: the stream inflates beyond the last header (reason ``too-large``), or
                data follows the gzip stream (``malformed``).
        """
        if self._held or self._piece():
            raise Rejected(
                Reason.TOO_LARGE,
                "the headers' stream inflates beyond its signed size (a gzip bomb?)",
            )
        if self._z.unused_data or self._offset < len(self._data):
            raise Rejected(Reason.MALFORMED, "the headers' object holds data after its gzip stream")


def _hash_and_write(digest: hashlib._Hash, fd: int, part: bytes) -> None:
    digest.update(part)
    view = memoryview(part)
    while view:
        view = view[os.write(fd, view) :]


def link(dir_fd: int, tmp: str, name: str) -> bool:
    """Give the temporary its name only if nothing holds that name (a hard link: never replaces,
    never follows); the temporary is removed either way. False when the name was taken."""
    try:
        os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)
        return True
    except FileExistsError:
        return False
    finally:
        discard(dir_fd, tmp)


def discard(dir_fd: int, tmp: str) -> None:
    """Remove the temporary ``tmp`` (gone already: nothing to do)."""
    with contextlib.suppress(OSError):
        os.unlink(tmp, dir_fd=dir_fd)


GCC_IDENT = b"gpch"
"""How a whole gcc precompiled header begins: ``gpch``, a language letter (``C``, ``o``, ``+``,
``O``) and gcc's PCH version (``gpch+014``: g++ 12). gcc writes ``gpcWrite`` there first and
the ident only once everything else is written, so a build killed midway (or one that failed
for room) leaves a file that does not begin so. gcc refuses such a file fatally on every
compile that includes the header, and torch never rebuilds a header whose file exists."""
CLANG_MAGIC = b"CPCH"
"""clang's precompiled headers (written to a temporary and renamed: never half a file)."""
LOCKS_SUBDIR = "locks"
"""torch's ``_HEADER_LOCK_DIR`` inside the headers directory: ``<hash>.lock``, ``flock``-ed by
torch's ``FileLock`` while gcc builds ``<hash>.h.gch``."""


def is_complete(dir_fd: int, name: str) -> bool:
    """Whether ``name`` is a regular file that begins as a whole precompiled header does."""
    try:
        fd = os.open(name, READ, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        head = os.read(fd, 8) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)
    if head.startswith(CLANG_MAGIC):
        return True
    return len(head) == 8 and head[:4] == GCC_IDENT and head[4:5] in (b"C", b"o", b"+", b"O")


def remove_unfinished(dir_fd: int, name: str) -> bool:
    """Remove ``name`` when it is a regular file that is not a whole precompiled header
    (:func:`is_complete`), holding torch's own build lock for it (``locks/<hash>.lock``, the
    ``flock`` torch's ``FileLock`` takes) so that a gcc building it right now is never cut
    short: held by someone, the file is left. True when removed (torch, or the store, then
    provides it afresh). Links and other kinds are never touched here (:func:`present`)."""
    if present(dir_fd, name) != "file" or is_complete(dir_fd, name):
        return False
    hash_part = name.split(".", 1)[0]
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(LOCKS_SUBDIR, 0o700, dir_fd=dir_fd)
        with dirfds.opened_dir_at(dir_fd, LOCKS_SUBDIR) as locks:
            lock = os.open(
                f"{hash_part}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=locks
            )
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if is_complete(dir_fd, name):
                return False
            os.unlink(name, dir_fd=dir_fd)
            return True
        finally:
            os.close(lock)  # the flock goes with the descriptor
    except OSError:  # held by a build, or no lock to be had: left as it is
        return False
