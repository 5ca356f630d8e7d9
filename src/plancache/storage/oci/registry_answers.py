"""What a registry answers, read safely: capped bodies, statuses as typed errors, digests.

Split from :mod:`.registry_http` (the requests) because every reader of an answer shares it:
the client's reads, the token service's answer (:mod:`.access.registry_session`), the subject's
image manifest (:meth:`.registry.RegistryBackend.subject_descriptor`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import ssl
from collections.abc import Mapping

import aiohttp

from ...trust.display import safe_text
from ...trust.errors import Reason, Rejected, StoreError
from ..caps.bodies import ERROR_BODY_CAP, check_declared

MAX_MANIFEST = 4 * 1024 * 1024
"""distribution's own limit on a manifest PUT; no plancache manifest comes near it."""


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def media_type_of(headers: Mapping[str, str]) -> str:
    return headers.get("Content-Type", "").split(";", 1)[0].strip().lower()


class RegistryAnswer(Exception):
    """A status the request did not want; ``status`` and ``headers`` for the shared retry rules
    (5xx, 408 and 429 are retried inside the deadline, ``Retry-After`` honoured)."""

    def __init__(self, status: int, headers: Mapping[str, str], detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.headers = headers


TLS_MISTAKES = (
    (
        "WRONG_VERSION_NUMBER",
        "speaks plain HTTP, not TLS (WRONG_VERSION_NUMBER): for a plain-HTTP registry give "
        "--storage-option plain_http=true",
    ),
    (
        "CERTIFICATE_VERIFY_FAILED",
        "has a certificate no trusted CA signs (CERTIFICATE_VERIFY_FAILED): give its CA with "
        "--storage-option ca_file=PATH (or SSL_CERT_FILE=PATH for every TLS connection)",
    ),
)
"""The two TLS failures an operator causes, by OpenSSL's reason, and the fix each names."""


def tls_mistake(authority: str, exc: BaseException) -> None:
    """Raise the one-line error naming the fix for a TLS failure an operator can correct;
    return for any other failure (the caller raises it as it was).

    aiohttp reports both as a connection error carrying OpenSSL's text (``[SSL:
    WRONG_VERSION_NUMBER] wrong version number``), which says nothing about which option to
    change; the rest of the message is kept.

    Only OpenSSL's own error counts (an :class:`ssl.SSLError`'s ``reason``), never the text of
    another failure: a plain-HTTP server's malformed answer carries whatever words it likes
    (``CERTIFICATE_VERIFY_FAILED`` in a status line would blame the operator's CA).

    Raises:
        StoreError: ``exc`` (or its cause) is one of :data:`TLS_MISTAKES`, named with its fix
            (reason ``store-error``).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            for code, fix in TLS_MISTAKES:
                if getattr(current, "reason", None) == code:
                    raise StoreError(f"{safe_text(authority, 120)} {fix}") from exc
        current = (
            current.__cause__
            or current.__context__
            or getattr(current, "certificate_error", None)
            or getattr(current, "os_error", None)
        )


TAGS_CAP = 8 * 1024 * 1024
MAX_TOKEN_ANSWER_CAP = 64 * 1024


async def read_capped(response: aiohttp.ClientResponse, cap: int, what: str) -> bytes:
    """At most ``cap`` bytes of a body, its declared length checked first.

    Raises:
        Rejected: the body is, or is declared, larger than ``cap`` (reason ``too-large``).
        StoreError: a body shorter than declared (transient; reason ``store-error``).
    """
    declared = response.content_length
    check_declared(what, cap, declared)
    data = bytearray()
    while len(data) <= cap:
        chunk = await response.content.read(min(1 << 16, cap + 1 - len(data)))
        if not chunk:
            break
        data += chunk
    if len(data) > cap:
        response.close()
        raise Rejected(Reason.TOO_LARGE, f"{what} in the registry is larger than {cap} bytes")
    if declared is not None and len(data) < declared:
        raise StoreError(
            f"{what}: truncated body ({len(data)} of {declared} bytes)", transient=True
        )
    return bytes(data)


async def expect(response: aiohttp.ClientResponse, wanted: tuple[int, ...], what: str) -> None:
    """Nothing if the status is one ``wanted``; else an error naming the registry's codes.

    Raises:
        StoreError: 401 or 403, access denied (reason ``store-error``).
        RegistryAnswer: any other unwanted status, with its headers for the retry rules.
    """
    if response.status in wanted:
        return
    codes = ""
    try:
        body = await read_capped(response, ERROR_BODY_CAP, "an error")
        errors = json.loads(body).get("errors")
        codes = ", ".join(
            safe_text(str(e.get("code")), 40) for e in errors[:3] if isinstance(e, dict)
        )
    except Exception:  # an error body is decoration: the status is the answer
        pass
    detail = f"{what}: the registry answered {response.status}" + (f" ({codes})" if codes else "")
    if response.status in (401, 403):
        raise StoreError(f"{detail}: access denied")
    raise RegistryAnswer(response.status, response.headers, detail)


CLOSE_WAIT = 2.0


def close_on_loop(loop: asyncio.AbstractEventLoop, session: aiohttp.ClientSession) -> None:
    """At collection or exit: close ``session`` on the loop it was made on (its connections are
    that loop's), waiting at most :data:`CLOSE_WAIT`. fsspec's loop runs until the process ends
    (a daemon thread, still running while ``atexit`` finalizers run); on that loop's own thread
    the close is scheduled, not waited for. A loop already gone has taken the sockets with it."""
    if session.closed or loop.is_closed() or not loop.is_running():
        return
    try:
        current = asyncio.get_running_loop()
    except RuntimeError:
        current = None
    if current is loop:
        loop.create_task(session.close())
        return
    done = asyncio.run_coroutine_threadsafe(session.close(), loop)
    try:
        done.result(CLOSE_WAIT)
    except Exception:  # closing is best effort: the process is letting the store go
        done.cancel()
