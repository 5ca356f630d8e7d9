"""The quarantine kept bounded: at most :data:`MAX_ENTRIES` entries and :data:`MAX_BYTES` per
quarantine root, the oldest removed first.

A quarantine entry is evidence for an operator, never loaded. Without a bound, a co-tenant who
keeps breaking a cache (or a store that keeps serving a bad one) fills the victim's disk one
entry a boot. Entries are named ``<UTC time>-<pid>-<random>-<name>-<reason>`` (a directory, its
sidecar beside it as ``….plancache.sig``) by :func:`.cachedir.quarantine`: they are ordered by
that time, then by when they were renamed in (their change time); the entry just moved in
(``keep``) is always kept, even alone over the byte cap, whatever the others' stamps say: a
clock that was ahead once stamped entries in the future, and ordered by name alone they would
outrank, and delete, the evidence of the quarantine that just happened. An entry stamped
later than ``keep`` sorts as the oldest (its stamp cannot be right). Dot-names (temporaries,
the fetch back-off record) are not entries. Removal goes through the root's descriptor and
follows no link (shutil's descriptor-based ``rmtree``); what cannot be removed (another user's
directory inside an entry) is left and tried again next time.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat

from ...trust.compile_cache.manifest import MAX_DIRS, MAX_FILES

MAX_ENTRIES = 8
"""Entries kept per quarantine root (a cache and its sidecar are one entry)."""
MAX_BYTES = 512 << 20
"""Bytes kept per quarantine root (the newest entry is kept whatever its size)."""
SIDECAR_SUFFIX = ".plancache.sig"
_ENTRY = re.compile(r"[0-9]{8}T[0-9]{6}Z-[0-9]+-[0-9a-f]{8}-.+")


def prune(
    root_fd: int,
    *,
    keep: str = "",
    max_entries: int = MAX_ENTRIES,
    max_bytes: int = MAX_BYTES,
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
        if _ENTRY.fullmatch(name):
            entries.setdefault(name.removesuffix(SIDECAR_SUFFIX), []).append(name)
    keep = keep.removesuffix(SIDECAR_SUFFIX)
    latest = keep[:16] if keep in entries else ""

    def newest_first(entry: str) -> tuple[bool, tuple[str, int]]:
        stamp, changed = _age(root_fd, entry)
        future = bool(latest) and stamp > latest  # a clock that was ahead: not to be believed
        return (entry == keep, ("", changed) if future else (stamp, changed))

    kept = total = removed = 0
    for entry in sorted(entries, key=newest_first, reverse=True):
        size = sum(_size(root_fd, name) for name in entries[entry])
        if entry == keep or kept == 0 or (kept < max_entries and total + size <= max_bytes):
            kept, total = kept + 1, total + size
            continue
        for name in entries[entry]:
            _remove(root_fd, name)
        removed += 1
    return removed


def _age(dir_fd: int, entry: str) -> tuple[str, int]:
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


def _size(dir_fd: int, name: str) -> int:
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


def _remove(dir_fd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
