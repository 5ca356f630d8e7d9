"""One object read with its version, deleted only while it is still that version: the S3 GET's
``ETag``, and ``DeleteObject`` with ``IfMatch`` (what they share: :mod:`..versioned`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..versioned import Versioned, ranged_or_whole, version_token

if TYPE_CHECKING:
    from .reads import S3Filesystem


async def read(fs: S3Filesystem, path: str, cap: int) -> Versioned:
    """:func:`.reads.s3_get`, and the answer's ETag."""
    from .reads import s3_get

    data, resp = await ranged_or_whole(lambda byte_range: s3_get(fs, path, cap, byte_range), cap)
    return Versioned(data, version_token(resp.get("ETag"), path))


async def delete(fs: S3Filesystem, path: str, token: str) -> None:
    """Delete the object at ``path`` only while its ETag is ``token`` (the store answers 412
    otherwise: :func:`..versioned.precondition_failed`)."""
    bucket, key, _ = fs.split_path(path)
    await fs._call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=token)
