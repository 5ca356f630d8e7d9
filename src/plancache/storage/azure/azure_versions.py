"""One blob read with its version, deleted only while it is still that version: Azure Blob's
download ``ETag``, and ``Delete Blob`` with ``If-Match`` (what they share: :mod:`..versioned`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..versioned import Versioned, ranged_or_whole, version_token

if TYPE_CHECKING:
    from .blob import BoundedAzureBlobFileSystem


async def read(fs: BoundedAzureBlobFileSystem, path: str, cap: int) -> Versioned:
    """:func:`.blob.azure_get`, and the answer's ETag."""
    from .blob import azure_get

    data, headers = await ranged_or_whole(
        lambda byte_range: azure_get(fs, path, cap, byte_range), cap
    )
    return Versioned(data, version_token(headers.get("ETag"), path))


async def delete(fs: BoundedAzureBlobFileSystem, path: str, token: str) -> None:
    """Delete the blob at ``path`` only while its ETag is ``token``.

    Raises:
        FileNotFoundError: the blob is gone (a 404, or a 412 over a blob that no longer exists).
        HttpResponseError: azure-core's, as it is: 412 for a blob that changed (see
            :func:`..versioned.precondition_failed`), any other refusal.
    """
    from azure.core import MatchConditions
    from azure.core.exceptions import HttpResponseError

    container, blob, _ = fs.split_path(path)
    async with fs.service_client.get_blob_client(container, blob) as client:
        try:
            await client.delete_blob(etag=token, match_condition=MatchConditions.IfNotModified)
        except HttpResponseError as exc:
            # an absent blob fails If-Match too (412, as RFC 9110 has it; Azurite does): gone is
            # not changed
            if exc.status_code == 404 or (exc.status_code == 412 and not await client.exists()):
                raise FileNotFoundError(path) from None
            raise
