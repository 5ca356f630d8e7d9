"""How a request reaches a registry: one aiohttp session, its ``401`` answered, failures named.

Split from :mod:`..registry_http` (what the requests are: manifests, blobs, tags, uploads) by
interface: everything here is about *sending*, the same for every request.

* credentials (:mod:`.credential_files`, looked up off the loop at the first ``401``) answer
  the registry's challenge (below) and are never sent over plain HTTP to a host that is not
  loopback, nor used for a bearer token that would then go to such a host in clear
  (``plain_http=true`` off loopback, a plain-HTTP mirror): the token is the credentials'
  equal for its scope and life;
* a registry that speaks TLS where plain HTTP was spoken (Go's ``400 Client sent an HTTP
  request to an HTTPS server``: the loopback default meeting a TLS registry) is said to;
* a mirror's connection failure names the mirror and the file that configured it, and every
  mirror that answered is noted (:mod:`..mirrors.mirror_reads`) for the output to name.

The ``401``: the ``WWW-Authenticate`` challenge, basic or bearer token.

A registry says what it wants on the first request it refuses (distribution's auth spec):

* ``Basic realm="…"``: the username and password, base64, in every request (over TLS, or to
  a loopback registry: never over plain HTTP to another host);
* ``Bearer realm="https://auth…",service="…",scope="…"``: a token from the realm, asked for
  with the credentials (basic), with an identity token (OAuth2 ``refresh_token`` grant), or
  anonymously; the token then goes in ``Authorization: Bearer`` until it expires.

What the registry sends here is hostile too: the challenge is parsed by a strict grammar,
the realm must be ``https`` (or loopback, or plain HTTP allowed by the operator), and the
token answer is read capped and taken only if it is a short printable token. Secrets never
appear in an error: messages name the realm's host and the credentials' source, not values.

Where a secret (basic credentials, an identity token) may go: to a realm over TLS or on
loopback (a plain-HTTP realm elsewhere never gets one, whatever ``plain_http`` says), on the
registry's own host or on a host the operator lists in ``token_realms``. Docker sends them to
any ``https`` realm the registry names, so a hostile or compromised registry collects the
node's credentials for *another* registry's token service (or any host); podman
(containers/image) does the same, containerd only refuses a plain-HTTP realm. plancache takes
the stricter rule because the credentials a node holds are usually its push credentials, the
registries it serves plans from (ACR, GAR, Harbor, Quay, GHCR, ECR) keep the token service on
their own host, and the others (GitLab's ``gitlab.com/jwt/auth``, Docker Hub's
``auth.docker.io``) are one storage option away. A realm refused is a ``store-error`` naming
the realm: the registry's answer is at fault, not the operator's configuration. Without
credentials a token is asked for anonymously from any acceptable realm: nothing secret is sent.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp

from ....clock import REAL_CLOCK, Clock
from ....trust.display import safe_text
from ....trust.errors import ConfigError, Reason, StoreError
from ...deadline import is_timeout, is_transient, one_line
from ..mirrors import mirror_reads
from ..registry_answers import (
    MAX_TOKEN_ANSWER_CAP,
    RegistryAnswer,
    close_on_loop,
    read_capped,
    tls_mistake,
)
from ..registry_urls import Registry, check_authority
from .credential_files import ANONYMOUS, Credentials

MAX_TOKEN = 16 * 1024
DEFAULT_TOKEN_LIFE = 60.0
_PARAM = re.compile(r'\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,"]+))\s*,?')


@dataclass(frozen=True)
class Challenge:
    scheme: str
    """``basic`` or ``bearer`` (lowercase)."""
    params: dict[str, str]


def parse_challenge(header: str | None) -> Challenge | None:
    """The first challenge of a ``WWW-Authenticate`` header, or None if it is not one."""
    if not header or len(header) > 4096:
        return None
    scheme, _, rest = header.strip().partition(" ")
    params: dict[str, str] = {}
    pos = 0
    while pos < len(rest):
        match = _PARAM.match(rest, pos)
        if match is None:
            break
        params[match.group(1).lower()] = (
            match.group(2).replace('\\"', '"') if match.group(2) is not None else match.group(3)
        )
        pos = match.end()
    if scheme.lower() not in ("basic", "bearer"):
        return None
    return Challenge(scheme.lower(), params)


def scope_for(repository: str, write: bool, delete: bool) -> str:
    actions = "pull" + (",push" if write else "") + (",delete" if delete else "")
    return f"repository:{repository}:{actions}"


@dataclass(frozen=True)
class MirrorOf:
    """A session to a mirror: what configured it and which store it serves."""

    configured_in: str
    """The file (or storage option) that configured it, named when it fails."""
    serving: str
    """The store it serves (the registry's ``HOST/REPOSITORY``), noted with each read for the
    output that names it (:func:`..mirrors.mirror_reads.note`)."""


@dataclass
class Token:
    value: str
    expires: float


def _token_from(answer: Any, realm_host: str, now: float) -> Token:
    value = None
    if isinstance(answer, dict):
        value = answer.get("token") or answer.get("access_token")
    if not (
        isinstance(value, str)
        and 0 < len(value) <= MAX_TOKEN
        and value.isascii()
        and value.isprintable()
    ):
        raise StoreError(f"the token service at {realm_host} answered no usable token")
    life = answer.get("expires_in") if isinstance(answer, dict) else None
    life = float(life) if isinstance(life, int) and 0 < life < 86400 else DEFAULT_TOKEN_LIFE
    return Token(value, now + max(life - 5.0, 1.0))


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
        mirror_of: MirrorOf | None = None,
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
        """For a mirror: what configured it and the store it serves; None for the registry."""
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
            token = await self._fetch_token(challenge, scope, creds)
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
                f"{safe_text(self.mirror_of.configured_in, 160)})"
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
            mirror_reads.note(
                self.registry.authority, self.mirror_of.configured_in, self.mirror_of.serving
            )
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

    # -- the token service ----------------------------------------------------------------------
    async def _fetch_token(
        self, challenge: Challenge, scope: str, credentials: Credentials
    ) -> Token:
        """A bearer token from the challenge's realm for ``scope``.

        Raises:
            StoreError: the realm is not acceptable, refuses, or answers no token.
        """
        realm = challenge.params.get("realm", "")
        parts = urlsplit(realm)
        shown = safe_text(realm, 80)
        if parts.scheme not in ("https", "http") or not parts.netloc or "@" in parts.netloc:
            raise StoreError(f"the registry named an unusable token realm {shown!r}")
        try:
            realm_host = check_authority(parts.netloc, "token realm")
        except ConfigError:  # the registry's answer, not the operator's configuration
            raise StoreError(f"the registry named an unusable token realm {shown!r}") from None
        plain = parts.scheme == "http"
        if plain and not (realm_host.loopback or self.plain_http_allowed):
            raise StoreError(
                f"the token realm {realm_host.authority} is plain HTTP: not used "
                "(storage option plain_http=true allows it)"
            )
        if credentials.identity_token or credentials.username:
            self._check_secret_realm(realm_host, plain, credentials)
        query = {"scope": challenge.params.get("scope") or scope}
        if "service" in challenge.params:
            query["service"] = challenge.params["service"]
        headers: dict[str, str] = {}
        if credentials.identity_token:
            form = {
                "grant_type": "refresh_token",
                "refresh_token": credentials.identity_token,
                "client_id": "plancache",
                **query,
            }
            answer = await self._token_answer("POST", realm, headers, form, realm_host.authority)
        else:
            if credentials.username:
                headers["Authorization"] = credentials.basic
            url = realm + ("&" if parts.query else "?") + urlencode(query)
            answer = await self._token_answer("GET", url, headers, None, realm_host.authority)
        try:
            parsed = json.loads(answer)
        except ValueError:
            parsed = None
        return _token_from(parsed, realm_host.authority, self.clock.monotonic())

    def _check_secret_realm(self, realm: Registry, plain: bool, credentials: Credentials) -> None:
        """Refuse to send ``credentials`` to ``realm`` unless it may have them (module docstring).

        Raises:
            StoreError: a plain-HTTP realm off loopback, or a realm on another host than the
                registry's and not in ``token_realms``, naming the realm and the credentials'
                source, never them.
        """
        source = safe_text(credentials.source, 120)
        if plain and not realm.loopback:
            raise StoreError(
                f"the token realm {realm.authority} is plain HTTP: the credentials from {source} "
                "are not sent over it"
            )
        if realm.hostname != self.registry.hostname and realm.hostname not in self.token_realms:
            raise StoreError(
                f"{self.registry.authority} sends its logins to the token realm "
                f"{realm.authority}, another host: the credentials from {source} are not sent "
                f"there (if it is the registry's own token service: token_realms={realm.hostname})"
            )

    async def _token_answer(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        form: dict[str, str] | None,
        host: str,
    ) -> bytes:
        """The token service's answer (capped) to one request, on this session; a status
        but 200 is a RegistryAnswer (retried as the registry's own are)."""
        response = await self.session().request(
            method, url, headers=headers, data=form, allow_redirects=False
        )
        async with response:
            if response.status != 200:
                raise RegistryAnswer(
                    response.status,
                    response.headers,
                    f"the token service at {host} answered {response.status}",
                )
            return await read_capped(response, MAX_TOKEN_ANSWER_CAP, f"the token from {host}")
