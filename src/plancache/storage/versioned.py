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
:func:`.azure.blob.azure_get` (declared length checked first, at most ``cap + 1`` bytes), which
also hand back the answer's ETag; gcsfs's whole-body reads are capped by
:func:`.caps.http.body_cap`. A store that states no usable version is a StoreError: nothing is
deleted unconditionally on these backends. :mod:`.conditional_deletes` uses these to delete only
what ``prune`` judged. Each backend's read and delete is in its own room
(:mod:`.s3.s3_backend`, :mod:`.gcs.gcs_backend`, :mod:`.azure.azure_backend`); here are only
what they share: the versioned bytes, the token check and the ranged read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..trust.errors import StoreError
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


def version_token(value: Any, path: str) -> str:
    """A version token fit to send back in a header (an int is stated as its digits).

    Raises:
        StoreError: ``value`` is no usable token: missing, empty, longer than MAX_TOKEN or not
            printable ASCII (reason ``store-error``).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if (
        isinstance(value, str)
        and 0 < len(value) <= MAX_TOKEN
        and value.isascii()
        and value.isprintable()
    ):
        return value
    raise StoreError(
        f"{path}: the store states no usable version (ETag or generation), so no conditional delete"
    )


async def ranged_or_whole(read: Callable[[str | None], Awaitable[T]], cap: int) -> T:
    """``read`` with the range ``bytes=0-cap``; without one for an empty object (S3, GCS and
    Azure answer 416 to any range over it), whose body every reader still reads capped.

    Raises:
        Exception: whatever ``read`` raised but a 416, as it is (an SDK's error, a typed one).
    """
    try:
        return await read(f"bytes=0-{cap}")
    except Exception as exc:
        if http_status(exc) != 416:
            raise
    return await read(None)


def precondition_failed(exc: BaseException) -> bool:
    """The store refused because the object is no longer that version (412; gcsfs raises
    FileExistsError for it)."""
    return http_status(exc) == 412 or any(isinstance(c, FileExistsError) for c in causes(exc))
