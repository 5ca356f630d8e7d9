"""One object read with its version, and deleted only while it is still that version.

A delete by name removes whatever the name holds by then. The object stores plancache writes
to can make a delete conditional instead, on a version token the read returned: the store
itself then refuses (412) to delete an object replaced since. Each backend states the version
in its own way, and only the read that returned the bytes may state it (a version taken from
a later request could be a newer object's):

* S3: the GET's ``ETag``; ``DeleteObject`` with ``IfMatch``;
* GCS: the ``generation`` in the object's metadata, then the bytes read pinned to it
  (``generation=``: a replaced generation reads as absent, never as the new bytes);
  ``DELETE`` with ``ifGenerationMatch``;
* Azure Blob: the download's ``ETag``; ``Delete Blob`` with ``If-Match``.

The reads are the store's own capped reads: S3 and Azure through :func:`.s3.reads.s3_get` and
:func:`.azure.blob.azure_get` (declared length checked first, at most ``cap + 1`` bytes), which also
hand back the answer's ETag; gcsfs's whole-body reads are capped by :func:`.caps.http.body_cap`. A store that states no
usable version is a StoreError: nothing is deleted unconditionally on these backends.
:mod:`.conditional_deletes` uses these to delete only what ``prune`` judged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar

from ..trust.errors import StoreError
from .caps.http import body_cap
from .deadline import causes, http_status

T = TypeVar("T")

MAX_TOKEN = 256
"""Longest version token (ETag, generation) taken from a store: it goes back in a header."""


@dataclass(frozen=True)
class Versioned:
    """An object's bytes and the version they are (``None`` and ``None``: absent)."""

    data: bytes | None
    token: str | None


ABSENT = Versioned(None, None)


def _token(value: Any, path: str) -> str:
    """A version token fit to send back in a header; StoreError if the store stated none."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and 0 < len(value) <= MAX_TOKEN and value.isascii() and value.isprintable():
        return value
    raise StoreError(f"{path}: the store states no usable version (ETag or generation), so no conditional delete")


async def _ranged_or_whole(read: Callable[[str | None], Awaitable[T]], cap: int) -> T:
    """``read`` with the range ``bytes=0-cap``; without one for an empty object (S3, GCS and
    Azure answer 416 to any range over it), whose body every reader still reads capped."""
    try:
        return await read(f"bytes=0-{cap}")
    except Exception as exc:
        if http_status(exc) != 416:
            raise
    return await read(None)


async def _s3_read(fs: Any, path: str, cap: int) -> Versioned:
    """:func:`.s3.reads.s3_get`, and the answer's ETag."""
    from .s3.reads import s3_get

    data, resp = await _ranged_or_whole(lambda byte_range: s3_get(fs, path, cap, byte_range), cap)
    return Versioned(data, _token(resp.get("ETag"), path))


async def _s3_delete(fs: Any, path: str, token: str) -> None:
    bucket, key, _ = fs.split_path(path)
    await fs._call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=token)


async def _gcs_read(fs: Any, path: str, cap: int) -> Versioned:
    """The generation from the object's metadata, then the bytes of that generation: one the
    store replaced in between is absent (404) rather than read as the new bytes."""
    bucket, key, _ = fs.split_path(path)
    meta = await fs._call("GET", "b/{}/o/{}", bucket, key, json_out=True)  # body capped by .caps.http
    token = _token(meta.get("generation") if isinstance(meta, dict) else None, path)
    if not token.isdigit():
        raise StoreError(f"{path}: the store states a generation that is not a number")
    url = fs.url(path, generation=token)

    async def get(byte_range: str | None) -> bytes:
        with body_cap(cap + 1):
            _, data = await fs._call("GET", url, headers={"Range": byte_range} if byte_range else {})
        return bytes(data)

    return Versioned(await _ranged_or_whole(get, cap), token)


async def _gcs_delete(fs: Any, path: str, token: str) -> None:
    bucket, key, _ = fs.split_path(path)
    await fs._call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=token)


async def _azure_read(fs: Any, path: str, cap: int) -> Versioned:
    """:func:`.azure.blob.azure_get`, and the answer's ETag."""
    from .azure.blob import azure_get

    data, headers = await _ranged_or_whole(lambda byte_range: azure_get(fs, path, cap, byte_range), cap)
    return Versioned(data, _token(headers.get("ETag"), path))


async def _azure_delete(fs: Any, path: str, token: str) -> None:
    from azure.core import MatchConditions
    from azure.core.exceptions import HttpResponseError

    container, blob, _ = fs.split_path(path)
    async with fs.service_client.get_blob_client(container, blob) as client:
        try:
            await client.delete_blob(etag=token, match_condition=MatchConditions.IfNotModified)
        except HttpResponseError as exc:
            # an absent blob fails If-Match too (412, as RFC 9110 has it; Azurite does): gone is not changed
            if exc.status_code == 404 or (exc.status_code == 412 and not await client.exists()):
                raise FileNotFoundError(path) from None
            raise


READS: dict[str, Callable[[Any, str, int], Awaitable[Versioned]]] = {
    "s3": _s3_read, "gcs": _gcs_read, "azure": _azure_read,
}
DELETES: dict[str, Callable[[Any, str, str], Awaitable[None]]] = {
    "s3": _s3_delete, "gcs": _gcs_delete, "azure": _azure_delete,
}
"""Backends with a precondition on deletes, by :attr:`.store.Store.kind`."""


def precondition_failed(exc: BaseException) -> bool:
    """The store refused because the object is no longer that version (412; gcsfs raises
    FileExistsError for it)."""
    return http_status(exc) == 412 or any(isinstance(c, FileExistsError) for c in causes(exc))
