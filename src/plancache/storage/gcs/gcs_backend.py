"""``gs://`` as a :class:`~..backend.Backend`: gcsfs's JSON API calls, made by plancache.

gcsfs's filesystem discovers credentials in its constructor (a metadata server that never
answers), so it is made at :meth:`GCSBackend.open`, which the store runs in a daemon thread
within its budget, and its first token is fetched there too. Then:

* a read is gcsfs's ``cat_file`` of ``cap + 1`` bytes, its whole-body reads capped
  (:func:`..caps.http.body_cap`);
* a listing page is one JSON API call, never gcsfs's ``_ls``, which walks every page of a
  listing into one list before returning; the page's body is capped by :mod:`..caps.http`;
* a version is the ``generation`` in the object's metadata, the bytes then read pinned to it (a
  generation replaced in between reads as absent, never as the new bytes), and a delete is
  conditional on it (``ifGenerationMatch``; what the backends share: :mod:`..versioned`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ...trust.errors import StoreError
from ..caps.http import body_cap
from ..deadline import store_error
from ..fsspec_backends import FsspecBackend
from ..listing import (
    PAGE_SIZE,
    FolderPage,
    Page,
    entries_under,
    folder_listing,
    prefixes_under,
)
from ..versioned import Versioned, ranged_or_whole, version_token


class GCSFilesystem(Protocol):
    """What plancache calls on gcsfs's ``GCSFileSystem`` (gcsfs ships no types): its JSON API
    call, whose answer is the parsed JSON (``json_out``) or the headers and body."""

    def split_path(self, path: str) -> tuple[str, str, str | None]: ...

    def url(self, path: str, generation: str | None = None) -> str: ...

    async def _call(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any: ...


class GCSBackend(FsspecBackend):
    """One bucket's gcsfs filesystem, made by ``opener`` at :meth:`open`; ``url`` names the
    store in the errors of that opening."""

    preconditions = True
    paged = True

    def __init__(self, opener: Callable[[], Any], *, url: str) -> None:
        super().__init__("gcs", opener=opener, asynchronous=True)
        self._url = url

    def open(self) -> None:
        """Make the filesystem, then fetch its first token here (gcsfs would otherwise fetch it
        synchronously on the event loop, past every deadline).

        Raises:
            PlanCacheError: the credentials could not be had (typed: ``StoreError``,
                ``StoreTimeout``), or the opener's ``ConfigError``.
        """
        if self._fs is not None:
            return
        assert self._opener is not None
        fs = self._opener()
        credentials = getattr(fs, "credentials", None)
        if credentials is not None and hasattr(credentials, "maybe_refresh"):
            try:
                credentials.maybe_refresh()
            except Exception as exc:
                raise store_error(f"cannot get credentials for {self._url}", exc) from None
        self._fs = fs

    async def list_page(self, under: str, token: str | None) -> Page:
        """One page of GCS's object listing directly under ``under`` (``delimiter='/'``), and
        of the sub-prefixes it names."""
        fs: GCSFilesystem = self.fs
        bucket, key, _ = fs.split_path(under)
        prefix = f"{key.rstrip('/')}/" if key else ""
        answer = await _listing(fs, bucket, prefix, token)
        entries = entries_under(answer.get("items"), prefix, "name", "size")
        following = answer.get("nextPageToken")
        return Page(
            entries,
            following if isinstance(following, str) and following != token else None,
            prefixes_under(answer.get("prefixes"), bucket, prefix),
        )

    async def list_dir(self, path: str) -> list[tuple[str, bool]]:
        """JSON API listing pages under ``path``, capped (:func:`..listing.folder_listing`),
        never gcsfs's ``ls``, which gathers every page before returning."""
        fs: GCSFilesystem = self.fs
        bucket, key, _ = fs.split_path(path)
        prefix = f"{key.rstrip('/')}/" if key else ""

        async def page(token: str | None) -> FolderPage:
            answer = await _listing(fs, bucket, prefix, token)
            items = answer.get("items")
            files = (
                [i.get("name") for i in items if isinstance(i, dict)]
                if isinstance(items, list)
                else []
            )
            dirs = answer.get("prefixes")
            following = answer.get("nextPageToken")
            return (
                files,
                dirs if isinstance(dirs, list) else [],
                following if isinstance(following, str) else None,
            )

        return await folder_listing(page, bucket, prefix, path)

    async def read_versioned(self, path: str, cap: int) -> Versioned:
        """The generation from the object's metadata, then the bytes of that generation: one
        the store replaced in between is absent (404) rather than read as the new bytes.

        Raises:
            StoreError: the metadata states no usable generation, or one that is not a number
                (reason ``store-error``): nothing is deleted unconditionally.
        """
        fs: GCSFilesystem = self.fs
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

    async def delete_if_unchanged(self, path: str, token: str) -> None:
        """Delete the object at ``path`` only while its generation is ``token`` (gcsfs raises
        FileExistsError otherwise: :func:`..versioned.precondition_failed`)."""
        fs: GCSFilesystem = self.fs
        bucket, key, _ = fs.split_path(path)
        await fs._call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=token)


async def _listing(
    fs: GCSFilesystem, bucket: str, prefix: str, token: str | None
) -> dict[str, Any]:
    """One JSON API listing answer directly under ``prefix`` (``delimiter='/'``), from
    ``token`` ({} for an answer that is no object): the request the store's listing pages and a
    folder's listing share."""
    resp = await fs._call(
        "GET",
        "b/{}/o",
        bucket,
        json_out=True,
        prefix=prefix or None,
        delimiter="/",
        maxResults=PAGE_SIZE,
        pageToken=token,
    )
    return resp if isinstance(resp, dict) else {}
