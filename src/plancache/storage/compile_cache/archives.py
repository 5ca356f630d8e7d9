"""One larger object in a store: a compile-cache archive and its manifest signature.

:class:`~plancache.storage.store.Store` reads and writes plans, small and capped by their
names. A compile cache travels as one archive per cache directory (one GET), beside its
signature, under ``<prefix>/torch_compile_cache/<subject>.tar`` and ``….tar.sig``, where the
subject is ``torch_aot_compile/<64 hex>`` or ``<10 hex>``; its build node's precompiled headers
beside it as ``<subject>.pch.gz`` and ``….pch.gz.sig`` (signed on their own, optional). The
same guarantees hold here, through the store's own capped read, daemon-thread calls and
deadline: every read is capped (the caller passes the cap: the signature's size limit, or the
archive size the *verified* signature states), every operation runs under one deadline with
bounded retries, and listings yield subjects, never paths.
"""

from __future__ import annotations

from ...clock import Deadline
from ...trust.compile_cache.manifest import is_subject
from ...trust.errors import Reason, Rejected
from ..store import Store

ARCHIVE_SUFFIX = ".tar"
SIG_SUFFIX = ".tar.sig"
HEADERS_SUFFIX = ".pch.gz"
PREFIX = "torch_compile_cache"


def archive_name(subject: str) -> str:
    """The archive's object name under the store's prefix.

    Raises:
        Rejected: ``subject`` is not a compile cache's name (reason ``malformed``).
    """
    if not is_subject(subject):
        raise Rejected(Reason.MALFORMED, f"not a compile-cache name: {subject[:80]!r}")
    return f"{PREFIX}/{subject}{ARCHIVE_SUFFIX}"


def sig_name(subject: str) -> str:
    """The archive's signature object name (:func:`archive_name`'s errors)."""
    return archive_name(subject) + ".sig"


def headers_name(subject: str) -> str:
    """The gzip stream of the precompiled headers the cache's build node used (optional: a
    store written before it held none), beside the cache's archive."""
    return archive_name(subject)[: -len(ARCHIVE_SUFFIX)] + HEADERS_SUFFIX


def headers_sig_name(subject: str) -> str:
    """The headers' signature object name (:func:`archive_name`'s errors)."""
    return headers_name(subject) + ".sig"


def get_object(
    store: Store, name: str, cap: int, *, deadline: Deadline | None = None
) -> bytes | None:
    """The object's bytes (None if absent), at most ``cap``: the store's own capped read (a
    ranged GET whose body is cut at ``cap + 1`` even when the server ignores the range, a
    non-blocking open on local stores), retried and bounded like a plan's, with its errors
    (:meth:`..store.Store.read`). On ``s3://`` before s3fs is made (a boot's pull), through
    plain botocore (:mod:`..s3.direct`), capped the same."""
    return store.read(
        name,
        Deadline.after(store.timeout, store.clock) if deadline is None else deadline,
        cap=cap,
    )


def put_object(store: Store, name: str, data: bytes, *, deadline: Deadline | None = None) -> None:
    """Upload one object within the deadline (retrying transient failures); a failure is a
    ``StoreError`` (``StoreTimeout`` at the deadline)."""
    deadline = Deadline.after(store.timeout, store.clock) if deadline is None else deadline
    store.write_object(name, data, deadline)


def list_subjects(store: Store, deadline: Deadline | None = None) -> list[str]:
    """Subjects with a signature object in the store, sorted; any other name is ignored."""
    deadline = Deadline.after(store.timeout, store.clock) if deadline is None else deadline
    found: set[str] = set()
    for folder, nested in ((PREFIX, ""), (f"{PREFIX}/torch_aot_compile", "torch_aot_compile/")):
        for name in store.folder_names(folder, deadline):
            subject = nested + name[: -len(SIG_SUFFIX)] if name.endswith(SIG_SUFFIX) else ""
            if is_subject(subject):
                found.add(subject)
    return sorted(found)
