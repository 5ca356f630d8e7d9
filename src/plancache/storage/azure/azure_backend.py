"""``az://`` (``abfs://``, ``abfss://``) as a :class:`~..backend.Backend`: adlfs's blob service
client, with no SDK retries and plancache's capped transport (:mod:`.blob`).

Reads are one capped ranged download (:func:`.blob.azure_read`), listings one page
(:func:`.blob.azure_page`), versions the download's ``ETag`` and deletes ``If-Match``
(:mod:`.azure_versions`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..fsspec_backends import FsspecBackend
from ..listing import Page
from ..versioned import Versioned
from . import azure_versions
from .blob import azure_page, azure_read


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

    async def read_versioned(self, path: str, cap: int) -> Versioned:
        return await azure_versions.read(self.fs, path, cap)

    async def delete_if_unchanged(self, path: str, token: str) -> None:
        await azure_versions.delete(self.fs, path, token)
