"""The record of caches that keep failing the same way (``.plancache-failures.json`` in the
quarantine directory).

Moves bytes and decides nothing (:mod:`plancache.pipeline.compile_cache.fetch_backoff` decides
when a cache is fetched again). It lies in the cache root's own quarantine directory (this
user's, mode 0700, reached without following links: no co-tenant can write it), survives
restarts, and is bounded: at most :data:`MAX_SUBJECTS` caches (the most recent failures) and
:data:`MAX_BYTES` on disk. Its bytes are parsed as hostile all the same: anything that is not
the expected shape reads as no record (the worst it costs is a fetch).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..local import dirfds

RECORD = ".plancache-failures.json"
MAX_SUBJECTS = 64
MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class Failure:
    """One cache's last failure: what it was (``quarantined:<reason>``,
    ``store-rejected:<reason>``), how many times in a row, when last (seconds since the
    epoch, on the caller's clock), and the sha256 of the store's signature for it then ("":
    not known)."""

    failure: str
    count: int
    at: float
    store_sig: str = ""


def read(base: Path, quarantine_root: Path) -> dict[str, Failure]:
    """Every recorded failure by subject; {} when there is no record, or it cannot be read or
    trusted (another user's directory, a link, a file not of the expected shape)."""
    try:
        with dirfds.opened_dir(base, quarantine_root, create=False) as fd:
            dirfds.require_owned(fd, quarantine_root)
            data = _read(fd)
        raw = json.loads(data) if data else {}
        return {
            subject: Failure(
                str(v["failure"])[:200],
                int(v["count"]),
                float(v["at"]),
                str(v.get("store_sig", ""))[:64],
            )
            for subject, v in dict(raw).items()
            if isinstance(subject, str) and isinstance(v, dict)
        }
    except Exception:  # a record that cannot be read is no record
        return {}


def write(base: Path, quarantine_root: Path, records: dict[str, Failure]) -> None:
    """Replace the record (atomically, through descriptors) with ``records``' most recent
    :data:`MAX_SUBJECTS`; the quarantine directory is made (0700) if missing.

    Raises:
        StoreError: a link on the way, or the directory is another user's.
        OSError: it cannot be written (a full disk): the caller goes on without a record.
    """
    newest = sorted(records.items(), key=lambda item: item[1].at, reverse=True)[:MAX_SUBJECTS]
    data = json.dumps(
        {
            s: {"failure": f.failure, "count": f.count, "at": f.at, "store_sig": f.store_sig}
            for s, f in newest
        },
        sort_keys=True,
    ).encode()
    with dirfds.opened_dir(base, quarantine_root, create=True, mode=0o700) as fd:
        dirfds.require_owned(fd, quarantine_root)
        if len(data) > MAX_BYTES:
            data = b"{}"
        dirfds.write_new(fd, RECORD, data, mode=0o600)


def _read(dir_fd: int) -> bytes:
    try:
        fd = os.open(RECORD, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        data = os.read(fd, MAX_BYTES + 1)
        return data if len(data) <= MAX_BYTES else b""
    finally:
        os.close(fd)
