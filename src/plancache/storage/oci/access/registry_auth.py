"""Answering a registry's ``401``: the ``WWW-Authenticate`` challenge, basic or bearer token.

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

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

from ....trust.display import safe_text
from ....trust.errors import ConfigError, StoreError
from ..registry_answers import MAX_TOKEN_ANSWER_CAP, RegistryAnswer, read_capped
from ..registry_urls import Registry, check_authority
from .credential_files import Credentials

if TYPE_CHECKING:
    from .registry_session import RegistrySession

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


async def fetch_token(
    client: RegistrySession, challenge: Challenge, scope: str, credentials: Credentials
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
    if plain and not (realm_host.loopback or client.plain_http_allowed):
        raise StoreError(
            f"the token realm {realm_host.authority} is plain HTTP: not used "
            "(storage option plain_http=true allows it)"
        )
    if credentials.identity_token or credentials.username:
        check_secret_realm(client, realm_host, plain, credentials)
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
        answer = await _token_answer(client, "POST", realm, headers, form, realm_host.authority)
    else:
        if credentials.username:
            headers["Authorization"] = credentials.basic
        url = realm + ("&" if parts.query else "?") + urlencode(query)
        answer = await _token_answer(client, "GET", url, headers, None, realm_host.authority)
    try:
        parsed = json.loads(answer)
    except ValueError:
        parsed = None
    return _token_from(parsed, realm_host.authority, client.clock.monotonic())


def check_secret_realm(
    client: RegistrySession, realm: Registry, plain: bool, credentials: Credentials
) -> None:
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
    if realm.hostname != client.registry.hostname and realm.hostname not in client.token_realms:
        raise StoreError(
            f"{client.registry.authority} sends its logins to the token realm "
            f"{realm.authority}, another host: the credentials from {source} are not sent "
            f"there (if it is the registry's own token service: token_realms={realm.hostname})"
        )


async def _token_answer(
    client: RegistrySession,
    method: str,
    url: str,
    headers: dict[str, str],
    form: dict[str, str] | None,
    host: str,
) -> bytes:
    """The token service's answer (capped) to one request, on the client's session; a status
    but 200 is a RegistryAnswer (retried as the registry's own are)."""
    response = await client.session().request(
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
