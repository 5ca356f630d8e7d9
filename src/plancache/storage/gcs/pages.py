"""One page of a GCS listing through gcsfs's JSON API call, never gcsfs's ``_ls``, which walks
every page of a listing into one list before returning; the page's body is capped by
:mod:`..caps.http`."""

from __future__ import annotations

from typing import Any, Protocol

from ..listing import PAGE_SIZE, Page, entries_under, prefixes_under


class GCSFilesystem(Protocol):
    """What plancache calls on gcsfs's ``GCSFileSystem`` (gcsfs ships no types): its JSON API
    call, whose answer is the parsed JSON (``json_out``) or the headers and body."""

    def split_path(self, path: str) -> tuple[str, str, str | None]: ...

    def url(self, path: str, generation: str | None = None) -> str: ...

    async def _call(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any: ...


async def gcs_page(fs: GCSFilesystem, root: str, token: str | None) -> Page:
    """One page of GCS's object listing directly under ``root`` (``delimiter='/'``), and of the
    sub-prefixes it names."""
    bucket, key, _ = fs.split_path(root)
    prefix = f"{key.rstrip('/')}/" if key else ""
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
    answer = resp if isinstance(resp, dict) else {}
    entries = entries_under(answer.get("items"), prefix, "name", "size")
    following = answer.get("nextPageToken")
    return Page(
        entries,
        following if isinstance(following, str) and following != token else None,
        prefixes_under(answer.get("prefixes"), bucket, prefix),
    )
