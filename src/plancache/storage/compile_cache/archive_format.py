"""A compile cache's archive: one deterministic tar written, only the signed entries extracted.

Archives are plain tar (ustar, PAX headers only where a name needs them) written in one
deterministic form (sorted entries, mode 0755/0644, owner 0, mtime 0), so the signer can sign
the archive's sha256 and ``push`` rebuild the identical bytes. Extraction never calls
``extractall``: each member must be a directory or regular file named exactly as the
verified manifest lists it, in order, at its signed size; it is written with ``O_EXCL``
under a fresh temporary directory, and nothing else of the member (mode, owner, links) is used.

The format is apart from the directory it packs (:mod:`.cachedir`: walk, hash, install,
quarantine) because it has rules of its own that the signer, ``push`` and ``pull`` share, while
nothing that walks or moves a directory reads a tar; the archive's objects in a store are
:mod:`.archives`.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from ...trust.compile_cache.manifest import FileEntry, Manifest
from ...trust.errors import Reason, Rejected
from .cachedir import CHUNK


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
    """The deterministic tar of ``root``'s listed entries (directories first, then files, each
    sorted), written to ``out``.

    Raises:
        Rejected: a listed file that is not a regular file now (reason ``malformed``), or whose
            size changed while it was archived (``digest-mismatch``).
        OSError: a listed file cannot be opened (a link, since nothing is followed; gone).
    """
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
        """At most ``n`` bytes (all that is left: ``n < 0``), never past the size.

        Raises:
            Rejected: the file ends before its size (reason ``digest-mismatch``).
        """
        data = self._f.read(self._left if n < 0 else min(n, self._left))
        self._left -= len(data)
        if n and not data and self._left > 0:
            raise Rejected(Reason.DIGEST_MISMATCH, f"'{self._name}' changed while it was archived")
        return data


def archive_bytes(
    root: Path, manifest_files: tuple[FileEntry, ...], dirs: tuple[str, ...]
) -> bytes:
    """:func:`write_archive` into memory: the archive's bytes (what is signed and pushed)."""
    buffer = io.BytesIO()
    write_archive(root, manifest_files, dirs, buffer)
    return buffer.getvalue()


def extract_archive(data: bytes, manifest: Manifest, dest: Path) -> None:
    """Extract an archive whose sha256 the caller checked against ``manifest`` into ``dest``,
    a directory this creates: exactly the manifest's entries, in its order, nothing else.

    Raises:
        Rejected: an entry that is not the manifest's next one by name, kind or size, or more or
            fewer entries than it lists (reason ``malformed``).
        OSError: ``dest`` or an entry cannot be created (it exists, a full disk).
    """
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
            if source is None:  # a regular member always has a body: never copied from nothing
                raise Rejected(
                    Reason.MALFORMED,
                    f"archive entry '{name}' is not a regular file of {size} bytes",
                )
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(source, out, CHUNK)
    if position != len(expected):
        raise Rejected(
            Reason.MALFORMED, f"the archive holds {position} of the {len(expected)} signed entries"
        )


def archive_members(data: bytes) -> Iterator[tuple[str, bytes]]:
    """Each regular file of an archive this node wrote (:func:`write_archive`), by name: what a
    store would hold, for the check that nothing private leaves the node."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|", encoding="utf-8") as tar:
        for member in tar:
            source = tar.extractfile(member) if member.isreg() else None
            if source is not None:
                yield member.name, source.read()
