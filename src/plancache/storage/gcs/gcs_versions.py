"""One object read with its version, deleted only while it is still that version: GCS's
``generation`` from the object's metadata, the bytes read pinned to it, and ``DELETE`` with
``ifGenerationMatch`` (what they share: :mod:`..versioned`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...trust.errors import StoreError
from ..caps.http import body_cap
from ..versioned import Versioned, ranged_or_whole, version_token

if TYPE_CHECKING:
    from .pages import GCSFilesystem


async def read(fs: GCSFilesystem, path: str, cap: int) -> Versioned:
    """The generation from the object's metadata, then the bytes of that generation: one the
    store replaced in between is absent (404) rather than read as the new bytes.

    Raises:
        StoreError: the metadata states no usable generation, or one that is not a number
            (reason ``store-error``): nothing is deleted unconditionally.
    """
    bucket, key, _ = fs.split_path(path)
    meta = await fs._call(
        "GET", "b/{}/o/{}", bucket, key, json_out=True
    )  # body capped by ..caps.http
    token = version_token(meta.get("generation") if isinstance(meta, dict) else None, path)
    if not token.isdigit():
        raise StoreError(f"{path}: the store states a generation that is not a number")
    url = fs.url(path, generation=token)

    async def get(byte_range: str | None) -> bytes:
        with body_cap(cap + 1):
            _, data = await fs._call(
                "GET", url, headers={"Range": byte_range} if byte_range else {}
            )
        return bytes(data)

    return Versioned(await ranged_or_whole(get, cap), token)


async def delete(fs: GCSFilesystem, path: str, token: str) -> None:
    """Delete the object at ``path`` only while its generation is ``token`` (gcsfs raises
    FileExistsError otherwise: :func:`..versioned.precondition_failed`)."""
    bucket, key, _ = fs.split_path(path)
    await fs._call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=token)
