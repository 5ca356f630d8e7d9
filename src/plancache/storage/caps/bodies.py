"""How much of an HTTP body anyone may read, and what a declared length promises.

Shared by the aiohttp-based SDK paths (:mod:`.http`, for s3fs, gcsfs and Azure) and the
plain-botocore boot path (:mod:`..s3.direct`), which must not import aiohttp: the caps and
the checks are one set of rules whichever client carried the bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...trust.errors import Reason, Rejected, StoreError

ERROR_BODY_CAP = 64 * 1024
"""Bytes of an error body read: S3 and GCS error documents are a few hundred bytes."""

BODY_CAP = 4 * 1024 * 1024
"""Bytes of a success body an SDK may read whole: a page of 1000 listed keys is ~0.5 MB."""

CHUNK = 1 << 16


def check_declared(name: str, cap: int, declared: Any) -> None:
    """Check a declared length before a byte is read.

    Raises:
        Rejected: the server itself declares more than ``cap`` bytes (reason ``too-large``).
    """
    if isinstance(declared, int) and declared > cap:
        raise Rejected(
            Reason.TOO_LARGE, f"{name} in the store is {declared} bytes, the cap is {cap}"
        )


MAX_DECLARED = 1 << 64
"""A Content-Length this large cannot be represented by aiohttp's parser (llhttp keeps an
unsigned 64-bit count): the s3fs path refuses it as a malformed answer, so the botocore path
does."""


def check_length_header(value: Any) -> None:
    """Refuse a Content-Length no HTTP parser should accept: anything but one decimal number
    (``-1``, ``+5``, ``5, 5`` from two headers, ``abc``), or one past :data:`MAX_DECLARED`.
    aiohttp (s3fs, gcsfs, Azure) refuses these before plancache sees the answer; http.client
    (botocore) would read ``-1`` as "until the connection closes", ``+5`` as 5, and hand
    botocore a length it cannot parse. Both paths now answer the same.

    Raises:
        StoreError: the header is such a length, a transport-level failure (reason
            ``store-error``).
    """
    if value is None:
        return
    text = str(value)
    if not (text.isascii() and text.isdigit()) or int(text) >= MAX_DECLARED:
        raise StoreError(f"the store declared an impossible length (Content-Length: {text[:40]!r})")


def check_complete(got: int, declared: Any) -> None:
    """A body shorter than declared is a dropped connection, retried.

    Raises:
        StoreError: ``got`` is below ``declared`` (transient; reason ``store-error``).
    """
    if isinstance(declared, int) and got < declared:
        raise StoreError(f"truncated body: {got} of {declared} bytes", transient=True)


def read_upto(read: Callable[[int], bytes], cap: int) -> bytes:
    """At most ``cap + 1`` bytes from a blocking ``read(n)``, however much the server sends
    (one byte over the cap is how a caller tells "larger than the cap" from "exactly it")."""
    chunks: list[bytes] = []
    got = 0
    while got <= cap:
        chunk = read(min(CHUNK, cap + 1 - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
