"""How a request reaches a registry: one aiohttp session, its challenge answered, failures named.

Split from :mod:`.registry_http` (what the requests are: manifests, blobs, tags, uploads) by
interface: everything here is about *sending*, the same for every request.

* credentials (:mod:`.credential_files`, looked up off the loop at the first ``401``) answer
  the registry's challenge (:mod:`.registry_auth`) and are never sent over plain HTTP to a host
  that is not loopback, nor used for a bearer token that would then go to such a host in clear
  (``plain_http=true`` off loopback, a plain-HTTP mirror): the token is the credentials'
  equal for its scope and life;
* a registry that speaks TLS where plain HTTP was spoken (Go's ``400 Client sent an HTTP
  request to an HTTPS server``: the loopback default meeting a TLS registry) is said to;
* a mirror's connection failure names the mirror and the file that configured it, and every
  mirror that answered is noted (:mod:`.mirrors.mirror_reads`) for the output to name.
"""

from __future__ import annotations

import asyncio
import ssl
import weakref
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import urlencode

import aiohttp

from ....clock import REAL_CLOCK, Clock
from ....trust.display import safe_text
from ....trust.errors import Reason, StoreError
from ...deadline import is_timeout, is_transient, one_line
from ..mirrors import mirror_reads
from ..registry_answers import RegistryAnswer, close_on_loop, tls_mistake
from ..registry_urls import Registry
from .credential_files import ANONYMOUS, Credentials
from .registry_auth import Challenge, Token, fetch_token, parse_challenge, scope_for


class RegistrySession:
    """How a request reaches one repository of one registry (or of a mirror): the HTTP session,
    the credentials and the challenge they answer, a mirror's failures named."""

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
        mirror_for: str = "",
        clock: Clock = REAL_CLOCK,
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
        self.mirror_for = mirror_for
        """For a mirror: the store it serves (the registry's ``HOST/REPOSITORY``), noted with
        each read for the output that names it."""
        self.clock = clock
        """What a token's expiry is read on (the store's clock: a test's fake one)."""
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
        if creds is not ANONYMOUS and not self._can_send_secrets():
            # a token bought with them is as good as them for its scope (push, delete) and
            # its life, and would go to this host in clear on every request
            raise StoreError(
                f"{self.registry.authority} is spoken to in plain HTTP: the credentials from "
                f"{safe_text(creds.source, 120)} are not sent, nor used for a token that would "
                "travel in clear"
            )
        token = self._tokens.get(scope)
        if token is None or token.expires <= self.clock.monotonic():
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
                and "Content-Type" not in response.headers
            ):
                await self._refuse_tls_spoken_to_in_http(response, f"{method} {path}")
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
        connection refused", naming neither). Retried as before: the error keeps its
        transience, and a timeout its reason."""
        try:
            response = await self.session().request(
                method, url, headers=headers, data=data, allow_redirects=False
            )
        except (aiohttp.ClientError, OSError) as exc:
            if self.mirror_of is None:
                tls_mistake(self.registry.authority, exc)  # raises the fix it names, if any
                raise
            mirror = (
                f"the mirror {self.registry.authority} (configured in "
                f"{safe_text(self.mirror_of, 160)})"
            )
            try:
                tls_mistake(self.registry.authority, exc)
            except StoreError as mistake:  # its scheme is its own configuration's, not plain_http
                fix = mistake.detail[len(self.registry.authority) :]
                if "WRONG_VERSION_NUMBER" in fix:
                    fix = (
                        " speaks plain HTTP, not TLS (WRONG_VERSION_NUMBER): name it "
                        f"http://{self.registry.authority} there"
                    )
                raise StoreError(mirror + fix) from exc
            raise StoreError(
                f"{mirror} failed: {one_line(exc)}",
                transient=is_transient(exc),
                reason=Reason.TIMEOUT if is_timeout(exc) else Reason.STORE_ERROR,
            ) from exc
        if self.mirror_of is not None:
            mirror_reads.note(self.registry.authority, self.mirror_of, self.mirror_for)
        return response

    async def _refuse_tls_spoken_to_in_http(
        self, response: aiohttp.ClientResponse, request: str
    ) -> None:
        """A ``400`` with no ``Content-Type`` whose body is Go's ``Client sent an HTTP request
        to an HTTPS server`` (distribution, zot, Harbor: net/http's raw answer, which no
        registry error has): the registry speaks TLS where plancache spoke plain HTTP (the
        loopback default), said as such rather than as "the registry answered 400".

        Raises:
            StoreError: it is that answer.
            RegistryAnswer: another such 400 (its body read: at most 256 bytes).
        """
        async with response:
            head = await response.content.read(256)
        if b"HTTP request to an HTTPS server" not in head:
            raise RegistryAnswer(
                400, response.headers, f"{safe_text(request, 120)}: the registry answered 400"
            )
        raise StoreError(
            f"{self.registry.authority} speaks TLS, not plain HTTP: give its CA with "
            "--storage-option ca_file=PATH (or plain_http=false if a system CA signs it)"
        )
