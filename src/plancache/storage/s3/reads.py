"""The S3 read path, through s3fs's botocore client: one capped ranged GET, one listing page.

s3fs's own ``_cat_file`` and ``_ls`` are bypassed: the first reads a body whole when the
server ignores the Range header, the second walks every page of a listing into one list
before returning. Bodies botocore reads itself (error documents, listing pages) are capped
by :mod:`..caps.http`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ..caps.http import read_declared
from ..listing import PAGE_SIZE, Page, entries_under, prefixes_under


class S3Filesystem(Protocol):
    """What plancache calls on s3fs's ``S3FileSystem`` (s3fs ships no types)."""

    def split_path(self, path: str) -> tuple[str, str, str | None]: ...

    async def _call_s3(self, method: str, **kwargs: Any) -> dict[str, Any]: ...


async def s3_get(
    fs: S3Filesystem, path: str, cap: int, byte_range: str | None
) -> tuple[bytes, Mapping[str, Any]]:
    """A GET (of ``byte_range``, or whole) whose declared length is checked before a byte of the
    body is read, and whose body is read at most to ``cap + 1`` even if the server ignores the
    range; with the answer's other fields (its ETag: see
    :meth:`.s3_backend.S3Backend.read_versioned`)."""
    bucket, key, _ = fs.split_path(path)
    resp = await fs._call_s3(
        "get_object", Bucket=bucket, Key=key, **({"Range": byte_range} if byte_range else {})
    )
    body = resp["Body"]
    try:
        return await read_declared(
            body.read, key.rsplit("/", 1)[-1], cap, resp.get("ContentLength")
        ), resp
    finally:
        body.close()


async def s3_read(fs: S3Filesystem, path: str, cap: int) -> bytes:
    """One object's bytes, from a GET of ``bytes=0-cap`` (a 416 over an empty object: see
    :meth:`..store.Store.read_capped`)."""
    return (await s3_get(fs, path, cap, f"bytes=0-{cap}"))[0]


async def s3_listing(
    fs: S3Filesystem, bucket: str, prefix: str, token: str | None
) -> dict[str, Any]:
    """One ``ListObjectsV2`` answer directly under ``prefix`` (``Delimiter='/'``), from
    ``token``: the request the store's listing pages and a folder's listing share."""
    kwargs: dict[str, Any] = {
        "Bucket": bucket,
        "Prefix": prefix,
        "Delimiter": "/",
        "MaxKeys": PAGE_SIZE,
    }
    if token:
        kwargs["ContinuationToken"] = token
    return await fs._call_s3("list_objects_v2", **kwargs)


async def s3_page(fs: S3Filesystem, root: str, token: str | None) -> Page:
    """One ``ListObjectsV2`` page of the objects directly under ``root`` (``Delimiter='/'``),
    and of the sub-prefixes it names."""
    bucket, key, _ = fs.split_path(root)
    prefix = f"{key.rstrip('/')}/" if key else ""
    resp = await s3_listing(fs, bucket, prefix, token)
    entries = entries_under(resp.get("Contents"), prefix, "Key", "Size")
    common = [p.get("Prefix") for p in resp.get("CommonPrefixes") or [] if isinstance(p, dict)]
    following = resp.get("NextContinuationToken")
    more = resp.get("IsTruncated") is True and isinstance(following, str) and following != token
    return Page(entries, following if more else None, prefixes_under(common, bucket, prefix))
