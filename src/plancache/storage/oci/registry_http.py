"""One registry repository over HTTP: capped, digest-checked reads, uploads and deletes.

Plain aiohttp (the stack's HTTP client, on the store's event loop and deadline) rather than an
OCI client library: oras-py 0.2.43 does not check blob digests on pull, reads non-chunked
uploads whole, mistakes a ``Basic`` challenge for a token URL (two minutes of backoff), has no
``artifactType``, referrers or tag-schema support, and is synchronous (``requests``), which
the deadlines here would have to wrap in threads. The registry API plancache needs is seven
requests; each is checked here:

* every body is read capped (its declared length first, then at most ``cap + 1`` bytes, so an
  endless body costs the cap), never inflated (``Accept-Encoding: identity``);
* a manifest is checked against the digest it was asked by, and against the registry's
  ``Docker-Content-Digest`` when read by tag, and must be the media type asked for; a blob must
  be exactly the size its descriptor states and hash to its digest (``digest-mismatch``);
* no redirect is followed, except a blob download's (registries hand out signed storage URLs),
  which is followed at most three times to an ``https`` URL (or loopback) *without* the
  registry's credentials;
* credentials (:mod:`.credential_files`) answer the registry's challenge (:mod:`.registry_auth`)
  and are never sent over plain HTTP to a host that is not loopback.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import urlencode, urljoin, urlsplit

import aiohttp

from ...trust.display import safe_text
from ...trust.errors import Reason, Rejected, StoreError
from ..deadline import is_transient, one_line
from .credential_files import ANONYMOUS, Credentials
from .mirrors import mirror_reads
from .registry_answers import (
    MAX_MANIFEST,
    RegistryAnswer,
    TAGS_CAP,
    close_on_loop,
    expect,
    media_type_of,
    read_capped,
    sha256_digest,
)
from .registry_auth import Challenge, Token, fetch_token, parse_challenge, scope_for
from .registry_urls import DIGEST, Registry, check_authority

MAX_REDIRECTS = 3
REDIRECTS = (301, 302, 303, 307, 308)


class RegistryClient:
    """Requests to one repository of one registry (and, for reads, its mirror)."""

    def __init__(
        self,
        registry: Registry,
        repository: str,
        *,
        plain_http: bool,
        plain_http_allowed: bool,
        ssl_context: ssl.SSLContext | None,
        credentials: Callable[[str], Awaitable[Credentials]],
        timeouts: tuple[float, float],
        namespace: str | None = None,
        token_realms: frozenset[str] = frozenset(),
        mirror_of: str | None = None,
    ) -> None:
        self.registry = registry
        self.repository = repository
        self.base = f"{'http' if plain_http else 'https'}://{registry.authority}"
        self.namespace = namespace
        """For a mirror: the registry it stands in for, sent as ``?ns=`` (containerd's query, by
        which a mirror serving several registries knows which one is asked)."""
        self.plain_http = plain_http
        self.plain_http_allowed = plain_http_allowed
        self.token_realms = token_realms
        """Hosts besides the registry's own whose token realm may be sent its credentials."""
        self.mirror_of = mirror_of
        """For a mirror: the file (or storage option) that configured it, named when it fails."""
        self._ssl = ssl_context
        self._credentials_for = credentials
        self._credentials: Credentials | None = None
        self._challenge: Challenge | None = None
        self._tokens: dict[str, Token] = {}
        self._timeouts = timeouts
        self._session: aiohttp.ClientSession | None = None

    # -- plumbing ------------------------------------------------------------------------------
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connect, read = self._timeouts
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read),
                auto_decompress=False,
                headers={"Accept-Encoding": "identity", "User-Agent": "plancache"},
                cookie_jar=aiohttp.DummyCookieJar(),
                connector=aiohttp.TCPConnector(limit=64, ssl=self._ssl if self._ssl else True),
            )
            weakref.finalize(self, close_on_loop, asyncio.get_running_loop(), self._session)
        return self._session

    async def credentials(self) -> Credentials:
        """This host's credentials, looked up (off the loop) at the first challenge."""
        if self._credentials is None:
            self._credentials = await self._credentials_for(self.registry.authority)
        return self._credentials

    def _can_send_secrets(self) -> bool:
        return not self.plain_http or self.registry.loopback

    async def _authorization(self, scope: str) -> str | None:
        challenge = self._challenge
        if challenge is None:
            return None
        creds = await self.credentials()
        if challenge.scheme == "basic":
            if creds is ANONYMOUS or not creds.username:
                raise StoreError(
                    f"{self.registry.authority} asks for a login and no credentials were found "
                    "for it (docker config.json, $REGISTRY_AUTH_FILE, a credential helper)"
                )
            if not self._can_send_secrets():
                raise StoreError(
                    f"{self.registry.authority} asks for a password over plain HTTP: not sent"
                )
            return creds.basic
        token = self._tokens.get(scope)
        if token is None or token.expires <= time.monotonic():
            token = await fetch_token(self, challenge, scope, creds)
            self._tokens[scope] = token
        return f"Bearer {token.value}"

    async def send(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
        write: bool = False,
        delete: bool = False,
    ) -> aiohttp.ClientResponse:
        """The response (body unread) of one request to the registry, a 401 answered once.

        Raises:
            StoreError: a second 401, naming the credentials' source, never them.
        """
        scope = scope_for(self.repository, write, delete)
        url = path if path.startswith(self.base + "/") else self.base + path
        if self.namespace is not None:
            url += ("&" if "?" in url else "?") + urlencode({"ns": self.namespace})
        for attempt in range(2):
            sent = dict(headers or {})
            auth = await self._authorization(scope)
            if auth is not None:
                sent["Authorization"] = auth
            response = await self._request(method, url, sent, data)
            if (
                response.status == 400
                and self.plain_http
                and not media_type_of(response.headers).endswith("json")
            ):
                await self._refuse_tls_spoken_to_in_http(response)
            if response.status != 401:
                return response
            challenge = parse_challenge(response.headers.get("WWW-Authenticate"))
            response.release()
            if challenge is None or attempt:
                break
            self._challenge = challenge
            self._tokens.pop(scope, None)
        creds = self._credentials or ANONYMOUS
        raise StoreError(
            f"{self.registry.authority} refused the credentials "
            f"({'anonymous' if creds is ANONYMOUS else 'from ' + safe_text(creds.source, 120)})"
        )

    async def _request(
        self, method: str, url: str, headers: Mapping[str, str], data: bytes | None
    ) -> aiohttp.ClientResponse:
        """One request; a mirror's connection failure names the mirror and the file that
        configured it (a dead in-cluster mirror is otherwise "cannot list oci://registry/…:
        connection refused", naming neither). Retried as before: the error keeps transience."""
        try:
            response = await self.session().request(
                method, url, headers=headers, data=data, allow_redirects=False
            )
        except (aiohttp.ClientError, OSError) as exc:
            if self.mirror_of is None:
                raise
            raise StoreError(
                f"the mirror {self.registry.authority} (configured in "
                f"{safe_text(self.mirror_of, 160)}) failed: {one_line(exc)}",
                transient=is_transient(exc),
            ) from exc
        if self.mirror_of is not None:
            mirror_reads.note(self.registry.authority, self.mirror_of)
        return response

    async def _refuse_tls_spoken_to_in_http(self, response: aiohttp.ClientResponse) -> None:
        """A ``400`` whose body is Go's ``Client sent an HTTP request to an HTTPS server``
        (distribution, zot, Harbor): the registry speaks TLS where plancache spoke plain HTTP
        (the loopback default), said as such rather than as "the registry answered 400".

        Raises:
            StoreError: it is that answer.
            RegistryAnswer: another 400 that is not a registry's JSON error.
        """
        async with response:
            head = await response.content.read(256)
        if b"HTTP request to an HTTPS server" not in head:
            raise RegistryAnswer(400, response.headers, "the registry answered 400")
        raise StoreError(
            f"{self.registry.authority} speaks TLS, not plain HTTP: give its CA with "
            "--storage-option ca_file=PATH (or plain_http=false if a system CA signs it)"
        )

    # -- reads ---------------------------------------------------------------------------------
    async def manifest(
        self, reference: str, media_types: tuple[str, ...]
    ) -> tuple[bytes, str] | None:
        """(bytes, digest) of the manifest at a tag or digest, checked; None if absent.

        Raises:
            Rejected: another media type than asked (reason ``malformed``), or bytes that are
                not the digest asked for or stated (``digest-mismatch``).
            StoreError: access denied (401, 403).
            RegistryAnswer: another status than wanted (retried by the shared rules).
        """
        path = f"/v2/{self.repository}/manifests/{reference}"
        response = await self.send("GET", path, headers={"Accept": ", ".join(media_types)})
        async with response:
            if response.status == 404:
                return None
            await expect(response, (200,), f"manifest {reference}")
            got_type = media_type_of(response.headers)
            if got_type not in media_types:
                raise Rejected(
                    Reason.MALFORMED,
                    f"{reference} in {self.repository} is a {safe_text(got_type, 80)!r}, "
                    f"not a {media_types[0]}",
                )
            body = await read_capped(response, MAX_MANIFEST, f"manifest {reference}")
            stated = response.headers.get("Docker-Content-Digest")
        digest = sha256_digest(body)
        expected = reference if reference.startswith("sha256:") else stated
        if expected is not None and expected != digest:
            raise Rejected(
                Reason.DIGEST_MISMATCH,
                f"the registry answered manifest {safe_text(reference, 80)} with other bytes "
                f"({digest[:19]}…, not {safe_text(expected, 24)}…)",
            )
        return body, digest

    async def resolve(self, tag: str, media_types: tuple[str, ...]) -> str | None:
        """The digest a tag names (a ``HEAD``: no body; the bytes are checked when read by it):
        None if absent, ``""`` if the registry does not say (the caller then reads the tag)."""
        path = f"/v2/{self.repository}/manifests/{tag}"
        response = await self.send("HEAD", path, headers={"Accept": ", ".join(media_types)})
        async with response:
            if response.status == 404:
                return None
            await expect(response, (200,), f"manifest {tag}")
            stated = response.headers.get("Docker-Content-Digest", "")
        return stated if DIGEST.fullmatch(stated) else ""

    async def blob(self, digest: str, size: int, cap: int) -> bytes:
        """A blob's bytes, exactly ``size`` of them hashing to ``digest``.

        Raises:
            FileNotFoundError: no such blob.
            Rejected: ``size`` over ``cap``, before a byte is read (reason ``too-large``), or
                other bytes than stated (``digest-mismatch``).
            StoreError: a redirect that is not followed, or access denied (401, 403).
            RegistryAnswer: another status than wanted.
        """
        if size > cap:
            raise Rejected(
                Reason.TOO_LARGE, f"blob {digest[:19]}… is {size} bytes, the cap is {cap}"
            )
        response = await self.send("GET", f"/v2/{self.repository}/blobs/{digest}")
        hops = 0
        while response.status in REDIRECTS and hops < MAX_REDIRECTS:
            target = urljoin(str(response.url), response.headers.get("Location", ""))
            response.release()
            response = await self._follow(target)
            hops += 1
        async with response:
            if response.status == 404:
                raise FileNotFoundError(digest)
            await expect(response, (200,), f"blob {digest[:19]}…")
            body = await read_capped(response, size, f"blob {digest[:19]}…")
        if len(body) != size or sha256_digest(body) != digest:
            raise Rejected(
                Reason.DIGEST_MISMATCH,
                f"the registry answered blob {digest[:19]}… with other bytes "
                f"({len(body)} bytes, {size} stated)",
            )
        return body

    async def _follow(self, target: str) -> aiohttp.ClientResponse:
        """A redirected blob download: a fresh request carrying no credentials, to https or
        loopback only (a signed storage URL carries its own authorisation)."""
        parts = urlsplit(target)
        if parts.scheme not in ("http", "https") or not parts.netloc or "@" in parts.netloc:
            raise StoreError(
                f"a blob download redirected to {safe_text(target, 80)!r}: not followed"
            )
        host = check_authority(parts.netloc, "blob redirect")
        if parts.scheme == "http" and not (host.loopback or self.plain_http_allowed):
            raise StoreError(
                f"a blob download redirected to plain HTTP at {host.authority}: not followed"
            )
        return await self.session().request("GET", target, allow_redirects=False)

    async def tags_page(self, last: str | None, n: int) -> tuple[bytes, bool]:
        """One ``tags/list`` page (capped) and whether the registry says more follow."""
        query = f"?n={n}" + (f"&last={last}" if last else "")
        response = await self.send("GET", f"/v2/{self.repository}/tags/list{query}")
        async with response:
            if response.status == 404:
                return b'{"tags": []}', False
            await expect(response, (200,), "the tag list")
            body = await read_capped(response, TAGS_CAP, "the tag list")
            return body, 'rel="next"' in response.headers.get("Link", "")

    # -- writes --------------------------------------------------------------------------------
    async def has_blob(self, digest: str) -> bool:
        response = await self.send("HEAD", f"/v2/{self.repository}/blobs/{digest}", write=True)
        async with response:
            if response.status == 404:
                return False
            await expect(response, (200,), f"blob {digest[:19]}…")
            return True

    async def put_blob(self, data: bytes) -> str:
        """Upload ``data`` (unless the repository has it); returns its digest.

        Raises:
            StoreError: the registry sends the upload to another host (refused), or access
                denied (401, 403).
            RegistryAnswer: another status than wanted.
        """
        digest = sha256_digest(data)
        if await self.has_blob(digest):
            return digest
        response = await self.send("POST", f"/v2/{self.repository}/blobs/uploads/", write=True)
        async with response:
            await expect(response, (202,), "a blob upload")
            location = urljoin(self.base + "/", response.headers.get("Location", ""))
        if not location.startswith(self.base + "/"):
            raise StoreError(f"{self.registry.authority} sent the upload to another host: refused")
        location += ("&" if "?" in location else "?") + f"digest={digest}"
        response = await self.send(
            "PUT",
            location,
            headers={"Content-Type": "application/octet-stream"},
            data=data,
            write=True,
        )
        async with response:
            await expect(response, (201,), "a blob upload")
        return digest

    async def put_manifest(self, reference: str, body: bytes, media_type: str) -> Mapping[str, str]:
        """PUT a manifest or index at a tag or digest; the answer's headers (``OCI-Subject``)."""
        response = await self.send(
            "PUT",
            f"/v2/{self.repository}/manifests/{reference}",
            headers={"Content-Type": media_type},
            data=body,
            write=True,
        )
        async with response:
            await expect(response, (201, 200), f"manifest {reference}")
            return response.headers

    async def delete_manifest(self, digest: str) -> None:
        """Delete a manifest by digest (distribution untags every tag on it too).

        Raises:
            FileNotFoundError: no such manifest.
            StoreError: access denied (401, 403).
            RegistryAnswer: another status than wanted.
        """
        response = await self.send(
            "DELETE", f"/v2/{self.repository}/manifests/{digest}", write=True, delete=True
        )
        async with response:
            if response.status == 404:
                raise FileNotFoundError(digest)
            await expect(response, (202, 200), f"the delete of {digest[:19]}…")
