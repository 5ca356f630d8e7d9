"""Boot records on disk: ``$VLLM_CACHE_ROOT/plancache/boot/<name>.json``, a bounded number kept.

One small JSON file per worker boot (what the plugin decided, what vLLM then did, the time
saved), for a node agent to collect and for ``plancache doctor`` to show. Moves bytes only:
every write goes through descriptors (:mod:`.dirfds`: no component below the cache root is
followed if it is a link; the file is an ``O_EXCL | O_NOFOLLOW`` temporary renamed into
place), reads are capped and never follow a link, and the oldest records beyond
:data:`KEEP` are removed, with what a killed writer left of them, so a crash-looping worker cannot
fill the disk.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path
from typing import NamedTuple

from . import dirfds

SUBDIR = ("plancache", "boot")
KEEP = 64
"""Records kept per cache root (a node's last boots: every worker of a few restarts)."""
MAX_RECORD_BYTES = 64 * 1024
_NAME = re.compile(r"[0-9]{8}T[0-9]{6}Z-[0-9]+-r[0-9]+-[0-9a-f]{8}\.json")
"""``<UTC time>-<pid>-r<rank>-<random>.json``: sorting by name sorts by time."""


def _record_of(name: str) -> str | None:
    """The record ``name`` is, or is a temporary of (:func:`.dirfds.temp_target`), left behind
    by a writer killed between its creation and its rename: counted with its record, so it goes
    when its record would (None: neither)."""
    target = dirfds.temp_target(name)
    record = name if target is None else target
    return record if _NAME.fullmatch(record) else None


def directory(root: Path) -> Path:
    """Where the boot records of cache root ``root`` live."""
    return root.joinpath(*SUBDIR)


def is_record_name(name: str) -> bool:
    """Whether ``name`` is a boot record's (``<UTC time>-<pid>-r<rank>-<random>.json``)."""
    return _NAME.fullmatch(name) is not None


def write(root: Path, name: str, data: bytes, *, keep: int = KEEP, prune: bool = True) -> Path:
    """Replace record ``name`` atomically, then (``prune``) remove the oldest beyond ``keep``.
    A record rewritten at each event of its boot adds a file only at its first write: its
    rewrites skip the directory's listing (``prune=False``), on a boot's critical path.

    Raises:
        ValueError: ``name`` is not a boot record's (:func:`is_record_name`).
        StoreError: a link or not a directory on the way (reason ``store-error``).
        OSError: the directory or the file cannot be made or written: the caller logs and goes
            on.
    """
    if not is_record_name(name):
        raise ValueError(f"not a boot record name: {name!r}")
    with dirfds.opened_dir(root, directory(root), create=True, mode=0o755) as fd:
        # no fsync on a boot's path
        dirfds.write_new(fd, name, data, mode=0o644, sync_dir=False, sync_file=False)
        if prune:
            _prune(fd, keep)
    return directory(root) / name


def _prune(dir_fd: int, keep: int) -> None:
    """Remove the records beyond the newest ``keep``, and the temporaries left of them: a worker
    killed while its record was being written (the OOM killer in a crash loop) leaves one that
    nothing else would ever remove, so they count against the same bound (red team 8a)."""
    found = [(record, n) for n in os.listdir(dir_fd) if (record := _record_of(n)) is not None]
    newest = sorted({record for record, _ in found})
    kept = set(newest[max(0, len(newest) - keep) :])
    for record, name in found:
        if record not in kept:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)


READ_FILES = 4 * KEEP
"""Records one fleet read looks at, at most (:func:`read_newest`): every rank's newest of a
node's last boots; more than :data:`KEEP` because older plancache versions, or another writer
of the directory, may have left more, and a directory filled with names must not make
``doctor`` read without end."""
READ_BYTES = 4 * 1024 * 1024
"""Bytes one fleet read takes in, at most (a few dozen full-size records)."""


class Found(NamedTuple):
    """What :func:`read_newest` read, passed over and left unread: a caller can say what it did
    not see instead of showing a partial view as whole."""

    records: list[tuple[str, bytes]]
    """(name, bytes), newest first."""
    skipped: list[str]
    """One ``"<name>: why"`` per record passed over: a link or not a regular file, over
    :data:`MAX_RECORD_BYTES`, unreadable (or the directory itself, unreadable)."""
    unread: int
    """Older records not looked at: beyond the records, files or bytes of one read."""


def read_last(root: Path, limit: int) -> list[tuple[str, bytes]]:
    """The newest ``limit`` records (newest first) as (name, bytes); a record that is not a
    regular file, or is over the cap, is skipped. Nothing there: an empty list."""
    return read_newest(root, limit=limit).records


def read_newest(
    root: Path, *, limit: int = READ_FILES, max_bytes: int = READ_BYTES, files: int | None = None
) -> Found:
    """The newest ``limit`` records, newest first, looking at ``files`` names (default: the
    larger of ``limit`` and :data:`READ_FILES`) and taking in ``max_bytes`` at most (see
    :class:`Found`). Nothing there: all empty."""
    files = max(limit, READ_FILES) if files is None else files
    try:
        fd = dirfds.open_dir(root, directory(root), create=False)
    except (FileNotFoundError, NotADirectoryError):
        return Found([], [], 0)
    except OSError as exc:  # not ours to read (EACCES): said, not an internal error
        return Found([], [f"{directory(root)}: cannot open ({exc.strerror or exc})"], 0)
    found: list[tuple[str, bytes]] = []
    skipped: list[str] = []
    taken = 0
    try:
        try:
            names = sorted((n for n in os.listdir(fd) if is_record_name(n)), reverse=True)
        except OSError as exc:
            return Found([], [f"{directory(root)}: cannot list ({exc.strerror or exc})"], 0)
        for number, name in enumerate(names):
            if len(found) >= limit or number >= files or taken >= max_bytes:
                return Found(found, skipped, len(names) - number)
            data, why = _read(fd, name)
            if data is None:
                skipped.append(f"{name}: {why}")
                continue
            taken += len(data)
            found.append((name, data))
    finally:
        os.close(fd)
    return Found(found, skipped, 0)


def _read(dir_fd: int, name: str) -> tuple[bytes | None, str]:
    """The record's bytes, or None and why not (never following a link, never blocking on a
    FIFO)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        return None, f"cannot open ({exc.strerror or exc})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file"
        if st.st_size > MAX_RECORD_BYTES:
            return None, f"larger than {MAX_RECORD_BYTES} bytes"
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_RECORD_BYTES + 1)
        return (
            (data, "")
            if len(data) <= MAX_RECORD_BYTES
            else (None, f"larger than {MAX_RECORD_BYTES} bytes")
        )
    except OSError as exc:
        return None, f"cannot read ({exc.strerror or exc})"
    finally:
        os.close(fd)
