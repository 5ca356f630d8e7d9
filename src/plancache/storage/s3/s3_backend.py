"""``s3://`` as a :class:`~..backend.Backend`: s3fs's botocore client, called by plancache.

Reads are one capped ranged GET (:func:`.reads.s3_read`), listings one ``ListObjectsV2`` page
(:func:`.reads.s3_page`); a version is the GET's ``ETag`` and a delete is ``DeleteObject`` with
``IfMatch`` (what the backends share: :mod:`..versioned`). Until s3fs is needed, a boot's few
reads go through plain botocore instead (:attr:`direct`, :mod:`.direct`): s3fs and aiobotocore
are imported at :meth:`open`, the first call that is not such a read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..fsspec_backends import FsspecBackend
from ..listing import FolderPage, Page, folder_listing
from ..versioned import Versioned, ranged_or_whole, version_token
from .direct import S3Direct


class S3Backend(FsspecBackend):
    """One bucket's s3fs filesystem (made by ``opener``), and ``direct`` reads before it."""

    preconditions = True
    paged = True

    def __init__(
        self, opener: Callable[[], Any] | None = None, *, fs: Any = None, direct: S3Direct | None
    ) -> None:
        super().__init__("s3", opener=opener, fs=fs, asynchronous=True)
        self._direct = direct

    @property
    def direct(self) -> S3Direct | None:
        return self._direct

    # the SDK-facing modules are imported at the first call: a boot on the direct path imports
    # none of them (nor aiohttp, which the capped bodies need)
    async def read(self, path: str, cap: int) -> bytes | None:
        from .reads import s3_read

        try:
            return await s3_read(self.fs, path, cap)
        except FileNotFoundError:
            return None

    async def list_page(self, under: str, token: str | None) -> Page:
        from .reads import s3_page

        return await s3_page(self.fs, under, token)

    async def list_dir(self, path: str) -> list[tuple[str, bool]]:
        """``ListObjectsV2`` pages under ``path``, capped (:func:`..listing.folder_listing`),
        never s3fs's ``ls``, which gathers every page before returning."""
        fs = self.fs
        bucket, key, _ = fs.split_path(path)
        prefix = f"{key.rstrip('/')}/" if key else ""

        from .reads import s3_listing

        async def page(token: str | None) -> FolderPage:
            resp = await s3_listing(fs, bucket, prefix, token)
            files = [c.get("Key") for c in resp.get("Contents") or [] if isinstance(c, dict)]
            dirs = [
                p.get("Prefix") for p in resp.get("CommonPrefixes") or [] if isinstance(p, dict)
            ]
            following = resp.get("NextContinuationToken")
            more = resp.get("IsTruncated") is True and isinstance(following, str)
            return files, dirs, following if more else None

        return await folder_listing(page, bucket, prefix, path)

    async def read_versioned(self, path: str, cap: int) -> Versioned:
        """:func:`.reads.s3_get`, and the answer's ETag."""
        from .reads import s3_get

        fs = self.fs
        data, resp = await ranged_or_whole(
            lambda byte_range: s3_get(fs, path, cap, byte_range), cap
        )
        return Versioned(data, version_token(resp.get("ETag"), path))

    async def delete_if_unchanged(self, path: str, token: str) -> None:
        """Delete the object at ``path`` only while its ETag is ``token`` (the store answers 412
        otherwise: :func:`..versioned.precondition_failed`)."""
        bucket, key, _ = self.fs.split_path(path)
        await self.fs._call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=token)
