"""What a store is to plancache: the few calls :class:`~.store.Store` makes on one backend.

In the spirit of python-tuf's ``FetcherInterface``: a backend moves bytes and nothing else, and
what keeps a hostile or dead store bounded is enforced once, above every backend, by
:class:`~.store.Store`:

* the deadline of each operation (:func:`.deadline.run_by`), its retries while a failure is
  transient (:func:`.deadline.with_retries`), and every failure typed
  (:func:`.deadline.store_error`);
* the size cap of each object: a backend reads at most ``cap + 1`` bytes of it (its SDK's
  whole-body reads capped too, :mod:`.caps.http`) and the store rejects more than ``cap``;
* a listing's size: a backend answers one page, the store counts names and pages
  (:data:`.listing.MAX_NAMES`, :data:`.listing.MAX_PAGES`);
* how many calls are in flight (:attr:`Backend.concurrency`), and where they run: each
  backend's coroutines run on its event loop (:attr:`Backend.loop`), a blocking SDK's calls in
  daemon threads (:mod:`.threads`).

A backend is chosen once, by the URL's scheme, when the store is opened (:func:`.store.open_store`);
after that the store calls its methods and never asks which backend it holds. One class per
scheme: :class:`.local.local_backend.LocalBackend` (``file://``),
:class:`.fsspec_backends.MemoryBackend` (``memory://``), :class:`.s3.s3_backend.S3Backend`,
:class:`.gcs.gcs_backend.GCSBackend`, :class:`.azure.azure_backend.AzureBackend`,
:class:`.oci.registry.RegistryBackend` (an OCI registry, reached without fsspec) and
:class:`.fsspec_backends.FsspecBackend` (any other fsspec filesystem, async, or blocking in
daemon threads).

Paths: a backend is handed its own paths (``bucket/prefix/startup_plan_<fp>.json``); the store
maps object names under its prefix to them (:meth:`.store.Store.path`). Errors: a backend raises
whatever its SDK raised (``FileNotFoundError`` for an absent object where a method says so); the
store types them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .listing import Page
from .versioned import Versioned

if TYPE_CHECKING:  # asyncio: never imported by a boot's blocking read
    import asyncio

    from .s3.direct import S3Direct


class Backend(Protocol):
    """One store's bytes: read capped, list a page, read a version and delete only if
    unchanged, write, delete."""

    @property
    def scheme(self) -> str:
        """The URL scheme the backend serves (``s3``, ``gcs``, ``azure``, ``oci``, ``file``,
        ``memory``, or the fsspec protocol): for messages, never to choose a code path."""
        ...

    @property
    def concurrency(self) -> int:
        """Calls in flight per operation, at most."""
        ...

    @property
    def preconditions(self) -> bool:
        """Whether the store itself refuses a delete whose version changed
        (:meth:`delete_if_unchanged`: S3's and Azure's ``If-Match``, GCS's generation, a
        registry's manifest digest). False: :meth:`read_versioned` and
        :meth:`delete_if_unchanged` are not offered, and an object is deleted after a re-read
        (:mod:`.conditional_deletes`, which also checks on a canary that a store with
        preconditions keeps them)."""
        ...

    @property
    def paged(self) -> bool:
        """Whether :meth:`list_page` lists any prefix one request at a time and names the
        sub-prefixes below it (S3, GCS, Azure); False: one page is the whole listing of the
        store's own prefix, and :meth:`list_dir` walks below it
        (:func:`.checks.deeper_prefixes`)."""
        ...

    @property
    def subject(self) -> str | None:
        """The image every object is attached to (a registry store's ``subject``), else None."""
        ...

    @property
    def opened(self) -> bool:
        """Whether :meth:`open` has run (or the backend needed no opening)."""
        ...

    def open(self) -> None:
        """Make the SDK's client. It may block (GCS discovers credentials in its constructor),
        so the store runs it once, in a daemon thread, waited for within its budget; the store
        calls nothing else before it (S3's boot path aside: :attr:`direct`)."""
        ...

    @property
    def direct(self) -> S3Direct | None:
        """Reads of a few objects before :meth:`open` (``s3://``: plain botocore, no s3fs
        import, :mod:`.s3.direct`), else None."""
        ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the backend's coroutines run on (after :meth:`open`)."""
        ...

    async def read(self, path: str, cap: int) -> bytes | None:
        """The object's bytes, at most ``cap + 1`` of them (the store rejects more than
        ``cap``); None if absent."""
        ...

    async def list_page(self, under: str, token: str | None) -> Page:
        """One page of the objects directly under ``under`` (a path of the backend: the store's
        prefix, or, on a :attr:`paged` backend, one below it), from ``token`` (None: the first).

        Raises:
            FileNotFoundError: the prefix, its bucket or directory is absent (the store lists
                nothing then).
        """
        ...

    async def list_dir(self, path: str) -> list[tuple[str, bool]]:
        """(path, is a directory) of each entry directly under ``path``, whole (a directory
        walk's, or a compile-cache folder's: a few entries).

        Raises:
            FileNotFoundError: ``path`` is absent.
        """
        ...

    async def info(self, path: str) -> Mapping[str, Any]:
        """What the backend states about ``path`` (fsspec's fields: ``type`` is ``file`` or
        ``directory``).

        Raises:
            FileNotFoundError: ``path`` is absent.
            PermissionError: the store will not say.
        """
        ...

    async def read_versioned(self, path: str, cap: int) -> Versioned:
        """The object's bytes (at most ``cap + 1``) and the version they are, stated by the
        answer that carried them (:mod:`.versioned`).

        Raises:
            FileNotFoundError: the object is absent.
        """
        ...

    async def delete_if_unchanged(self, path: str, token: str) -> None:
        """Delete the object only while it is version ``token``.

        Raises:
            FileNotFoundError: the object is gone.
            Exception: the SDK's refusal; :func:`.versioned.precondition_failed` says the object
                changed.
        """
        ...

    async def write(self, path: str, data: bytes) -> None:
        """Put ``data`` at ``path`` whole (a reader sees the old bytes or the new ones)."""
        ...

    async def delete(self, path: str) -> None:
        """Delete the object; one already absent is not an error."""
        ...

    def served_from(self) -> list[tuple[str, str]]:
        """(host, where it was configured) of each mirror that served this store's reads in
        this process; none for a store read from its URL only (the output's ``via_mirror``)."""
        ...
