"""Boot records on disk: ``$VLLM_CACHE_ROOT/plancache/boot/<name>.json``, a bounded number kept.

One small JSON file per worker boot (what the plugin decided, what vLLM then did, the time
saved), for a node agent to collect and for ``plancache doctor`` to show. Moves bytes only:
every write goes through descriptors (:mod:`.dirfds`: no component below the cache root is
followed if it is a link; the file is an ``O_EXCL | O_NOFOLLOW`` temporary renamed into
place), reads are capped and never follow a link, and the oldest records beyond
:data:`KEEP` are removed so a crash-looping worker cannot fill the disk.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path

from . import dirfds

SUBDIR = ("plancache", "boot")
KEEP = 64
"""Records kept per cache root (a node's last boots: every worker of a few restarts)."""
MAX_RECORD_BYTES = 64 * 1024
_NAME = re.compile(r"[0-9]{8}T[0-9]{6}Z-[0-9]+-r[0-9]+-[0-9a-f]{8}\.json")
"""``<UTC time>-<pid>-r<rank>-<random>.json``: sorting by name sorts by time."""


def directory(root: Path) -> Path:
    return root.joinpath(*SUBDIR)


def is_record_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def write(root: Path, name: str, data: bytes, keep: int = KEEP) -> Path:
    """Replace record ``name`` atomically, then remove the oldest beyond ``keep``. OSError or
    StoreError (a link on the way) propagate: the caller logs and goes on."""
    if not is_record_name(name):
        raise ValueError(f"not a boot record name: {name!r}")
    with dirfds.opened_dir(root, directory(root), True, 0o755) as fd:
        dirfds.write_new(fd, name, data, mode=0o644, sync_dir=False, sync_file=False)  # no fsync on a boot's path
        names = sorted(n for n in os.listdir(fd) if is_record_name(n))
        for old in names[: max(0, len(names) - keep)]:
            with contextlib.suppress(OSError):
                os.unlink(old, dir_fd=fd)
    return directory(root) / name


def read_last(root: Path, limit: int) -> list[tuple[str, bytes]]:
    """The newest ``limit`` records (newest first) as (name, bytes); a record that is not a
    regular file, or is over the cap, is skipped. Nothing there: an empty list."""
    try:
        fd = dirfds.open_dir(root, directory(root), create=False)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found: list[tuple[str, bytes]] = []
    try:
        for name in sorted((n for n in os.listdir(fd) if is_record_name(n)), reverse=True):
            if len(found) >= limit:
                break
            data = _read(fd, name)
            if data is not None:
                found.append((name, data))
    finally:
        os.close(fd)
    return found


def _read(dir_fd: int, name: str) -> bytes | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RECORD_BYTES:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_RECORD_BYTES + 1)
        return data if len(data) <= MAX_RECORD_BYTES else None
    finally:
        os.close(fd)
