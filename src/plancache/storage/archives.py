"""One larger object in a store: a compile-cache archive and its manifest signature.

:class:`~plancache.storage.store.Store` reads and writes plans, small and capped by their
names. A compile cache travels as one archive per cache directory (one GET), beside its
signature, under ``<prefix>/torch_compile_cache/<subject>.tar`` and ``….tar.sig``, where the
subject is ``torch_aot_compile/<64 hex>`` or ``<10 hex>``. The same guarantees hold here,
built from the store's filesystem and deadline helpers: every read is capped (the caller
passes the cap: the signature's size limit, or the archive size the *verified* signature
states), every operation runs under one deadline with bounded retries, and listings yield
subjects, never paths.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..trust.errors import Reason, Rejected
from ..trust.manifest import is_subject
from .deadline import run_by, store_error, with_retries
from .store import Store

ARCHIVE_SUFFIX = ".tar"
SIG_SUFFIX = ".tar.sig"
PREFIX = "torch_compile_cache"


def archive_name(subject: str) -> str:
    if not is_subject(subject):
        raise Rejected(Reason.MALFORMED, f"not a compile-cache name: {subject[:80]!r}")
    return f"{PREFIX}/{subject}{ARCHIVE_SUFFIX}"


def sig_name(subject: str) -> str:
    return archive_name(subject) + ".sig"


async def _call(store: Store, name: str, *args: Any, **kwargs: Any) -> Any:
    if getattr(store.fs, "async_impl", False):
        return await getattr(store.fs, f"_{name}")(*args, **kwargs)
    return await asyncio.to_thread(getattr(store.fs, name), *args, **kwargs)


def _loop(store: Store) -> asyncio.AbstractEventLoop:
    if getattr(store.fs, "async_impl", False):
        return store.fs.loop  # type: ignore[no-any-return]
    from fsspec.asyn import get_loop

    return get_loop()


def get_object(store: Store, name: str, cap: int, deadline: float | None = None) -> bytes | None:
    """The object's bytes (None if absent), one ranged read of at most ``cap + 1`` bytes;
    ``TOO_LARGE`` beyond ``cap``."""
    deadline = time.monotonic() + store.timeout if deadline is None else deadline
    path = store.path(name)

    async def read() -> bytes | None:
        try:
            return bytes(await with_retries(lambda: _call(store, "cat_file", path, start=0, end=cap + 1), deadline))
        except FileNotFoundError:
            return None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise store_error(f"cannot read {name}", exc) from None

    data = run_by(_loop(store), read, deadline, f"cannot read {name} from {store.url}", store.timeout)
    if data is not None and len(data) > cap:
        raise Rejected(Reason.TOO_LARGE, f"{name} in the store is larger than {cap} bytes")
    return data


def put_object(store: Store, name: str, data: bytes, deadline: float | None = None) -> None:
    """Upload one object within the deadline (retrying transient failures)."""
    deadline = time.monotonic() + store.timeout if deadline is None else deadline
    path = store.path(name)

    async def write() -> None:
        parent = path.rpartition("/")[0]
        if parent and not getattr(store.fs, "async_impl", False):
            await _call(store, "makedirs", parent, exist_ok=True)  # local stores need the directory
        await with_retries(lambda: _call(store, "pipe_file", path, data), deadline)

    run_by(_loop(store), write, deadline, f"cannot upload {name} to {store.url}", store.timeout)


def list_subjects(store: Store, deadline: float | None = None) -> list[str]:
    """Subjects with a signature object in the store, sorted; any other name is ignored."""
    deadline = time.monotonic() + store.timeout if deadline is None else deadline
    found: set[str] = set()
    for folder, nested in ((PREFIX, ""), (f"{PREFIX}/torch_aot_compile", "torch_aot_compile/")):
        base = store.path(folder)

        async def listing(base: str = base) -> list[Any]:
            try:
                return list(await with_retries(lambda: _call(store, "ls", base, detail=False), deadline))
            except FileNotFoundError:
                return []

        for entry in run_by(_loop(store), listing, deadline, f"cannot list {store.url}", store.timeout):
            name = str(entry).rstrip("/").rpartition("/")[2]
            subject = nested + name[: -len(SIG_SUFFIX)] if name.endswith(SIG_SUFFIX) else ""
            if is_subject(subject):
                found.add(subject)
    return sorted(found)
