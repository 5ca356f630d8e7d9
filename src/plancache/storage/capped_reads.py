"""One store object's bytes, capped, by the store's kind: the read every fetch makes.

Each kind has its own capped read, because the SDKs' own whole-object reads are not capped:
s3fs's ``_cat_file`` reads a body whole when the server ignores the range, adlfs's joins the
whole response. So S3 goes through :func:`.s3.reads.s3_read`, Azure through
:func:`.azure.blob.azure_read`, ``file://`` through :func:`.local.files.read_capped`
(non-blocking, no final symlink: a FIFO never blocks the open), every other fsspec filesystem
through ``cat_file`` of ``cap + 1`` bytes with its SDK's whole-body reads capped
(:mod:`.caps.http`).
A synchronous caller's read (:func:`read_now`) on ``s3://`` before s3fs is made (a boot: a
plan set, a compile cache's objects) goes through plain botocore instead (:mod:`.s3.direct`),
capped the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..clock import Deadline
from ..trust.errors import Reason, Rejected
from .deadline import http_status, store_error, with_retries
from .listing import cap_for
from .local.files import read_capped
from .threads import in_thread

if TYPE_CHECKING:
    from .store import Store


async def read_object(
    store: Store, name: str, deadline: Deadline, *, cap: int | None = None
) -> bytes | None:
    """One object's bytes (None if absent), at most ``cap`` (a plan's or sidecar's by its name);
    retried while transient, inside ``deadline``.

    Raises:
        Rejected: the object is larger than the cap (reason ``too-large``); no cap given and a
            name that is not a plan's, sidecar's or plan set's (``malformed``).
        PlanCacheError: every other failure typed (:func:`.deadline.store_error`): a
            ``StoreError`` or ``StoreTimeout``, or plancache's own error from a capped body.
    """
    cap = cap_for(name) if cap is None else cap
    path = store.path(name)

    async def attempt() -> bytes | None:
        if store.kind == "s3":
            from .s3.reads import s3_read

            return await s3_read(store._fs, path, cap)
        if store.kind == "azure":
            from .azure.blob import azure_read

            return await azure_read(store._fs, path, cap)
        if store.kind == "local":
            return await in_thread(read_capped, Path(path), cap)
        from .caps.http import body_cap

        with body_cap(cap + 1):
            return bytes(await store._call("cat_file", path, start=0, end=cap + 1))

    import asyncio  # here, not at import: a boot's blocking read never loads it

    try:
        data = await with_retries(attempt, deadline)
    except FileNotFoundError:
        return None
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if http_status(exc) == 416:  # a range from byte 0 fails only over an empty object
            return b""
        raise store_error(f"cannot read {name}", exc) from None
    if data is not None and len(data) > cap:
        raise Rejected(Reason.TOO_LARGE, f"{name} in the store is larger than {cap} bytes")
    return data


def read_now(
    store: Store, name: str, deadline: Deadline, *, cap: int | None = None
) -> bytes | None:
    """:func:`read_object` from a synchronous caller, waited for until ``deadline`` (its errors,
    ``StoreTimeout`` at the deadline); on ``s3://`` whose s3fs is not made yet, through
    :meth:`.s3.direct.S3Direct.get` (no s3fs import)."""
    direct = store._direct if store._fs is None else None
    if direct is not None:
        return direct.get(name, cap, deadline)
    return store._run(
        lambda: read_object(store, name, deadline, cap=cap), deadline, f"cannot read {name} from"
    )
