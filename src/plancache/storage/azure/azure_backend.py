"""``az://`` (``abfs://``, ``abfss://``) as a :class:`~..backend.Backend`: adlfs's blob service
client, with no SDK retries and plancache's capped transport (:mod:`.blob`).

Reads are one capped ranged download (:func:`.blob.azure_read`), listings one page
(:func:`.blob.azure_page`); a version is the download's ``ETag`` and a delete is conditional on
it (``If-Match``; what the backends share: :mod:`..versioned`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..fsspec_backends import FsspecBackend
from ..listing import PAGE_SIZE, FolderPage, Page, folder_listing
from ..versioned import Versioned, ranged_or_whole, version_token
from .blob import BoundedAzureBlobFileSystem, azure_get, azure_page, azure_read


class AzureBackend(FsspecBackend):
    """One storage account's :class:`.blob.BoundedAzureBlobFileSystem`."""

    preconditions = True
    paged = True

    def __init__(self, opener: Callable[[], Any]) -> None:
        super().__init__("azure", opener=opener, asynchronous=True)

    async def read(self, path: str, cap: int) -> bytes | None:
        try:
            return await azure_read(self.fs, path, cap)
        except FileNotFoundError:
            return None

    async def list_page(self, under: str, token: str | None) -> Page:
        return await azure_page(self.fs, under, token)

    async def list_dir(self, path: str) -> list[tuple[str, bool]]:
        """List Blobs pages under ``path``, capped (:func:`..listing.folder_listing`), never
        adlfs's ``ls``, which gathers every page before returning."""
        from azure.core.exceptions import ResourceNotFoundError
        from azure.storage.blob.aio import BlobPrefix

        fs: BoundedAzureBlobFileSystem = self.fs
        container, key, _ = fs.split_path(path)
        prefix = f"{key.rstrip('/')}/" if key else ""

        async with fs.service_client.get_container_client(container) as client:

            async def page(token: str | None) -> FolderPage:
                pages = client.walk_blobs(
                    name_starts_with=prefix or None, delimiter="/", results_per_page=PAGE_SIZE
                )
                pager = pages.by_page(continuation_token=token)
                files: list[Any] = []
                dirs: list[Any] = []
                try:
                    async for one in pager:
                        async for item in one:
                            (dirs if isinstance(item, BlobPrefix) else files).append(item.name)
                        break  # one page per call
                except ResourceNotFoundError:
                    raise FileNotFoundError(path) from None
                following = pager.continuation_token  # type: ignore[attr-defined]  # azure-core's AsyncPageIterator holds it
                return files, dirs, following if isinstance(following, str) and following else None

            return await folder_listing(page, container, prefix, path)

    async def read_versioned(self, path: str, cap: int) -> Versioned:
        """:func:`.blob.azure_get`, and the answer's ETag."""
        fs: BoundedAzureBlobFileSystem = self.fs
        data, headers = await ranged_or_whole(
            lambda byte_range: azure_get(fs, path, cap, byte_range), cap
        )
        return Versioned(data, version_token(headers.get("ETag"), path))

    async def delete_if_unchanged(self, path: str, token: str) -> None:
        """Delete the blob at ``path`` only while its ETag is ``token``.

        Raises:
            FileNotFoundError: the blob is gone (a 404, or a 412 over a blob that no longer
                exists).
            HttpResponseError: azure-core's, as it is: 412 for a blob that changed (see
                :func:`..versioned.precondition_failed`), any other refusal.
        """
        from azure.core import MatchConditions
        from azure.core.exceptions import HttpResponseError

        fs: BoundedAzureBlobFileSystem = self.fs
        container, blob, _ = fs.split_path(path)
        async with fs.service_client.get_blob_client(container, blob) as client:
            try:
                await client.delete_blob(etag=token, match_condition=MatchConditions.IfNotModified)
            except HttpResponseError as exc:
                # an absent blob fails If-Match too (412, as RFC 9110 has it; Azurite does):
                # gone is not changed
                if exc.status_code == 404 or (exc.status_code == 412 and not await client.exists()):
                    raise FileNotFoundError(path) from None
                raise
