"""Listing a store page by page, so whole-store commands hold one page, never the whole store.

A listing is hostile input like any object: it names what plancache then reads or deletes,
and its size is the store's choice. So a listing

* is read one page (:data:`PAGE_SIZE` keys, one capped response) at a time, and keeps only
  the names of plans and sidecars directly under the prefix; a name that is not exactly
  ``startup_plan_<16 hex>.json[.sig]`` is dropped here, before anyone sees it;
* ends with ``TOO_LARGE`` beyond :data:`MAX_NAMES` such names or :data:`MAX_PAGES` pages
  (a server that says "truncated" forever), and at the operation's deadline in any case.

The request for one page is each backend's (:mod:`.s3.reads`, :mod:`.gcs.gcs_backend`,
:mod:`.azure.blob`), called by each scheme's backend (:mod:`.backend`); this module holds what they
share.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..trust.envelope import MAX_SIG_OBJECT_BYTES
from ..trust.errors import Reason, Rejected
from ..trust.plans.plan import MAX_PLAN_BYTES, fingerprint_of_plan_name, fingerprint_of_sig_name
from ..trust.plans.plan_set import MAX_SET_BYTES
from ..trust.plans.plan_set_names import set_object_id

PAGE_SIZE = 1000
"""Keys asked for per listing request (S3's and GCS's maximum)."""

MAX_NAMES = 100_000
"""Plan and sidecar names one listing may yield (50k plans with sidecars)."""

MAX_PAGES = 1_000
"""Listing requests one listing may make, whatever else shares the prefix."""


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing says about one plan or sidecar object (nothing here is trusted)."""

    name: str
    size: int | None
    md5: str | None
    """Hex MD5 of the content when the listing states it for free (S3 single-part ETag,
    GCS ``md5Hash``); push uses it to skip identical objects without downloading them."""


MAX_FOLDER_ENTRIES = 10_000
"""Entries one folder listing may hold (:meth:`.backend.Backend.list_dir`: a compile-cache
folder holds a few): past it the listing stops, whatever the store says follows."""

FolderPage = tuple[list[Any], list[Any], str | None]
"""One raw page of a folder listing as the server sent it: (object names, sub-prefix names,
where the next page starts or None)."""


async def folder_listing(
    page: Callable[[str | None], Awaitable[FolderPage]], bucket: str, prefix: str, path: str
) -> list[tuple[str, bool]]:
    """(``bucket/name``, is a directory) of each entry directly under ``prefix``, page by page
    (``page(token)``), kept as they come: at most :data:`MAX_FOLDER_ENTRIES` entries and
    :data:`MAX_PAGES` pages. The SDKs' own ``ls`` gathers every page of a listing into one list
    before returning, so a store whose listing never ends grew memory until the deadline.

    Raises:
        Rejected: past MAX_FOLDER_ENTRIES entries or MAX_PAGES pages (reason ``too-large``).
        FileNotFoundError: nothing is under ``prefix``.
    """
    entries: list[tuple[str, bool]] = []
    token: str | None = None
    for _ in range(MAX_PAGES):
        files, folders, following = await page(token)
        for names, is_dir in ((files, False), (folders, True)):
            for name in names:
                if isinstance(name, str) and name.startswith(prefix) and len(name) > len(prefix):
                    entries.append((f"{bucket}/{name.rstrip('/')}", is_dir))
        if len(entries) > MAX_FOLDER_ENTRIES:
            raise Rejected(Reason.TOO_LARGE, f"{path} lists more than {MAX_FOLDER_ENTRIES} entries")
        if following is None or following == token:
            break
        token = following
    else:
        raise Rejected(Reason.TOO_LARGE, f"the listing of {path} runs past {MAX_PAGES} pages")
    if not entries:
        raise FileNotFoundError(path)
    return entries


MAX_PAGE_PREFIXES = 100
"""Sub-prefixes one page may name that are kept (the deeper-prefix walk follows a few)."""


@dataclass(frozen=True)
class Page:
    entries: list[ObjectInfo]
    token: str | None
    """Where the next page starts; None on the last page."""
    prefixes: tuple[str, ...] = ()
    """Sub-prefixes one level below the listed one, as paths of the filesystem (``bucket/a/b``),
    validated by :func:`prefixes_under`; only :func:`.checks.deeper_prefixes` reads them."""


