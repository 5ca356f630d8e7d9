"""Azure Blob through adlfs, bounded like S3 and GCS: no SDK retries, capped bodies, no redirects.

adlfs builds its ``BlobServiceClient`` with the Azure SDK's defaults, which would make a
booting worker wait for minutes: azure-storage-blob retries three times with a 15 s, 18 s,
24 s backoff, and azure-core's aiohttp transport waits 20 s to connect and 60 s per read.
adlfs offers no option for either, so :class:`BoundedAzureBlobFileSystem` builds the client
itself (:meth:`~BoundedAzureBlobFileSystem.do_connect`, the same credential cases as adlfs)
with

* ``retry_total=0`` by default: plancache retries transient failures itself inside the
  deadline (:mod:`..deadline`), never a refused connection;
* :class:`CappedTransport`: azure-core's aiohttp transport, whose session is made with
  :func:`..caps.http.session_kwargs` (every body the SDK reads whole is capped, gzip is never
  inflated), whose connect and read timeouts come from the budget (adlfs's own
  ``connection_timeout`` and ``read_timeout`` options), and which refuses any 3xx answer
  before the SDK's redirect policy could follow it to another host;
* only adlfs's async credentials: its sync twins (``DefaultAzureCredential`` and service
  principal) are only used by adlfs's buffered files, which plancache never opens.

Plan objects are read by :func:`azure_read` (one ranged GET, declared length checked first,
body read to at most ``cap + 1`` bytes even if the range is ignored) and listed one page at a
time by :func:`azure_page`: adlfs's ``_cat_file`` joins the whole response body into memory,
and its ``_ls`` walks every page before returning.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, ClassVar

import aiohttp
from adlfs import AzureBlobFileSystem
from azure.core.exceptions import ResourceNotFoundError
from azure.core.pipeline.transport import AioHttpTransport
from azure.storage.blob import BlobProperties
from azure.storage.blob.aio import BlobPrefix, BlobServiceClient

from ...trust.errors import StoreError
from ..caps.http import read_declared, session_kwargs
from ..listing import MAX_PAGE_PREFIXES, PAGE_SIZE, Page, entry_info, prefixes_under


class CappedTransport(AioHttpTransport):
    """azure-core's aiohttp transport with plancache's session and a refusal of every redirect.

    Azure Blob answers API calls directly, never with a 3xx an SDK should follow; azure-core's
    redirect policy would follow one to any host (with the request's signed headers).
    """

    session: aiohttp.ClientSession | None
    """azure-core's, set in its constructor: declared here because mypy cannot infer it there."""

    async def open(self) -> None:
        if self.session is None and self._session_owner and not self._has_been_opened:
            self.session = aiohttp.ClientSession(
                trust_env=self._use_env_settings,
                cookie_jar=aiohttp.DummyCookieJar(),
                **session_kwargs(),
            )
        await super().open()

    async def send(self, request: Any, **config: Any) -> Any:
        """azure-core's send (its overloads take either request type), then a 3xx refused.

        Raises:
            StoreError: the answer is a redirect (any 3xx), never read nor followed (reason
                ``store-error``).
        """
        response = await super().send(request, **config)
        if 300 <= response.status_code < 400:
            target = str(response.headers.get("Location", ""))[:200]
            host = response.internal_response.url.host
            response.internal_response.close()  # never read: the connection goes
            raise StoreError(
                f"{host} answered {response.status_code} redirecting to {target!r}: not followed"
            )
        return response


class BoundedAzureBlobFileSystem(AzureBlobFileSystem):
    """adlfs's filesystem whose service client has plancache's transport and retries.

    Takes every adlfs option; ``connection_timeout`` and ``read_timeout`` (seconds) become the
    transport's, ``retry_total`` is the SDK's own retry count (0 unless set).
    """

    protocol: ClassVar[str | tuple[str, ...]]
    """adlfs's protocols, set by adlfs: declared here for the type checker only."""

    def __init__(self, *args: Any, retry_total: int = 0, **kwargs: Any) -> None:
        self._retry_total = int(retry_total)
        super().__init__(*args, **kwargs)

    def _client_options(self) -> dict[str, Any]:
        timeouts = {
            k: self._timeout_kwargs[k]
            for k in ("connection_timeout", "read_timeout")
            if k in self._timeout_kwargs
        }
        return {
            "transport": CappedTransport(**timeouts),
            "retry_total": self._retry_total,
            "retry_to_secondary": False,
            "user_agent": "plancache",
        }

    def do_connect(self) -> None:
        """The service client, by the same precedence as adlfs: connection string, then an
        account name with a credential or account key, a SAS token, or anonymous access.

        Raises:
            ValueError: neither a connection string nor an account name (adlfs's own kind of
                error here, which :mod:`..backends` turns into a ConfigError).
        """
        options = self._client_options()
        if self.connection_string is not None:
            self.service_client = BlobServiceClient.from_connection_string(
                self.connection_string, **options
            )
            return
        if self.account_name is None:
            raise ValueError(
                "an Azure store needs a connection string or an account name (account_name=...)"
            )
        host = getattr(self, "account_host", None) or f"{self.account_name}.blob.core.windows.net"
        self.account_url = f"https://{host}"
        credential = self.credential if self.credential is not None else self.account_key
        url = self.account_url
        if credential is None and self.sas_token is not None:
            url += self.sas_token if self.sas_token.startswith("?") else f"?{self.sas_token}"
        self.service_client = BlobServiceClient(
            account_url=url, credential=credential, _location_mode=self.location_mode, **options
        )

    def _get_default_azure_credential(self, **kwargs: Any) -> tuple[Any, None]:
        from azure.identity.aio import DefaultAzureCredential

        return DefaultAzureCredential(**kwargs), None

    def _get_credential_from_service_principal(self) -> tuple[Any, None]:
        from azure.identity.aio import ClientSecretCredential

        return ClientSecretCredential(
            tenant_id=self.tenant_id, client_id=self.client_id, client_secret=self.client_secret
        ), None


async def azure_get(
    fs: BoundedAzureBlobFileSystem, path: str, cap: int, byte_range: str | None
) -> tuple[bytes, Mapping[str, Any]]:
    """A download (of ``byte_range``, or whole) through the generated call, which hands back a
    stream (adlfs's ``cat_file`` would join the whole body): declared length checked before a
    byte of the body is read, body read at most to ``cap + 1``; with the answer's headers.

    Raises:
        FileNotFoundError: no such blob (or container).
    """
    container, blob, _ = fs.split_path(path)
    async with fs.service_client.get_blob_client(container, blob) as client:
        try:
            response = await client._client.blob.download(
                decompress=False,
                cls=lambda pipeline, body, headers: pipeline.http_response,
                **({"range": byte_range} if byte_range else {}),
            )
        except ResourceNotFoundError:
            raise FileNotFoundError(path) from None
        raw = response.internal_response
        try:
            data = await read_declared(
                raw.content.read, blob.rsplit("/", 1)[-1], cap, raw.content_length
            )
        finally:
            raw.close()
        return data, response.headers


async def azure_read(fs: BoundedAzureBlobFileSystem, path: str, cap: int) -> bytes:
    """One blob's bytes, from a download of ``bytes=0-cap`` (a 416 over an empty blob: see
    :meth:`..store.Store.read_capped`)."""
    return (await azure_get(fs, path, cap, f"bytes=0-{cap}"))[0]


def _md5_hash(item: BlobProperties) -> dict[str, str]:
    """The blob's Content-MD5 as GCS states it (base64), for :func:`..listing.md5_of`."""
    md5 = getattr(item.content_settings, "content_md5", None)
    return {"md5Hash": base64.b64encode(bytes(md5)).decode()} if md5 else {}


def _named_under(item: BlobProperties, prefix: str) -> bool:
    """Whether the blob's name, as the service sent it (typed ``str``, never assumed), is a
    string under ``prefix``."""
    name: object = item.name
    return isinstance(name, str) and name.startswith(prefix)


async def azure_page(fs: BoundedAzureBlobFileSystem, root: str, token: str | None) -> Page:
    """One page of the blobs directly under ``root`` (``delimiter='/'``), and of the sub-prefixes
    it names.

    Raises:
        FileNotFoundError: no such container.
    """
    container, key, _ = fs.split_path(root)
    prefix = f"{key.rstrip('/')}/" if key else ""
    async with fs.service_client.get_container_client(container) as client:
        pages = client.walk_blobs(
            name_starts_with=prefix or None, delimiter="/", results_per_page=PAGE_SIZE
        )
        pager = pages.by_page(continuation_token=token)
        entries = []
        below: list[str] = []
        try:
            async for page in pager:
                async for item in page:
                    if isinstance(item, BlobPrefix) and len(below) < MAX_PAGE_PREFIXES:
                        below.append(item.name)
                    elif isinstance(item, BlobProperties) and _named_under(item, prefix):
                        info = entry_info(item.name[len(prefix) :], item.size, _md5_hash(item))
                        if info is not None:
                            entries.append(info)
                break  # one page per call
        except ResourceNotFoundError:
            raise FileNotFoundError(root) from None
        following = pager.continuation_token  # type: ignore[attr-defined]  # typed as an AsyncIterator; azure-core's AsyncPageIterator holds it
    return Page(
        entries,
        following if isinstance(following, str) and following and following != token else None,
        prefixes_under(below, container, prefix),
    )
