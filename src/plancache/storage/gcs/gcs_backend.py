"""``gs://`` as a :class:`~..backend.Backend`: gcsfs's JSON API calls, made by plancache.

gcsfs's filesystem discovers credentials in its constructor (a metadata server that never
answers), so it is made at :meth:`GCSBackend.open`, which the store runs in a daemon thread
within its budget, and its first token is fetched there too. Reads are gcsfs's ``cat_file`` of
``cap + 1`` bytes with its whole-body reads capped; listings one JSON API page
(:func:`.pages.gcs_page`); versions the object's ``generation`` and deletes
``ifGenerationMatch`` (:mod:`.gcs_versions`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..deadline import store_error
from ..fsspec_backends import FsspecBackend
from ..listing import Page
from ..versioned import Versioned
from . import gcs_versions
from .pages import gcs_page


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
        return await gcs_page(self.fs, under, token)

    async def read_versioned(self, path: str, cap: int) -> Versioned:
        return await gcs_versions.read(self.fs, path, cap)

    async def delete_if_unchanged(self, path: str, token: str) -> None:
        await gcs_versions.delete(self.fs, path, token)