def cap_for(name: str) -> int:
    """The read cap of a store object by its name: the trust core's own size limits.

    Raises:
        Rejected: ``name`` is not a plan's, sidecar's or plan set's (reason ``malformed``).
    """
    if fingerprint_of_sig_name(name):
        return MAX_SIG_OBJECT_BYTES
    if fingerprint_of_plan_name(name):
        return MAX_PLAN_BYTES
    if set_object_id(name):
        return MAX_SET_BYTES
    raise Rejected(Reason.MALFORMED, f"not a plan or signature name: {name!r}")


def md5_hex(data: bytes) -> str:
    """The hex MD5 of ``data``, to compare with a listing's (:attr:`ObjectInfo.md5`); no
    security rests on it."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def md5_of(info: Mapping[str, Any]) -> str | None:
    """The hex MD5 a listed object's fields state for free (S3's single-part ETag, GCS's and
    Azure's base64 ``md5Hash``), else None."""
    etag = info.get("ETag") or info.get("etag")
    if isinstance(etag, str):
        etag = etag.strip('"')
        if len(etag) == 32 and "-" not in etag:
            return etag.lower()  # S3: a single-part upload's ETag is the MD5 of its bytes
    md5 = info.get("md5Hash")
    if isinstance(md5, str):
        try:
            raw = base64.b64decode(md5, validate=True)
        except (binascii.Error, ValueError):
            return None
        return raw.hex() if len(raw) == 16 else None
    return None


def entry_info(name: str, size: Any, info: Mapping[str, Any]) -> ObjectInfo | None:
    """An ObjectInfo for ``name`` (relative to the prefix) if it is a plan, sidecar or plan set
    name."""
    if not (fingerprint_of_plan_name(name) or fingerprint_of_sig_name(name) or set_object_id(name)):
        return None  # hostile or foreign: never a path we act on
    if isinstance(size, str) and size.isdigit():
        size = int(size)  # GCS states sizes as strings
    return ObjectInfo(name, size if type(size) is int else None, md5_of(info))


def entries_under(items: Any, prefix: str, name_key: str, size_key: str) -> list[ObjectInfo]:
    """The plan and sidecar entries of one listing page directly under ``prefix``: the page's
    items are whatever the server sent, so anything not shaped like an object is skipped."""
    entries = []
    for item in items if isinstance(items, list) else []:
        name = item.get(name_key) if isinstance(item, dict) else None
        if isinstance(name, str) and name.startswith(prefix):
            info = entry_info(name[len(prefix) :], item.get(size_key), item)
            if info is not None:
                entries.append(info)
    return entries


def prefixes_under(names: Any, bucket: str, prefix: str) -> tuple[str, ...]:
    """The sub-prefixes a page names (S3 ``CommonPrefixes``, GCS ``prefixes``, Azure blob
    prefixes) that are exactly one plain segment below ``prefix``, as ``bucket/prefix/segment``;
    at most :data:`MAX_PAGE_PREFIXES`. Anything else the server sent is dropped."""
    kept: list[str] = []
    for name in names if isinstance(names, (list, tuple)) else []:
        if len(kept) >= MAX_PAGE_PREFIXES:
            break
        if not isinstance(name, str) or len(name) > 1024 or not name.startswith(prefix):
            continue
        segment = name[len(prefix) :].removesuffix("/")
        if segment and segment not in (".", "..") and "/" not in segment and segment.isprintable():
            kept.append(f"{bucket}/{prefix}{segment}")
    return tuple(kept)


def local_entries(directory: str, limit: int) -> list[ObjectInfo]:
    """Regular files named like plans or sidecars in ``directory`` (links, FIFOs, devices
    skipped), at most ``limit`` of them; scanned without holding the rest of the directory."""
    found: list[ObjectInfo] = []
    try:
        with os.scandir(directory) as scan:
            for entry in scan:
                if not entry.is_file(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
                info = entry_info(entry.name, st.st_size, {}) if stat.S_ISREG(st.st_mode) else None
                if info is not None:
                    found.append(info)
                    if len(found) >= limit:
                        break
    except (FileNotFoundError, NotADirectoryError):
        return []
    return found


def fsspec_entries(fs: Any, prefix: str, listed: list[Any], limit: int) -> list[ObjectInfo]:
    """ObjectInfos from an fsspec ``ls(detail=True)`` result (memory:// and other backends)."""
    found: list[ObjectInfo] = []
    for entry in listed:
        if not isinstance(entry, Mapping) or entry.get("type", "file") != "file":
            continue
        full = entry.get("name")
        if not isinstance(full, str):
            continue
        full = fs._strip_protocol(full)
        info = (
            entry_info(full[len(prefix) :], entry.get("size"), entry)
            if full.startswith(prefix)
            else None
        )
        if info is not None:
            found.append(info)
            if len(found) >= limit:
                break
    return found
